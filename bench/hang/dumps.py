"""A folder of flight-recorder dumps, read and checked: one per rank, of one job.

torch names a dump ``<prefix><rank>`` (``TORCH_FR_DUMP_TEMP_FILE`` gives the prefix) and
writes a pickle of a dict with ``version``, ``pg_config`` (the groups: name, description,
member ranks), ``pg_status`` and ``entries`` (the collectives, oldest first);
``_dump_fr_trace_json`` writes the same as JSON. The suite's dumps add ``job`` (which job
wrote them) and a ``stacks_rank<N>.json`` beside each (``bench/runner/flight.py``). A dump is
a pickle, as torch's own analyser reads it: open only dumps of your own jobs.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

_RANK = re.compile(r"(\d+)$")
_STACKS = re.compile(r"stacks_rank(\d+)\.json$")


class DumpError(ValueError):
    """A folder that cannot be analysed, said in one line naming the file."""


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


def _read(path: Path) -> dict:
    data = path.read_bytes()
    try:
        rec = json.loads(data) if data[:1] == b"{" else pickle.loads(data)
    except Exception as e:  # noqa: BLE001  (any decoding failure: name the file, stop)
        raise DumpError(
            f"{path}: truncated or not a flight-recorder dump ({type(e).__name__})"
        ) from None
    if not isinstance(rec, dict) or "entries" not in rec:
        raise DumpError(f"{path}: not a flight-recorder dump (no entries)")
    return rec


def _members(text) -> list[int]:
    try:
        ranks = ast.literal_eval(text) if isinstance(text, str) else list(text)
        return [int(r) for r in ranks]
    except (ValueError, SyntaxError, TypeError):
        return []


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
                stacks[int(m.group(1))] = (path, json.loads(path.read_text()))
            except (OSError, ValueError) as e:
                raise DumpError(f"{path}: unreadable stacks file ({type(e).__name__})") from None
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
    groups = _groups(ranks)
    world = sorted(set(ranks) | {r for _, members in groups.values() for r in members})
    return Dumps(folder=folder, ranks=ranks, groups=groups, world=world)


def _check_one_job(folder: Path, ranks: dict[int, RankDump]) -> None:
    """Dumps of one job share its id (the suite's), the recorder's version, and the default
    group's members."""
    for key, label in (("job", "job"), ("version", "flight-recorder version")):
        seen: dict = {}
        for d in ranks.values():
            value = (
                d.record.get(key)
                if key != "job"
                else d.record.get("job") or (d.stacks or {}).get("job")
            )
            if value is None:
                continue
            seen.setdefault(str(value), d.path.name)
        if len(seen) > 1:
            (a, fa), (b, fb) = list(seen.items())[:2]
            raise DumpError(
                f"{folder}: dumps of different jobs mixed: {fa} ({label} {a}) and {fb} "
                f"({label} {b})"
            )
    defaults = {}
    for d in ranks.values():
        for cfg in d.record.get("pg_config", {}).values():
            if cfg.get("desc") == "default_pg" and _members(cfg.get("ranks")):
                defaults.setdefault(tuple(_members(cfg["ranks"])), d.path.name)
    if len(defaults) > 1:
        (a, fa), (b, fb) = list(defaults.items())[:2]
        raise DumpError(
            f"{folder}: dumps of different jobs mixed: {fa} (world {len(a)}) and {fb} "
            f"(world {len(b)})"
        )


def _groups(ranks: dict[int, RankDump]) -> dict[str, tuple[str, list[int]]]:
    """Each group's description and members, from the dumps' ``pg_config``; where a dump does
    not list them (gloo's own dumps), the ranks whose entries name the group, and every rank
    dumped for the default group."""
    out: dict[str, tuple[str, list[int]]] = {}
    for d in ranks.values():
        for name, cfg in d.record.get("pg_config", {}).items():
            members = _members(cfg.get("ranks", "[]"))
            if members and name not in out:
                out[name] = (cfg.get("desc", "undefined"), members)
    seen: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for d in ranks.values():
        for e in d.record["entries"]:
            name, desc = e["process_group"][0], e["process_group"][1]
            seen.setdefault(name, set()).add(d.rank)
            descs.setdefault(name, desc)
    for name, who in seen.items():
        if name not in out:
            members = sorted(ranks) if descs[name] == "default_pg" else sorted(who)
            out[name] = (descs[name], members)
    return out
