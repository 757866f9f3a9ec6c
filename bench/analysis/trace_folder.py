"""A folder of per-rank traces: which files make one run, and the folder-level tables.

Each trace is reduced to its tables (``digest``) as soon as it is read when asked to, so the
memory of a folder's analysis is bounded by its largest file, not by the folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.analysis.breakdown import (
    RANK_COLUMNS,
    Trace,
    breakdown,
    hta_summary,
    load_trace,
    rank_summary,
)
from bench.analysis.collective_calls import (
    collective_calls,
    collective_summary,
    stragglers,
    wait_split,
)
from bench.analysis.pipeline_bubble import pipeline_bubble
from bench.analysis.reader import TraceError

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")
# How the ranks table is figured (``--definitions``). suite: every traced step totalled, the
# same rule on CPU and GPU. hta: exactly HolisticTraceAnalysis's get_temporal_breakdown and
# get_comm_comp_overlap (the last step left out, one window from the first kernel to the last,
# its rounding; GPU traces only). docs/analysis.md says why the default differs.
DEFINITIONS = {"suite": rank_summary, "hta": lambda trace, _steps: hta_summary(trace)}


def trace_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


@dataclass
class TraceDigest:
    """What the folder-level tables need of one trace, without its events."""

    path: Path
    rank: int
    world_size: int
    backend: str | None
    n_events: int
    steps: pd.DataFrame
    summary: dict
    calls: pd.DataFrame
    pipeline: pd.DataFrame  # its stage's bubble per step: empty where it does not pipeline


def digest(trace: Trace, definitions: str = "suite") -> TraceDigest:
    steps = breakdown(trace)
    return TraceDigest(
        path=trace.path,
        rank=trace.rank,
        world_size=trace.world_size,
        backend=trace.backend,
        n_events=len(trace.events),
        steps=steps,
        summary=DEFINITIONS[definitions](trace, steps),
        calls=collective_calls(trace),
        pipeline=pipeline_bubble(trace),
    )


@dataclass
class TraceSet:
    traces: list  # Trace, or TraceDigest when loaded with digest_each=True
    problems: list[str]


def load_trace_dir(
    folder: str | Path,
    *,
    digest_each: bool = False,
    definitions: str = "suite",
    reduce: Callable[[Trace], object] | None = None,
) -> TraceSet:
    """Every readable trace of a folder, one per rank, with what was wrong with the rest.

    Unreadable files are reported and skipped; traces of another run (different world size or
    backend from the majority) are set aside; of two traces for one rank the newer is kept;
    ranks missing from the world size are named. Raises TraceError only if nothing is usable.
    With ``digest_each`` every trace is reduced to its tables as soon as it is read, so memory
    is bounded by the largest file, not by the folder. ``definitions`` (``DEFINITIONS``) says
    how the digests' ranks rows are figured; ``reduce`` replaces the digest by another
    reduction (the critical path's lanes, ``critical_graph.rank_graphs``).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder}: not a folder")
    files = trace_files(folder)
    if not files:
        raise TraceError(f"{folder}: no trace files (*.pt.trace.json, *.json.gz) in it")
    traces, problems = [], []
    for f in files:
        try:
            t = load_trace(f)
        except TraceError as e:
            problems.append(f"skipped {e}")
            continue
        traces.append(reduce(t) if reduce else digest(t, definitions) if digest_each else t)
    traces = _one_run_one_trace_per_rank(traces, problems)
    if not traces:
        raise TraceError(f"{folder}: no readable trace: " + "; ".join(problems))
    cpu = [t.rank for t in traces if not _is_gpu(t)]
    if definitions == "hta" and cpu:
        problems.append(
            f"--definitions hta: HolisticTraceAnalysis figures GPU kernels only; the CPU traces "
            f"of ranks {', '.join(map(str, cpu))} have no figures under its definitions"
        )
    return TraceSet(traces=traces, problems=problems)


def _is_gpu(t) -> bool:
    return t.summary.get("device") == "gpu" if isinstance(t, TraceDigest) else t.is_gpu


def _one_run_one_trace_per_rank(traces: list, problems: list[str]) -> list:
    if not traces:
        return traces
    key = lambda t: (t.world_size, t.backend)  # noqa: E731
    keys = [key(t) for t in traces]
    majority = max(set(keys), key=keys.count)
    for t in [t for t in traces if key(t) != majority]:
        problems.append(
            f"skipped {t.path}: from another run (world size {t.world_size}, "
            f"backend {t.backend}; the others: {majority})"
        )
    by_rank: dict = {}
    for t in sorted(
        [t for t in traces if key(t) == majority], key=lambda t: t.path.stat().st_mtime
    ):
        if t.rank in by_rank:
            problems.append(
                f"skipped {by_rank[t.rank].path}: rank {t.rank} has a newer trace, {t.path.name}"
            )
        by_rank[t.rank] = t
    kept = [by_rank[r] for r in sorted(by_rank)]
    missing = sorted(set(range(kept[0].world_size)) - set(by_rank))
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        problems.append(
            f"{len(missing)} of {kept[0].world_size} ranks have no trace here "
            f"({shown}): cross-rank figures cover the ranks present"
        )
    return kept


def analyse(ts: TraceSet, definitions: str = "suite") -> dict[str, pd.DataFrame]:
    """All tables for a set of per-rank traces: ranks, steps, collectives, waits, stragglers
    (the ranks table by ``definitions``, where the traces are not digested yet), and, for a
    pipeline's traces, each stage's bubble per step (``pipeline``)."""
    digests = [t if isinstance(t, TraceDigest) else digest(t, definitions) for t in ts.traces]
    steps = pd.concat([d.steps for d in digests], ignore_index=True)
    ranks = pd.DataFrame([d.summary for d in digests], columns=RANK_COLUMNS)
    calls = wait_split(pd.concat([d.calls for d in digests], ignore_index=True))
    tables = {
        "ranks": ranks,
        "steps": steps,
        "collectives": collective_summary(calls, digests[0].world_size),
        "stragglers": stragglers(steps, calls),
    }
    stages = [d.pipeline for d in digests if len(d.pipeline)]
    if stages:
        tables["pipeline"] = pd.concat(stages, ignore_index=True)
    return tables
