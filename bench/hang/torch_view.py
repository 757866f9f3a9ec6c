"""What torch's own flight-recorder analyser (``torch.distributed.flight_recorder``) finds in
the same dumps: its first collective that fails its checks. ``bench.hang`` shows it next to its
own line (``--torch``) and the tests check that the two name the same call. Dumps it cannot
read (gloo's own, whose ``pg_config`` lists no group its entries name; point-to-point calls it
cannot pair) make it raise: that is one line, ``summary``'s. It is handed the records the loader
checked (``bench.hang.dumps``), never the files, and each group's ranks as text made here from
their list of integers: torch's analyser evaluates that text."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
from dataclasses import dataclass

from bench.hang.dumps import DumpError, Dumps, ranks_of


@dataclass(frozen=True)
class TorchFinding:
    group: str  # the group's name, as the dumps give it
    seq: int
    name: str
    missing_ranks: tuple[int, ...]
    mismatch: str  # torch's MatchState, or ""

    def __str__(self) -> str:
        missing = f", missing ranks {list(self.missing_ranks)}" if self.missing_ranks else ""
        kind = f", {self.mismatch}" if self.mismatch else ""
        return f"{self.name} #{self.seq} of group {self.group} fails its checks{kind}{missing}"


def _groups_for_torch(name: str, pg_config: dict) -> dict[str, dict]:
    """The dump's groups as torch's analyser reads them: name, description, and ranks as the text
    torch's own dumps hold (``"[0, 1]"``), written here from the list of integers the loader
    checked, so that what torch evaluates is that list and nothing else."""
    out = {}
    for group, cfg in pg_config.items():
        out[group] = {k: cfg[k] for k in ("name", "desc") if k in cfg}
        if "ranks" in cfg:
            ranks = ranks_of(cfg["ranks"])
            if ranks is None:  # a Dumps the loader did not make
                raise DumpError(
                    f"{name}: pg_config group {group!r}: ranks is not a list of integers"
                )
            out[group]["ranks"] = str(ranks)
    return out


def first_problem(d: Dumps) -> TorchFinding | None:
    """torch's first collective with ``pass_check`` false, or None (all matched)."""
    details = {
        dump.path.name: {
            "host_name": f"host_rank{rank}",
            "rank": rank,
            "entries": copy.deepcopy(dump.record["entries"]),
            "version": dump.record.get("version", "2.0"),
            "pg_config": _groups_for_torch(dump.path.name, dump.record.get("pg_config") or {}),
        }
        for rank, dump in d.ranks.items()
    }
    version = str(next(iter(details.values()))["version"])
    args = argparse.Namespace(
        verbose=False,
        just_print_entries=False,
        allow_incomplete_ranks=True,
        mismatch_cap=10,
        selected_ranks=None,
        pg_filters=None,
        print_stack_trace=False,
    )
    log = logging.getLogger("Flight Recorder")
    level, log.level = log.level, logging.CRITICAL  # its own report goes to the console
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from torch.distributed.flight_recorder.components.builder import build_db

            db = build_db(details, args, version)
    finally:
        log.level = level
    for coll in db.collectives:
        if not coll.pass_check:
            state = coll.type_of_mismatch
            return TorchFinding(
                group=str(coll.group_id),
                seq=int(coll.collective_seq_id),
                name=str(coll.collective_name).split(":")[-1],
                missing_ranks=tuple(sorted(coll.missing_ranks or ())),
                mismatch=state._state.name if state is not None else "",
            )
    return None


def summary(d: Dumps) -> str:
    """``first_problem`` as the line ``--torch`` prints; an error of torch's analyser (any: it
    is not ours to fix, and the suite's own diagnosis stands without it) is that line."""
    try:
        found = first_problem(d)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (its failure is what the line says)
        text = str(e).strip().splitlines()
        msg = f": {text[0][:200]}" if text else ""
        return f"torch's analyser could not read these dumps: {type(e).__name__}{msg}"
    return f"torch's analyser: {found or 'no collective fails its checks'}"
