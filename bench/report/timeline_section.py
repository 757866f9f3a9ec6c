"""The report's step timelines: per model and implementation, the best point's and the default
point's step one above the other (why one is faster is in the picture), or every point's
(``--timelines all``); and the page of two points compared (``--diff A B``).

Everything is read from the run folder: the points' traces are in ``traces/<point>/``.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from bench.analysis.reader import TraceError
from bench.analysis.timeline import TimelineError, step_timeline
from bench.analysis.trace_diff import DIFF_COLUMNS, trace_diff
from bench.analysis.trace_folder import load_trace_dir
from bench.report.claims import fmt_value
from bench.report.critical_section import with_path
from bench.report.style import CSS, LOAD_CHECK
from bench.report.tables import html_table
from bench.report.timeline_figure import timeline_figure
from bench.report.trace_view import view_page
from bench.runfolder.atomic import write_text
from bench.runfolder.points import RunFolderError
from bench.runfolder.schema import Run

TIMELINES = ("best", "all", "none")  # --timelines: best and default per group, every point, none
CAPTION = (
    "One profiled step per rank, every panel on one time scale: computation (waiting for "
    "communication hatched, idle dotted) and each collective call with its bytes, under the "
    "step's phases; the red line over a rank's lanes is the step's critical path where it runs "
    "on that rank (docs/analysis.md)"
)


def point_traces(run: Run, point: str) -> list:
    """The traces of one point of the run; RunFolderError (one line) for an unknown point or
    a point without traces."""
    names = set(run.results["point"]) if "point" in run.results else set()
    if point not in names:
        raise RunFolderError(
            f"{run.path.name} has no point {point!r} (it has {', '.join(sorted(names)) or 'none'})"
        )
    folder = run.path / "traces" / point
    try:
        return load_trace_dir(folder).traces
    except TraceError as e:
        raise RunFolderError(f"point {point}: no traces to draw ({e})") from None


def point_timeline(run: Run, point: str, traces: list | None = None) -> pd.DataFrame:
    """The point's step timeline (from ``traces`` where the caller has read them already), its
    critical path among its bars (lane ``path``)."""
    traces = traces if traces is not None else point_traces(run, point)
    try:
        return with_path(step_timeline(traces), traces)
    except TimelineError as e:
        raise RunFolderError(f"point {point}: {e}") from None


def _row(ok: pd.DataFrame, model, impl, value, value2) -> str | None:
    sel = (ok["model"] == model) & (ok["impl"] == impl) & (ok["value"] == value)
    if value2 is not None and "value2" in ok:
        sel &= ok["value2"] == value2
    hit = ok.loc[sel, "point"]
    return str(hit.iloc[0]) if len(hit) else None


def _given(x) -> bool:
    """A value the table holds: neither None nor NaN."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _values(r) -> str:
    """A point's swept value, and its second knob's on a two-knob grid."""
    second = getattr(r, "value2", None)
    return fmt_value(r.value) + (f", {fmt_value(second)}" if _given(second) else "")


def _groups(ok: pd.DataFrame, found: pd.DataFrame, which: str) -> list[tuple[str, list]]:
    """(figure title, [(panel title, point)]) per group."""
    out = []
    if which == "all":
        for (model, impl), g in ok.groupby(["model", "impl"], sort=False):
            out.append(
                (f"{model}, {impl}: every point", [(_values(r), r.point) for r in g.itertuples()])
            )
        return out
    for v in found.itertuples():
        second = f", {fmt_value(v.value2)}" if v.value2 is not None else ""
        label = f"{v.model}, {v.impl}{second}"
        best = _row(ok, v.model, v.impl, v.best, v.value2)
        panels = [(f"best: {fmt_value(v.best)}", best)] if best else []
        has_default = _given(v.default)
        if has_default and not v.default_is_best:
            default = _row(ok, v.model, v.impl, v.default, v.value2)
            if default:
                panels.append((f"default: {fmt_value(v.default)}", default))
        elif has_default:
            panels = [(f"best and default: {fmt_value(v.best)}", best)] if best else []
        if panels:
            out.append((label, panels))
    return out


def timeline_sections(run: Run, ok: pd.DataFrame, found: pd.DataFrame, which: str) -> list[str]:
    """The report's "Step timelines" section; a note, not a failure, for a point that cannot
    be drawn (no traces, no profiler step)."""
    if which == "none" or ok.empty:
        return []
    parts = ["<h2>Step timelines</h2>"]
    for title, panels in _groups(ok, found, which):
        drawn, notes = [], []
        for label, point in panels:
            try:
                drawn.append((f"{label} ({point})", point_timeline(run, point)))
            except RunFolderError as e:
                notes.append(str(e))
            except Exception as e:  # noqa: BLE001  (a trace we misread costs a figure, not the report)
                notes.append(f"point {point}: no timeline ({type(e).__name__}: {e})")
        if drawn:
            parts.append(timeline_figure(drawn, f"{title}. {CAPTION}."))
        parts += [
            f"<p>{html.escape(label)}. {html.escape(tl.attrs['critical_path'])}</p>"
            for label, tl in drawn
            if "critical_path" in tl.attrs
        ]
        parts += [f"<p class='note'>{html.escape(n)}</p>" for n in notes]
    return parts if len(parts) > 1 else []


def diff_page(run: Run, a: str, b: str) -> str:
    """The two points' timelines one above the other, and what changed between them."""
    traces_a, traces_b = point_traces(run, a), point_traces(run, b)  # each read once
    ta, tb = point_timeline(run, a, traces_a), point_timeline(run, b, traces_b)
    table = trace_diff(traces_a, traces_b)
    shown = table.assign(name=table["name"].str.slice(0, 90))
    title = f"{html.escape(a)} against {html.escape(b)}"
    return "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{title}</title><style>{CSS}</style></head><body><main>",
            f"<h1>Two points of {html.escape(run.path.name)}</h1><p>A = <code>{html.escape(a)}"
            f"</code>, B = <code>{html.escape(b)}</code>.</p>",
            "<h2>Step timelines</h2>",
            timeline_figure([(f"A: {a}", ta), (f"B: {b}", tb)], f"A above B. {CAPTION}."),
            "<h2>What changed</h2>",
            html_table(
                shown,
                DIFF_COLUMNS,
                "Per rank and profiled step, averaged over the ranks "
                "and steps: calls (count), time (ms) and bytes of each collective, and of each "
                "operator the step called directly (GPU traces: each kernel), in A and B, and "
                "B - A; collectives first, then by the size of the time's change",
            ),
            f"</main>{LOAD_CHECK}</body></html>",
        ]
    )


def write_diff(run: Run, a: str, b: str, reports_dir: Path) -> Path:
    reports_dir.mkdir(parents=True, exist_ok=True)
    out = reports_dir / f"{run.path.name}-diff.html"
    write_text(out, diff_page(run, a, b))
    return out


def write_view(run: Run, point: str, reports_dir: Path) -> Path:
    """The point's traces as an interactive, offline timeline (``trace_view``)."""
    traces = point_traces(run, point)
    reports_dir.mkdir(parents=True, exist_ok=True)
    out = reports_dir / f"{run.path.name}-{point}-trace.html"
    write_text(out, view_page(traces, f"{point} ({run.path.name})"))
    return out
