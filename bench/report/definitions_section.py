"""The report's section of HolisticTraceAnalysis's own figures (``--definitions hta``): each
point's ranks as HTA's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` figure them
(its last step left out, one window from the first kernel to the last), for a user who holds
the suite against HTA or moves from it. The points' tables elsewhere total every traced step
(docs/analysis.md says why); this section is read from the run folder's traces."""

from __future__ import annotations

import html

import pandas as pd

from bench.analysis.reader import TraceError
from bench.analysis.trace_folder import DEFINITIONS, analyse, load_trace_dir
from bench.report.tables import html_table
from bench.runfolder.schema import Run

COLUMNS = [
    "point",
    "rank",
    "steps",
    "kernel_time_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_comp_overlap_pct",
    "gpu_util_pct",
]
CAPTION = (
    "Per point and rank, HolisticTraceAnalysis's temporal breakdown and communication-"
    "computation overlap, exactly as it computes them (its last step left out)"
)


def hta_ranks(run: Run) -> tuple[pd.DataFrame, list[str]]:
    """Every ok point's ranks under HTA's definitions, and what could not be figured."""
    ok = run.results[run.results["status"] == "ok"] if len(run.results) else run.results
    frames, notes = [], []
    for point in ok.get("point", pd.Series(dtype=str)).dropna().unique():
        folder = run.path / "traces" / str(point)
        try:
            ts = load_trace_dir(folder, digest_each=True, definitions="hta")
        except TraceError as e:
            notes.append(f"{point}: {e}")
            continue
        ranks = analyse(ts)["ranks"]
        frames.append(ranks.assign(point=point))
        notes += [f"{point}: {p}" for p in ts.problems if p.startswith("--definitions hta")]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return table, notes


def definitions_sections(run: Run, definitions: str) -> list[str]:
    """The section for ``definitions`` other than the suite's own (none for "suite")."""
    if definitions == "suite":
        return []
    if definitions not in DEFINITIONS:
        raise ValueError(f"unknown definitions {definitions!r} (known: {', '.join(DEFINITIONS)})")
    table, notes = hta_ranks(run)
    gpu = table[table["steps"].fillna(0) > 0] if len(table) else table
    parts = ["<h2>HolisticTraceAnalysis's figures</h2>"]
    if len(gpu):
        parts.append(html_table(gpu, COLUMNS, CAPTION))
    else:
        parts.append(
            "<p>No point has figures under HTA's definitions: HTA figures GPU kernels "
            "only, and these traces have none.</p>"
        )
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    return parts
