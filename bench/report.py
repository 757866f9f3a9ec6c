"""Results -> one self-contained HTML report (figures embedded as PNG data URIs).

``python -m bench.report results/<run>`` writes ``reports/<run>.html``; every sweep also calls
``write_report`` when it finishes. This layer only reads ``meta.json`` and ``results.csv``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bench.results import read_run
from bench.sweeps import SWEEPS
from parallel_kernels.strategies import STRATEGIES

# The seed's rule of thumb for a healthy data-parallel step.
COMPUTE_SHARE_TARGET = 0.80

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:72em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em} td,th{padding:.25em .6em;border:1px solid #ddd}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.best{background:#e8f6e8} .err{color:#b00} .flag{color:#b60} code{background:#f4f4f4;padding:0 .2em}
.headline{font-size:1.1em;background:#f7f9fc;padding:.8em 1em;border-left:4px solid #4a7}
"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="figure" src="data:image/png;base64,{data}">'


def step_time_figure(ok: pd.DataFrame, sweep: str) -> str:
    models = list(dict.fromkeys(ok["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for impl, g in ok[ok["model"] == model].groupby("impl", sort=False):
            g = g.sort_values("value")
            err = [g["step_ms_median"] - g["step_ms_min"], g["step_ms_max"] - g["step_ms_median"]]
            ax.errorbar(
                g["value"], g["step_ms_median"], yerr=err, marker="o", capsize=3, label=impl
            )
        ax.set_xscale("log")
        ax.set_xlabel(sweep)
        ax.set_ylabel("step time, ms (median, min-max)")
        ax.set_title(model)
        ax.grid(alpha=0.3)
        ax.legend()
    return _png(fig)


def breakdown_figure(ok: pd.DataFrame) -> str:
    """Stacked bar per point: compute alone, overlapped comm, exposed comm, idle (sum = step
    window as traced)."""
    labels = [f"{r.model}\n{r.value:g}\n{r.impl}" for r in ok.itertuples()]
    parts = {
        "compute (not overlapped)": ok["compute_ms"] - ok["overlap_ms"],
        "communication overlapped with compute": ok["overlap_ms"],
        "exposed communication": ok["exposed_comm_ms"],
        "idle": ok["idle_ms"],
    }
    colors = ["#4a7fb5", "#8cc084", "#e07b53", "#c8c8c8"]
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * len(ok)), 4))
    bottom = np.zeros(len(ok))
    for (name, vals), color in zip(parts.items(), colors, strict=True):
        vals = vals.fillna(0).to_numpy()
        ax.bar(range(len(ok)), vals, bottom=bottom, label=name, color=color)
        bottom += vals
    ax.set_xticks(range(len(ok)), labels, fontsize=7)
    ax.set_ylabel("ms per step (traced steps, mean over ranks)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def headline(meta: dict, df: pd.DataFrame) -> str:
    sweep = meta.get("sweep", "?")
    ok = df[df["status"] == "ok"]
    lines = []
    default = None
    if sweep in SWEEPS:
        default = STRATEGIES[SWEEPS[sweep].strategy].options.get(SWEEPS[sweep].option)
    for (model, impl), g in ok.groupby(["model", "impl"], sort=False):
        best = g.loc[g["step_ms_median"].idxmin()]
        text = (
            f"<b>{html.escape(str(model))}</b>, {html.escape(str(impl))}: best "
            f"<b>{sweep}={best['value']:g}</b> at {best['step_ms_median']:.1f} ms "
            f"(min {best['step_ms_min']:.1f}, max {best['step_ms_max']:.1f})"
        )
        base = g[np.isclose(g["value"], default)] if default is not None else g.iloc[0:0]
        if len(base) and best["value"] != default:
            b = base.iloc[0]
            margin = 100 * (b["step_ms_median"] / best["step_ms_median"] - 1)
            real = best["step_ms_max"] < b["step_ms_min"]
            text += (
                f"; the default {default:g} takes {margin:+.1f} % "
                f"({b['step_ms_median']:.1f} ms; min-max ranges "
                f"{'do not overlap' if real else 'overlap: the difference may be noise'})"
            )
        lines.append(text)
    return "<br>".join(lines) or "no point finished"


def _table(df: pd.DataFrame) -> str:
    cols = [
        "model",
        "value",
        "impl",
        "status",
        "step_ms_median",
        "step_ms_min",
        "step_ms_max",
        "samples_per_s",
        "compute_ms",
        "comm_ms",
        "overlap_pct",
        "exposed_comm_ms",
        "idle_ms",
        "compute_comm_ratio",
        "comm_calls_per_step",
        "comm_bytes_per_step",
        "peak_mem_mb",
    ]
    cols = [c for c in cols if c in df]
    ok = df[df["status"] == "ok"]
    best = set(ok.groupby(["model", "impl"])["step_ms_median"].idxmin()) if len(ok) else set()
    out = ["<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for idx, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                text = "" if np.isnan(v) else f"{v:,.2f}" if abs(v) < 1e6 else f"{v:,.0f}"
                cls = "num"
            else:
                text, cls = html.escape(str(v)), ""
            if c == "compute_ms" and row.get("status") == "ok":
                share = row["compute_ms"] / row["step_ms_median"]
                if share < COMPUTE_SHARE_TARGET:
                    cls += " flag"
            cells.append(f'<td class="{cls}">{text}</td>')
        out.append(f'<tr class="{"best" if idx in best else ""}">' + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def busbw_figure(ok: pd.DataFrame, limits: dict) -> str:
    """busbw against message size per collective, one line per implementation, with the
    measured one-way point-to-point bandwidth as the reference line."""
    colls = list(dict.fromkeys(ok["collective"]))
    cols = min(3, len(colls))
    rows = -(-len(colls) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(colls) :]:
        ax.set_visible(False)
    for ax, coll in zip(axes.flat, colls, strict=False):
        for impl, g in ok[ok["collective"] == coll].groupby("impl", sort=False):
            ax.plot(g["size_bytes"], g["busbw_GBps"], marker="o", markersize=3, label=impl)
        p2p = limits.get("p2p_GBps")
        if p2p and not np.isnan(p2p):
            ax.axhline(p2p, color="grey", linestyle="--", linewidth=1, label="point-to-point")
        ax.set_xscale("log", base=2)
        ax.set_title(coll)
        ax.set_xlabel("message size S, bytes")
        ax.set_ylabel("busbw, GB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _collective_headline(ok: pd.DataFrame, limits: dict) -> str:
    lines = []
    for coll, g in ok.groupby("collective", sort=False):
        best = g.groupby("impl")["busbw_GBps"].max()
        text = f"<b>{coll}</b>: best busbw " + ", ".join(
            f"{impl} {v:.2f} GB/s" for impl, v in best.items()
        )
        if {"native", "reference"} <= set(best.index):
            text += f" (reference/native {best['reference'] / best['native']:.2f})"
        lines.append(text)
    p2p = limits.get("p2p_GBps")
    if p2p:
        lines.append(
            f"point-to-point {p2p:.2f} GB/s one way, "
            f"{limits.get('p2p_bidir_GBps', float('nan')):.2f} GB/s per direction both "
            f"ways; memory copy {limits.get('memcpy_GBps', float('nan')):.2f} GB/s"
        )
    return "<br>".join(lines)


def _plain_table(df: pd.DataFrame, cols: list[str]) -> str:
    cols = [c for c in cols if c in df]
    out = ["<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                cells.append(f'<td class="num">{"" if np.isnan(v) else f"{v:,.3f}"}</td>')
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_collectives(meta: dict, df: pd.DataFrame) -> list[str]:
    ok = df[df["status"] == "ok"]
    limits = meta.get("limits", {})
    parts = [f"<p class='headline'>{_collective_headline(ok, limits)}</p>"]
    if len(ok):
        parts += [
            "<h2>Bus bandwidth</h2>",
            busbw_figure(ok, limits),
            "<p>algbw = S / t with S the whole buffer in bytes and t the slowest rank's "
            "median time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for "
            "all-gather, reduce-scatter and all-to-all, x 1 for broadcast (nccl-tests, "
            "doc/PERFORMANCE.md); GB = 1e9 bytes. #wrong counts elements that differ "
            "from the exact expected result, summed over ranks.</p>",
        ]
    parts += [
        "<h2>All sizes</h2>",
        _plain_table(
            df,
            [
                "collective",
                "op",
                "dtype",
                "size_bytes",
                "count",
                "impl",
                "time_us",
                "algbw_GBps",
                "busbw_GBps",
                "wrong",
                "status",
            ],
        ),
    ]
    return parts


def render(meta: dict, df: pd.DataFrame, run_dir: Path) -> str:
    sweep = meta.get("sweep", "?")
    ok = df[df["status"] == "ok"] if len(df) else df
    failed = df[df["status"] != "ok"] if len(df) else df
    env = (
        f"{meta.get('backend')} on {meta.get('device')} ({meta.get('device_name')}), "
        f"world size {meta.get('world_size')}, {meta.get('nodes')} node(s), torch "
        f"{meta.get('torch_version')}, commit {meta.get('git_commit')}"
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{sweep} - "
        f"{html.escape(run_dir.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Sweep <code>{sweep}</code>: {html.escape(run_dir.name)}</h1>",
        f"<p>{html.escape(env)}. Started {meta.get('start_time')}, "
        f"ended {meta.get('end_time')}.</p>",
    ]
    collective = "collective" in df.columns
    if collective:
        parts += render_collectives(meta, df)
    else:
        parts.append(f"<p class='headline'>{headline(meta, df) if len(df) else 'no results'}</p>")
    if len(ok) and not collective:
        parts += [
            "<h2>Step time</h2>",
            step_time_figure(ok, sweep),
            "<h2>Where the step goes</h2>",
            breakdown_figure(ok),
            "<p>From each point's traced steps: computation on the main thread (or GPU "
            "kernels), communication spans, their overlap; idle is the rest of the step. "
            f"Computation below {COMPUTE_SHARE_TARGET:.0%} of the step is flagged in the "
            "table.</p>",
        ]
    if not collective:
        parts += ["<h2>All points</h2>", _table(df) if len(df) else "<p>none</p>"]
    if len(failed):
        parts.append(
            "<h2 class='err'>Failed points</h2><ul>"
            + "".join(
                f"<li><code>{html.escape(str(r.point))}</code>: {html.escape(str(r.error))}</li>"
                for r in failed.itertuples()
            )
            + "</ul>"
        )
    argv = " ".join(meta.get("argv", []))
    parts += [
        "<h2>Dig further</h2>",
        f"<p>Traces: <code>tensorboard --logdir {html.escape(str(run_dir / 'traces'))}</code> "
        "(with torch-tb-profiler installed; each point is a run, each rank a worker).</p>",
        f"<p>Reproduce: <code>torchrun --standalone --nproc_per_node={meta.get('world_size')} "
        f"bench/run.py {html.escape(argv)}</code></p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(run_dir: Path, reports_dir: Path = Path("reports")) -> Path:
    run_dir = Path(run_dir)
    meta, df = read_run(run_dir)
    if not meta and df.empty:
        raise FileNotFoundError(f"{run_dir} holds no meta.json or results.csv")
    reports_dir.mkdir(parents=True, exist_ok=True)
    out = reports_dir / f"{run_dir.name}.html"
    out.write_text(render(meta, df, run_dir))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    args = p.parse_args(argv)
    try:
        out = write_report(args.run_dir, args.reports_dir)
    except (FileNotFoundError, pd.errors.ParserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
