"""A folder of flight-recorder dumps, read and checked: one per rank, of one job.

torch names a dump ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE`` gives the prefix) and
writes a pickle of a dict with ``version``, ``pg_config`` (the groups: name, description,
member ranks), ``pg_status`` and ``entries`` (the collectives, oldest first);
``_dump_fr_trace_json`` writes the same as JSON, less the stacks. The suite's dumps add
``job`` (which job wrote them) and a ``stacks_rank<N>.json`` beside each
(``bench/runner/faults/flight.py``). A pickle can name any function for the reader to call; torch's
dumps name none (dicts, lists, tuples, strings, numbers; at most the list builders of its
TorchScript pickler, read here as lists), so one that names anything else is refused unread: a
crafted dump runs nothing here (``--torch`` hands torch's analyser the records read here, not
the files). Plain data can still carry code: torch's analyser evaluates a group's ``ranks`` text
that is no literal (``eval``), so every field it or this package reads is checked here to be
the data it must be (a group's ranks a list of integers, names strings, sizes lists of
integers...) and a dump with any other is refused, naming the file and the field.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

_RANK = re.compile(r"(\d+)$")
_STACKS = re.compile(r"stacks_rank(\d+)\.json$")


class DumpError(ValueError):
    """A folder that cannot be analysed; the message is one line naming the file."""


@dataclass
class RankDump:
    rank: int
    path: Path
    record: dict
    stacks: dict | None = None


@dataclass
class Dumps:
    folder: Path
    ranks: dict[int, RankDump]
    groups: dict[str, tuple[str, list[int]]]  # name -> (description, member ranks)
    world: list[int] = field(default_factory=list)  # every rank of the job, as far as known

    @property
    def missing(self) -> list[int]:
        return [r for r in self.world if r not in self.ranks]


class _Refused(Exception):
    def __init__(self, module: str, name: str) -> None:
        self.what = f"{module}.{name}"


def _as_list(data) -> list:
    return list(data)


# What torch's TorchScript pickler may name: its typed lists are rebuilt by these functions of
# ``torch.jit._pickle``, each returning its argument, a list of numbers (the recorder's dumps
# use untyped lists today: they name nothing). Read as plain lists, torch not imported.
_ADMITTED = {
    ("torch.jit._pickle", f"build_{kind}list"): _as_list for kind in ("int", "double", "bool")
}


class _DumpUnpickler(pickle.Unpickler):
    """Containers and scalars only: any other global a pickle names (a function it would call,
    a class it would build) is refused before anything runs."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ADMITTED:
            return _ADMITTED[(module, name)]
        raise _Refused(module, name)


def _unpickle(data: bytes):
    return _DumpUnpickler(io.BytesIO(data)).load()


def _read(path: Path) -> dict:
    data = path.read_bytes()
    try:
        rec = json.loads(data) if data.lstrip()[:1] == b"{" else _unpickle(data)
    except _Refused as e:
        raise DumpError(
            f"{path}: refused: the pickle asks for {e.what}, which a flight-recorder dump never "
            "holds (it could run code)"
        ) from None
    except Exception as e:  # noqa: BLE001  (any decoding failure: name the file, stop)
        raise DumpError(
            f"{path}: truncated or not a flight-recorder dump ({type(e).__name__})"
        ) from None
    if not isinstance(rec, dict) or not isinstance(rec.get("entries"), list):
        raise DumpError(f"{path}: not a flight-recorder dump (no entries)")
    for i, e in enumerate(rec["entries"]):
        if problem := _bad_entry(e):
            raise DumpError(f"{path}: entry {i} is not a flight-recorder entry ({problem})")
    if not isinstance(rec.get("pg_config") or {}, dict):
        raise DumpError(f"{path}: not a flight-recorder dump (pg_config is no table)")
    if "version" in rec and not isinstance(rec["version"], str):
        raise DumpError(f"{path}: not a flight-recorder dump (version is not a string)")
    _check_groups(path, rec.get("pg_config") or {})
    return rec


def seq_id(entry: dict):
    """The entry's number in its group: ``collective_seq_id`` in the recorder's format 2.x,
    ``seq_id`` in format 1.x (older torch, whose entries have no ``is_p2p``, no dtypes)."""
    return entry.get("collective_seq_id", entry.get("seq_id"))


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_or_none(v) -> bool:
    return v is None or _int(v)


def _str(v) -> bool:
    return isinstance(v, str)


def _bool(v) -> bool:
    return isinstance(v, bool)


def _ints(v) -> bool:
    return isinstance(v, list | tuple) and all(map(_int, v))


def _strs(v) -> bool:
    return isinstance(v, list | tuple) and all(map(_str, v))


def _shapes(v) -> bool:
    return isinstance(v, list | tuple) and all(map(_ints, v))


def _frames(v) -> bool:
    """Frames as torch records them (``name``, ``filename``, ``line``; the suite's stacks say
    ``file``)."""
    return isinstance(v, list | tuple) and all(
        isinstance(f, dict)
        and all(_str(f[k]) for k in ("name", "filename", "file") if k in f)
        and _int(f.get("line", 0))
        for f in v
    )


# The fields of an entry that torch's analyser or this package reads, and what each must be
# where the entry has it (older formats lack some): data of these types only, so that nothing
# downstream meets a value it would parse, evaluate or choke on.
_ENTRY_FIELDS = {
    **dict.fromkeys(
        ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "seq_id", "op_id", "stack_id"),
        (_int, "an integer"),
    ),
    **dict.fromkeys(
        ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"),
        (_int_or_none, "an integer or null"),
    ),
    **dict.fromkeys(("profiling_name", "state"), (_str, "a string")),
    **dict.fromkeys(("is_p2p", "retired"), (_bool, "true or false")),
    **dict.fromkeys(
        ("input_sizes", "output_sizes"), (_shapes, "a list of shapes (lists of integers)")
    ),
    **dict.fromkeys(("input_dtypes", "output_dtypes"), (_strs, "a list of strings")),
    "frames": (_frames, "a list of frames (name, filename: strings; line: an integer)"),
}


def _bad_entry(e) -> str | None:
    """What keeps an entry from being read, or None."""
    if not isinstance(e, dict):
        return "not a table"
    pg = e.get("process_group")
    if not isinstance(pg, list | tuple) or len(pg) != 2:
        return "no process_group (name, description)"
    if not _strs(pg):
        return "process_group is not a (name, description) pair of strings"
    if seq_id(e) is None:
        return "no sequence number: neither collective_seq_id nor seq_id"
    for key, (ok, what) in _ENTRY_FIELDS.items():
        if key in e and not ok(e[key]):
            return f"{key} is not {what}"
    return None


_NO_LITERAL = object()


def _literal(text: str):
    """The value ``text`` spells as JSON or as a Python literal (read, never evaluated), or
    ``_NO_LITERAL``."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO_LITERAL


def ranks_of(value) -> list[int] | None:
    """A group's member ranks, from a list of integers or from its text as torch's dumps write it
    (``"[0, 1]"``, a literal); None for anything else."""
    if isinstance(value, str):
        value = _literal(value)
    return [int(r) for r in value] if _ints(value) else None


def _runs_in_torch(value) -> bool:
    """Whether torch's analyser would evaluate ``ranks`` as code: text that is no literal
    (``eval`` where it transforms groups) or a literal string (``eval`` of what
    ``ast.literal_eval`` gave, where it builds groups)."""
    if not isinstance(value, str):
        return False
    parsed = _literal(value)
    return parsed is _NO_LITERAL or isinstance(parsed, str)


def _shown(value, width: int = 48) -> str:
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _check_groups(path: Path, pg_config: dict) -> None:
    """Each group of ``pg_config`` a table whose name and description are strings and whose
    ``ranks`` are a list of integers or its literal text, rewritten as that list; any other is
    refused here, before anything reads it (torch's analyser evaluates some as code)."""
    for name, cfg in pg_config.items():
        where = f"pg_config group {_shown(name)}"
        if not isinstance(name, str):
            raise DumpError(f"{path}: not a flight-recorder dump ({where}: its name is no string)")
        if not isinstance(cfg, dict):
            raise DumpError(f"{path}: not a flight-recorder dump ({where} is no table)")
        for key in ("name", "desc"):
            if key in cfg and not isinstance(cfg[key], str):
                raise DumpError(f"{path}: not a flight-recorder dump ({where}: {key} is no string)")
        if "ranks" not in cfg:
            continue
        ranks = ranks_of(cfg["ranks"])
        if ranks is None and _runs_in_torch(cfg["ranks"]):
            raise DumpError(
                f"{path}: refused: {where}: ranks is {_shown(cfg['ranks'])}, not a list of "
                "integers (torch's analyser would run it as code)"
            )
        if ranks is None:
            raise DumpError(
                f"{path}: not a flight-recorder dump ({where}: ranks is not a list of integers)"
            )
        cfg["ranks"] = ranks


def load(folder: Path) -> Dumps:
    """Every rank's dump in ``folder`` (not its subfolders), checked to be of one job."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DumpError(f"{folder}: no such folder")
    ranks: dict[int, RankDump] = {}
    stacks: dict[int, tuple[Path, dict]] = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        if m := _STACKS.search(path.name):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise DumpError(f"{path}: unreadable stacks file ({type(e).__name__})") from None
            if not isinstance(doc, dict):
                raise DumpError(f"{path}: unreadable stacks file (not a table)")
            stacks[int(m.group(1))] = (path, doc)
            continue
        m = _RANK.search(path.name)
        if not m:
            continue
        rank = int(m.group(1))
        if rank in ranks:
            raise DumpError(
                f"{folder}: two dumps of rank {rank} ({ranks[rank].path.name}, {path.name}): "
                "dumps of different jobs mixed"
            )
        ranks[rank] = RankDump(rank, path, _read(path))
    if not ranks:
        raise DumpError(
            f"{folder}: no flight-recorder dumps (files named <prefix><rank>, as "
            "TORCH_FR_DUMP_TEMP_FILE or the suite's hangs/<point>/ holds them)"
        )
    for rank, (_, doc) in stacks.items():
        if rank in ranks:
            ranks[rank].stacks = doc
    _check_one_job(folder, ranks)
    # every rank any dump lists (torch's gloo dumps list the world under a nameless group)
    world = sorted(
        set(ranks)
        | {
            r
            for d in ranks.values()
            for cfg in _pg_config(d).values()
            for r in cfg.get("ranks", [])
        }
    )
    groups = _groups(ranks, world)
    return Dumps(folder=folder, ranks=ranks, groups=groups, world=world)


def _pg_config(d: RankDump) -> dict[str, dict]:
    """The dump's groups, as ``_read`` checked them: name -> name, description, ranks (a list of
    integers)."""
    return d.record.get("pg_config") or {}


def _check_one_job(folder: Path, ranks: dict[int, RankDump]) -> None:
    """Dumps of one job share its id (the suite's), the recorder's version, and the default
    group's members."""
    for key, label in (("job", "job"), ("version", "flight-recorder version")):
        first_file: dict = {}  # each value of ``key`` -> the first dump that holds it
        for d in ranks.values():
            value = (
                d.record.get(key)
                if key != "job"
                else d.record.get("job") or (d.stacks or {}).get("job")
            )
            if value is None:
                continue
            first_file.setdefault(str(value), d.path.name)
        if len(first_file) > 1:
            (a, fa), (b, fb) = list(first_file.items())[:2]
            raise DumpError(
                f"{folder}: dumps of different jobs mixed: {fa} ({label} {a}) and {fb} "
                f"({label} {b})"
            )
    defaults = {}
    for d in ranks.values():
        for cfg in _pg_config(d).values():
            if cfg.get("desc") == "default_pg" and cfg.get("ranks"):
                defaults.setdefault(tuple(cfg["ranks"]), d.path.name)
    if len(defaults) > 1:
        (a, fa), (b, fb) = list(defaults.items())[:2]
        raise DumpError(
            f"{folder}: dumps of different jobs mixed: {fa} (world {len(a)}) and {fb} "
            f"(world {len(b)})"
        )


def _groups(ranks: dict[int, RankDump], world: list[int]) -> dict[str, tuple[str, list[int]]]:
    """Each group's description and members, from the dumps' ``pg_config``; where a dump does
    not list them (gloo's own dumps), the ranks whose entries name the group, and, for the
    default group, every rank of the job as far as known (a rank that left no dump among them:
    it is the one the others wait for)."""
    out: dict[str, tuple[str, list[int]]] = {}
    for d in ranks.values():
        for name, cfg in _pg_config(d).items():
            members = cfg.get("ranks", [])
            if members and name not in out:
                out[name] = (str(cfg.get("desc", "undefined")), members)
    named_by: dict[str, set[int]] = {}  # group -> the ranks whose entries name it
    descs: dict[str, str] = {}
    for d in ranks.values():
        for e in d.record["entries"]:
            name, desc = str(e["process_group"][0]), str(e["process_group"][1])
            named_by.setdefault(name, set()).add(d.rank)
            descs.setdefault(name, desc)
    for name, who in named_by.items():
        if name not in out:
            members = list(world) if descs[name] == "default_pg" else sorted(who)
            out[name] = (descs[name], members)
    return out
