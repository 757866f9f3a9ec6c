"""Results -> one self-contained HTML report: figures embedded, no network needed to view it.

``python -m bench.report results/<run> [--baseline results/<old>]`` writes
``reports/<run>.html``; every sweep also calls ``write_report`` when it finishes. This layer only
reads the run folder (meta.json, results.csv, samples.csv); figures are in ``report_figures``.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from bench.analysis.scaling import scaling_efficiency
from bench.report import charts as figs
from bench.report import claims
from bench.report.answers import (
    ANSWERS_TABLE,
    answers_then_and_now,
    best_and_tied,
    headline,
    swept_axes,
    training_claims,
)
from bench.report.collective_figures import busbw_figure
from bench.report.compare import TIED, compare
from bench.report.critical_section import with_path_shares
from bench.report.definitions_section import definitions_sections
from bench.report.mfu import mfu_note
from bench.report.model_section import model_sections
from bench.report.replay_section import replay_sections
from bench.report.style import CSS, LOAD_CHECK
from bench.report.tables import html_table
from bench.report.timeline_section import timeline_sections
from bench.report.waterfall_section import waterfall_sections
from bench.runfolder import columns
from bench.runfolder.atomic import write_text
from bench.runfolder.folder import ours_and_native
from bench.runfolder.placement import cost_rows
from bench.runfolder.schema import Run, RunFolderError, read_run, read_verdicts

TRAINING_TABLE = columns.report_columns(columns.TRAINING)
# the critical path's communication share, from the traces (bench/report/critical_section.py)
TRAINING_TABLE.insert(TRAINING_TABLE.index("exposed_comm_ms") + 1, "path_comm_pct")
COLLECTIVE_TABLE = columns.report_columns(columns.COLLECTIVE)
COMPARE_TABLE = [
    "point",
    "old_ms",
    "new_ms",
    "ratio",
    "low",
    "high",
    "p_value",
    "verdict",
    "rounds_old",
    "rounds_new",
]


def _busbw_interval(row: pd.Series) -> str:
    lo, hi = row.get("busbw_GBps_ci_low"), row.get("busbw_GBps_ci_high")
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return ""
    return f" [{lo:.2f}, {hi:.2f}]"


def _collective_headline(ok: pd.DataFrame, limits: dict, impl_native: dict) -> str:
    """Best busbw per collective and implementation, and ours over PyTorch's (the run's
    ``impl_native`` says which is which)."""
    lines = []
    for coll, g in ok.groupby("collective", sort=False):
        at = g.loc[g.groupby("impl")["busbw_GBps"].idxmax()].set_index("impl")
        best = at["busbw_GBps"]
        text = f"<b>{coll}</b>: best busbw " + ", ".join(
            f"{impl} {r['busbw_GBps']:.2f} GB/s{_busbw_interval(r)}" for impl, r in at.iterrows()
        )
        ours, theirs = ours_and_native(list(best.index), impl_native)
        if ours and theirs and best[theirs] > 0:  # busbw is 0 at one rank: no ratio
            text += f" ({ours}/{theirs} {best[ours] / best[theirs]:.2f})"
        lines.append(text)
    p2p = limits.get("p2p_GBps")
    if p2p:
        lines.append(
            f"point-to-point {p2p:.2f} GB/s one way, "
            f"{limits.get('p2p_bidir_GBps', float('nan')):.2f} GB/s per direction both "
            f"ways; memory copy {limits.get('memcpy_GBps', float('nan')):.2f} GB/s"
        )
    return "<br>".join(lines)


def _training_sections(run: Run, timelines: str) -> list[str]:
    meta, points = run.meta, run.points
    sweep = meta.get("sweep", "?")
    df, found = training_claims(run)
    df = with_path_shares(run, scaling_efficiency(df))
    scaling = df["efficiency_pct"].notna().any()
    if "window_ms" in df:
        df["compute_share_pct"] = 100 * df["compute_ms"] / df["window_ms"]
    ok = df[df["status"] == "ok"]
    head = headline(run, df, found) if len(df) else "no results"
    parts = [f"<p class='headline'>{head}</p>"]
    if len(ok):
        parts += (
            ["<h2>Scaling</h2>", figs.scaling_figure(ok)]
            if scaling
            else ["<h2>Step time</h2>", figs.step_time_figure(ok, sweep, swept_axes(points)[1])]
        )
        parts += ["<h2>Where the step goes</h2>", figs.breakdown_figure(ok)]
        parts += waterfall_sections(ok)  # where MFU goes, beside where the step goes
        if (
            "state_mb_expected" in ok
            and ok["state_mb_expected"].notna().any()
            and not (figs.is_numeric(ok["value"]))
        ):
            parts += ["<h2>Memory</h2>", figs.memory_figure(ok)]
        if meta.get("tradeoff") and "loss" in ok:
            parts += ["<h2>Trade-offs</h2>", figs.tradeoff_figure(ok, sweep)]
        if "comm_bytes_expected" in ok and ok["comm_bytes_expected"].nunique() > 1:
            parts += ["<h2>Communication</h2>", figs.comm_figure(ok, sweep)]
        parts += timeline_sections(run, ok, found, timelines)
        if "window_ms" in ok:
            parts += ["<h2>Rules of thumb</h2>", figs.health_figure(ok)]
    best, tied = best_and_tied(ok, found)

    def flag(row, col):
        if col == "compute_share_pct" and row.get(col, 100) < figs.COMPUTE_SHARE_TARGET:
            return "flag"
        if col == "gpu_util_pct" and row.get(col, 100) < figs.GPU_UTIL_TARGET:
            return "flag"
        return ""

    parts += [
        "<h2>All points</h2>",
        html_table(
            df,
            TRAINING_TABLE,
            "Every point (the best per model and implementation shaded, values tied with it "
            "lighter; typical_ms: geometric mean of the rounds' medians, with its 95 % interval; "
            "path_comm_pct: communication on the critical path, % of it"
            f"{mfu_note(ok)}; computation under {figs.COMPUTE_SHARE_TARGET:.0f} % of the step "
            f"or GPU utilisation under {figs.GPU_UTIL_TARGET:.0f} % in red)",
            row_class=lambda i, r: "best" if i in best else "tied" if i in tied else "",
            cell_class=flag,
        ),
    ]
    if len(ok) and not scaling:
        parts += claims.confidence_section(meta, ok, run.samples, run.noise)
    return parts


def _collective_time(ok: pd.DataFrame) -> str:
    """How the run timed a call, from its rows."""
    if "block_calls" not in ok or ok["block_calls"].isna().all():  # runs before blocks
        return "the slowest rank's median time, each call timed alone"
    calls = ", ".join(str(int(c)) for c in sorted(ok["block_calls"].dropna().unique()))
    return (
        f"the time per call: blocks of {calls} calls issued back to back with one "
        "synchronisation, each block's time (first rank's start to last rank's end) over its "
        "calls, the median over blocks (nccl-tests' method)"
    )


def _collective_sections(meta: dict, df: pd.DataFrame) -> list[str]:
    ok = df[df["status"] == "ok"]
    # The headline and the figure: each collective's cost rows (in place where it has that
    # form: runfolder.placement); the table has both placements.
    first = ok[cost_rows(ok)]
    limits = meta.get("limits", {})
    head = _collective_headline(first, limits, meta.get("impl_native", {}))
    parts = [f"<p class='headline'>{head}</p>"]
    if len(first):
        parts += [
            "<h2>Bus bandwidth</h2>",
            busbw_figure(first, limits),
            f"<p>In place where the collective has that form (all-to-all: out of place; "
            f"torch's out-of-place all-reduce and broadcast add a copy of the input, which "
            f"the table shows). algbw = S / t with S "
            f"the whole buffer in bytes and t {_collective_time(first)}; busbw = algbw x "
            "2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and "
            "all-to-all, x 1 for broadcast (nccl-tests, doc/PERFORMANCE.md); GB = 1e9 bytes. "
            "#wrong counts elements that differ from the exact expected result, summed over "
            "ranks.</p>",
        ]
    parts += [
        "<h2>All sizes</h2>",
        html_table(
            df,
            COLLECTIVE_TABLE,
            "Every collective, size, implementation, out of place and in place (nccl-tests' "
            "table; unsupported: the collective has no such form, the error column says why)",
            cell_class=lambda r, c: "flag" if c == "wrong" and r.get(c, 0) else "",
        ),
    ]
    return parts


def _comparison_sections(cmp: pd.DataFrame, baseline: Path, held=None) -> list[str]:
    if cmp.empty:
        return [
            f"<h2>Compared with {html.escape(baseline.name)}</h2><p>No point ran in both runs.</p>"
        ]
    n_reg = int(cmp["regression"].sum())
    summary = (
        f"{len(cmp)} points compared with <code>{html.escape(str(baseline))}</code>: "
        f"{(cmp['verdict'] == 'faster').sum()} faster, {n_reg} slower, "
        f"{(cmp['verdict'] == TIED).sum()} tied: the 95 % interval of the ratio new / "
        "baseline, over every point together, includes 1 (each run's spread between rounds, "
        "or with one round its steps and its noise floor)."
    )
    if n_reg:
        summary = f"<span class='flag'>{n_reg} regression(s).</span> " + summary
    parts = [
        f"<h2>Compared with {html.escape(baseline.name)}</h2>",
        f"<p>{summary}</p>",
        figs.comparison_figure(cmp),
        html_table(
            cmp,
            COMPARE_TABLE,
            "Per point: baseline and new typical time (ms), "
            "ratio new / baseline with its interval, p-value, verdict",
            cell_class=lambda r, c: "flag" if c == "verdict" and r["regression"] else "",
        ),
    ]
    return parts + _answers_section(held)


def _answers_section(held: pd.DataFrame | None) -> list[str]:
    """Both runs' verdicts.csv side by side: did the best value hold?"""
    if held is None:
        return []
    return [
        "<h3>The answers, then and now</h3>",
        html_table(
            held,
            ANSWERS_TABLE,
            "Per model and implementation, from both runs' verdicts.csv: the best value in the "
            "baseline and now, whether the answer held (the same best, or one within the "
            "other's ties at 95 %) or moved, and the default's cost over the best in each",
            cell_class=lambda r, c: "flag" if c == "answer" and r["answer"] == "moved" else "",
        ),
    ]


def render(
    run: Run, comparison=None, collectives=None, timelines: str = "best", definitions: str = "suite"
) -> str:
    """The whole page; ``comparison`` is (table from ``compare``, baseline folder) or None;
    ``collectives``: message_size run folders to fit the cost model's section from, or None;
    ``timelines``: step timelines of each group's best and default point, of every point, or
    none (``timeline_section.TIMELINES``); ``definitions``: "hta" adds HTA's own figures."""
    meta, df, run_dir = run.meta, run.results, run.path
    sweep = meta.get("sweep", "?")
    failed = df[df["status"] != "ok"] if len(df) else df
    env = (
        f"{meta.get('backend')} on {meta.get('device')} ({meta.get('device_name')}), "
        f"world size {meta.get('world_size')}, {meta.get('nodes')} node(s), torch "
        f"{meta.get('torch_version')}, commit {meta.get('git_commit')}"
    )
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(sweep)} - {html.escape(run_dir.name)}</title>"
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>Sweep <code>{html.escape(sweep)}</code>: {html.escape(run_dir.name)}</h1>",
        f"<p>{html.escape(env)}. Started {meta.get('start_time')}, ended "
        f"{meta.get('end_time')}.</p>",
    ]
    if meta.get("kind") == "replay":
        parts += replay_sections(run)
    elif meta.get("kind") == "collective":
        parts += _collective_sections(meta, df)
    else:
        parts += _training_sections(run, timelines)
        parts += definitions_sections(run, definitions)
    if comparison is not None:
        parts += _comparison_sections(*comparison)
    if collectives and meta.get("kind") != "collective":
        parts += model_sections(run_dir, list(collectives))
    if len(failed):
        parts.append(
            "<h2 class='err'>Failed points</h2><ul>"
            + "".join(_failed_item(r) for r in failed.to_dict("records"))
            + "</ul>"
        )
    argv = " ".join(meta.get("argv", []))
    parts += [
        "<h2>Dig further</h2>",
        f"<p>Traces: <code>tensorboard --logdir {html.escape(str(run_dir / 'traces'))}</code> "
        "(with torch-tb-profiler installed: each point is a run, each rank a worker; the run "
        "<code>sweep_scalars</code> plots the sweep).</p>",
        f"<p>Analyse a point: <code>python -m bench.analysis "
        f"{html.escape(str(run_dir / 'traces'))}/&lt;point&gt;</code></p>",
        f"<p>Reproduce: <code>torchrun --standalone --nproc_per_node={meta.get('world_size')} "
        f"bench/run.py {html.escape(argv)}</code></p>",
        f"</main>{LOAD_CHECK}</body></html>",
    ]
    return "\n".join(parts)


def _failed_item(r: dict) -> str:
    """A failed point: its error, and the whole of its hang diagnosis with the folder of dumps
    that ``python -m bench.hang`` reads again."""
    item = f"<li><code>{html.escape(str(r['point']))}</code>: {html.escape(str(r['error']))}"
    diagnosis = r.get("diagnosis")
    if isinstance(diagnosis, str) and diagnosis:
        item += (
            f"<br><b>diagnosis</b>: {html.escape(diagnosis)} (<code>python -m bench.hang "
            f"{html.escape(str(r.get('hang_dir', '')))}</code>)"
        )
    return item + "</li>"


def write_report(
    run_dir: Path,
    reports_dir: Path = Path("reports"),
    baseline: Path | None = None,
    collectives: list[Path] | None = None,
    timelines: str = "best",
    definitions: str = "suite",
) -> tuple[Path, pd.DataFrame | None]:
    """Write the report; return its path and, with a baseline, the comparison table; with
    ``collectives`` (message_size runs), the cost model's section."""
    run = read_run(Path(run_dir))
    if run.results.empty:
        raise RunFolderError(f"{run_dir} holds no results.csv")
    comparison = None
    if baseline is not None:
        old = read_run(Path(baseline))
        if old.results.empty:
            raise RunFolderError(f"baseline {baseline} holds no results.csv")
        cmp = compare(
            run.results,
            run.samples,
            old.results,
            old.samples,
            new_noise=run.noise,
            old_noise=old.noise,
        )
        held = answers_then_and_now(read_verdicts(old.path), read_verdicts(run.path))
        comparison = (cmp, Path(baseline), held)
    reports_dir.mkdir(parents=True, exist_ok=True)
    out = reports_dir / f"{run.path.name}.html"
    write_text(out, render(run, comparison, collectives, timelines, definitions))
    return out, comparison[0] if comparison else None
