"""The report's figures (matplotlib), each returned as an <img> with the PNG embedded and an
alt text that says what it shows."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bench.report.claims import fmt_value

Part = tuple[str, pd.Series, str]  # a stacked bar's part: label, ms per row, colour
# The seed's rules of thumb for a healthy data-parallel step.
COMPUTE_SHARE_TARGET = 80.0
GPU_UTIL_TARGET = 90.0


def png(fig, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return (
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(alt)}</figcaption></figure>"
    )


def point_label(r) -> str:
    scaling = getattr(r, "scaling", None)
    scaling = f" {scaling}" if isinstance(scaling, str) else ""
    return f"{r.model} {fmt_value(r.value)}{scaling} {r.impl}"


def is_numeric(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values)


def step_time_figure(ok: pd.DataFrame, sweep: str, second: str | None = None) -> str:
    """Numeric sweeps (bucket sizes): lines on a log axis; named values (sharding strategies):
    bars side by side, one per implementation. One panel per model, and in a grid per value of
    its ``second`` knob (the ``value2`` column)."""
    numeric = is_numeric(ok["value"])
    names = list(dict.fromkeys(ok["value"]))
    grid = second is not None and "value2" in ok
    keys = ["model", "value2"] if grid else ["model"]
    models = list(dict.fromkeys(ok["model"]))
    # a grid reads as one: a row per model, a column per value of the second knob
    seconds = list(dict.fromkeys(ok["value2"])) if grid else [None]
    panels = [(m, v) if grid else (m,) for m in models for v in seconds]
    rows, cols = (len(models), len(seconds)) if grid else (1, len(models))
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes.flat, panels, strict=True):
        sel = np.logical_and.reduce([ok[k] == v for k, v in zip(keys, panel, strict=True)])
        here = ok[sel]
        model = panel[0]
        impls = list(dict.fromkeys(here["impl"]))
        width = 0.8 / max(1, len(impls))
        for k, (impl, g) in enumerate(here.groupby("impl", sort=False)):
            g = g.sort_values("value") if numeric else g
            y, err = _with_interval(g)
            if numeric:
                ax.errorbar(g["value"], y, yerr=err, marker="o", capsize=3, label=impl)
            else:
                x = [names.index(v) + (k - (len(impls) - 1) / 2) * width for v in g["value"]]
                ax.bar(x, y, width, yerr=err, capsize=3, label=impl)
        if numeric:  # a log axis, ticked at the swept values themselves
            ax.set_xscale("log", base=2)
            ticks = sorted(set(ok["value"]))
            ax.set_xticks(ticks, [fmt_value(v) for v in ticks], fontsize=8)
            ax.minorticks_off()
        else:
            ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_xlabel(sweep.split(",")[0])
        ax.set_ylabel("step time, ms (95 % interval)")
        ax.set_title(f"{model}, {second}={fmt_value(panel[1])}" if grid else model)
        ax.grid(alpha=0.3)
        ax.legend()
    per = f"model and {second}" if grid else "model"
    return png(
        fig,
        f"Typical step time (the geometric mean of the rounds' medians) with its 95 % interval, "
        f"against {sweep.split(',')[0]}, one panel per {per}, one line per implementation.",
    )


def _with_interval(g: pd.DataFrame) -> tuple[pd.Series, list[pd.Series]]:
    """(typical step time, its error bars below and above) of the reader's interval columns,
    or the median and its own interval where they are absent; no bar where there is none."""
    if "typical_ms" in g and g["typical_ms"].notna().all():
        y, lo, hi = g["typical_ms"], g["typical_ms_low"], g["typical_ms_high"]
    else:
        y = g["step_ms_median"]
        lo = g.get("step_ms_ci_low", pd.Series(np.nan, index=g.index))
        hi = g.get("step_ms_ci_high", pd.Series(np.nan, index=g.index))
    return y, [(y - lo).fillna(0).clip(lower=0), (hi - y).fillna(0).clip(lower=0)]


def breakdown_parts(g: pd.DataFrame) -> list[Part]:
    """The stacked bar's parts (name, ms, colour), which add up to the traced step window:
    window = compute + exposed communication + idle + the device work that is neither
    (memcpy/memset and other device events outside computation and communication, HTA's
    "non-compute" beyond communication), the last being what the window leaves over; zero on
    CPU traces, absent from runs without ``window_ms``."""
    if "window_ms" in g:
        other = g["window_ms"] - g["compute_ms"] - g["exposed_comm_ms"] - g["idle_ms"]
    else:
        other = pd.Series(np.nan, index=g.index)
    return [
        ("compute (not overlapped)", g["compute_ms"] - g["overlap_ms"], "#4a7fb5"),
        ("communication overlapped with compute", g["overlap_ms"], "#8cc084"),
        ("exposed communication", g["exposed_comm_ms"], "#e07b53"),
        ("memcpy/memset, other device work", other, "#9d7cc1"),
        ("idle", g["idle_ms"], "#c8c8c8"),
    ]


def stacked_by_model(
    ok: pd.DataFrame,
    parts: Callable[[pd.DataFrame], list[Part]],
    xlabel: str,
    note: Callable[[pd.DataFrame], list[str]] | None = None,
):
    """A figure of one stacked horizontal bar per point, ``parts(model's rows)`` left to right
    (empty cells 0, negatives clipped), ``note``'s text after each bar; one panel per model,
    each on its own scale, so a small model's bars are not flattened by a large one's."""
    models = list(dict.fromkeys(ok["model"]))
    heights = [max(1.2, 0.3 * (ok["model"] == m).sum() + 0.6) for m in models]
    fig, axes = plt.subplots(
        len(models),
        1,
        figsize=(8, sum(heights) + 0.9),
        squeeze=False,
        gridspec_kw={"height_ratios": heights, "hspace": 0.6},
    )
    for ax, model in zip(axes[:, 0], models, strict=True):
        g = ok[ok["model"] == model]
        left = np.zeros(len(g))
        for label, vals, color in parts(g):
            vals = vals.fillna(0).clip(lower=0).to_numpy()
            ax.barh(range(len(g)), vals, left=left, label=label, color=color)
            left += vals
        for y, text in enumerate(note(g) if note else []):
            ax.text(left[y], y, f" {text}", va="center", fontsize=7)
        ax.set_yticks(range(len(g)), [point_label(r) for r in g.itertuples()], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(model, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        if note:
            ax.margins(x=0.15)
    axes[-1, 0].set_xlabel(xlabel)
    axes[0, 0].legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.08), ncol=2)
    return fig


def breakdown_figure(ok: pd.DataFrame) -> str:
    """Stacked horizontal bar per point: compute alone, overlapped communication, exposed
    communication, memory copies and other device work, idle (their sum is the traced step,
    ``breakdown_parts``), a panel per model."""
    fig = stacked_by_model(ok, breakdown_parts, "ms per step (traced steps, mean over ranks)")
    return png(
        fig,
        "Where each point's step goes: computation alone, communication overlapped "
        "with computation, exposed communication, memory copies and other device work, and "
        "idle time, stacked.",
    )


def memory_figure(ok: pd.DataFrame) -> str:
    """Per value (sharding strategy) and implementation: the state a rank holds (parameters,
    gradients, optimiser state) next to the ZeRO paper's figure for it, and the peak of tensor
    memory during a step."""
    names = list(dict.fromkeys(ok["value"]))
    impls = list(dict.fromkeys(ok["impl"]))
    models = list(dict.fromkeys(ok["model"]))
    fig, axes = plt.subplots(1, 2 * len(models), figsize=(11 * len(models), 4), squeeze=False)
    width = 0.8 / (len(impls) + 1)
    for m, model in enumerate(models):
        for ax, col, title in (
            (axes[0, 2 * m], "state_mb", "state held per rank, MB"),
            (axes[0, 2 * m + 1], "peak_mem_mb", "peak memory in a step, MB"),
        ):
            g = ok[ok["model"] == model]
            for k, impl in enumerate(impls):
                gi = g[g["impl"] == impl]
                x = [names.index(v) + (k - len(impls) / 2) * width for v in gi["value"]]
                ax.bar(x, gi[col], width, label=impl)
            if col == "state_mb":
                first = g.drop_duplicates("value")
                x = [names.index(v) + (len(impls) / 2) * width for v in first["value"]]
                ax.bar(x, first["state_mb_expected"], width, label="ZeRO paper", color="#999999")
            ax.set_xticks(range(len(names)), names, fontsize=7, rotation=15)
            ax.set_title(f"{model}: {title}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return png(
        fig,
        "Memory per point: what each rank holds (parameters, gradients, "
        "optimiser state) next to the ZeRO paper's figure, and the peak of tensor memory "
        "during a step, per implementation.",
    )


def comm_figure(ok: pd.DataFrame, sweep: str) -> str:
    """Per value and implementation: the bytes one rank hands to collectives per step, read
    from the traces, with the analytical figure marked on each bar."""
    names = list(dict.fromkeys(ok["value"]))
    models = list(dict.fromkeys(ok["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        g = ok[ok["model"] == model]
        impls = list(dict.fromkeys(g["impl"]))
        width = 0.8 / max(1, len(impls))
        for k, impl in enumerate(impls):
            gi = g[g["impl"] == impl]
            x = [names.index(v) + (k - (len(impls) - 1) / 2) * width for v in gi["value"]]
            ax.bar(x, gi["comm_bytes_per_step"] / 1e6, width, label=impl)
            ax.scatter(
                x,
                gi["comm_bytes_expected"] / 1e6,
                marker="_",
                s=300,
                color="black",
                label="analytical" if k == 0 else None,
                zorder=3,
            )
        ax.set_xticks(range(len(names)), [fmt_value(v) for v in names], fontsize=8)
        ax.set_xlabel(sweep)
        ax.set_ylabel("MB per step and rank (traces)")
        ax.set_title(model)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return png(
        fig,
        f"Communication per step against {sweep}: bytes one rank hands to collectives, "
        "read from the traces, one bar per implementation; the black marks are the "
        "analytical figures.",
    )


def scaling_figure(ok: pd.DataFrame) -> str:
    """World-size sweep: throughput against world size with the ideal (linear from the base
    point), and scaling efficiency; one line per implementation and scaling mode."""
    models = list(dict.fromkeys(ok["model"]))
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.8 * len(models)), squeeze=False)
    sizes = sorted(set(ok["world_size"]))
    for row, model in zip(axes, models, strict=True):
        g = ok[ok["model"] == model]
        for (impl, scaling), s in g.groupby(["impl", "scaling"], sort=False):
            s = s.sort_values("world_size")
            label = f"{impl}, {scaling}"
            (line,) = row[0].plot(s["world_size"], s["samples_per_s"], marker="o", label=label)
            base = s.iloc[0]
            row[0].plot(
                s["world_size"],
                base["samples_per_s"] * s["ideal_speedup"],
                linestyle=":",
                color=line.get_color(),
            )
            row[1].plot(s["world_size"], s["efficiency_pct"], marker="o", label=label)
        row[1].axhline(100, color="grey", linestyle="--", linewidth=1)
        for ax, ylabel in ((row[0], "samples/s (dotted: ideal)"), (row[1], "efficiency, %")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(k) for k in sizes])
            ax.minorticks_off()
            ax.set_xlabel("world size (ranks)")
            ax.set_ylabel(ylabel)
            ax.set_title(model)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        row[1].set_ylim(0, max(110, float(np.nanmax(g["efficiency_pct"])) + 10))
    fig.tight_layout()
    return png(
        fig,
        "Scaling: throughput against world size with the ideal linear scaling from the "
        "smallest world size dotted, and scaling efficiency (throughput over ideal), per "
        "implementation and scaling mode (weak: fixed per-replica batch; strong: fixed "
        "global batch).",
    )


def tradeoff_figure(ok: pd.DataFrame, sweep: str) -> str:
    """Knobs of the training step: what each setting costs and buys, one marker per point:
    step time against peak memory, step time against bytes per sample, and the loss the
    point's steps reached (the fp32 / uncompressed / off setting is the one to match)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    per_sample = ok.get("comm_bytes_per_sample")
    for (model, impl), g in ok.groupby(["model", "impl"], sort=False):
        label = f"{model} {impl}"
        (line,) = axes[0].plot(
            g["step_ms_median"], g["peak_mem_mb"], marker="o", linestyle="", label=label
        )
        color = line.get_color()
        if per_sample is not None:
            axes[1].plot(
                g["step_ms_median"],
                per_sample[g.index],
                marker="o",
                linestyle="",
                color=color,
                label=label,
            )
        for _, r in g.iterrows():
            text = fmt_value(r["value"])
            axes[0].annotate(
                text,
                (r["step_ms_median"], r["peak_mem_mb"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
            if per_sample is not None:
                axes[1].annotate(
                    text,
                    (r["step_ms_median"], per_sample[r.name]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    labels = [point_label(r) for r in ok.itertuples()]
    axes[2].barh(range(len(ok)), ok["loss"].fillna(0))
    axes[2].set_yticks(range(len(ok)), labels, fontsize=7)
    axes[2].invert_yaxis()
    lo, hi = ok["loss"].min(), ok["loss"].max()
    if np.isfinite(lo) and hi > lo:
        axes[2].set_xlim(lo - 0.5 * (hi - lo) - 1e-6, hi + 0.5 * (hi - lo))
    for ax, ylabel in ((axes[0], "peak memory in a step, MB"), (axes[1], "bytes per sample")):
        ax.set_xlabel("step time, ms (median)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[2].set_xlabel("loss after the point's steps")
    axes[2].grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return png(
        fig,
        f"Trade-offs of {sweep}: each point's step time against its peak memory and against "
        "the bytes it communicates per sample (labels are the settings), and the loss its "
        "steps reached, to check that a cheaper setting still trains.",
    )


def health_figure(ok: pd.DataFrame) -> str:
    """Computation's share of the step per point against the 80 % rule of thumb, and GPU
    utilisation against 90 % where there is a GPU; points that miss are drawn in red."""
    share = 100 * ok["compute_ms"] / ok["window_ms"]
    gpu = ok["gpu_util_pct"] if ok["gpu_util_pct"].notna().any() else None
    panels = 2 if gpu is not None else 1
    labels = [point_label(r) for r in ok.itertuples()]
    height = max(2.5, 0.28 * len(ok) + 1)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, height), squeeze=False)
    series = [(share, COMPUTE_SHARE_TARGET, "computation, % of the step")]
    if gpu is not None:
        series.append((gpu, GPU_UTIL_TARGET, "GPU utilisation, %"))
    for ax, (vals, target, title) in zip(axes[0], series, strict=True):
        colors = ["#c0392b" if v < target else "#4a7fb5" for v in vals.fillna(0)]
        ax.barh(range(len(ok)), vals.fillna(0), color=colors)
        ax.axvline(target, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(ok)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel(title)
        ax.grid(axis="x", alpha=0.3)
    return png(
        fig,
        f"Computation's share of each step against the {COMPUTE_SHARE_TARGET:.0f} % "
        "rule of thumb"
        + (f", and GPU utilisation against {GPU_UTIL_TARGET:.0f} %" if gpu is not None else "")
        + "; red bars miss it.",
    )


def comparison_figure(cmp: pd.DataFrame) -> str:
    """new/old ratio per point, coloured by verdict."""
    colors = {"faster": "#2e8b57", "slower": "#c0392b", "tied": "#999999"}
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.28 * len(cmp) + 1)))
    err = [(cmp["ratio"] - cmp["low"]).fillna(0), (cmp["high"] - cmp["ratio"]).fillna(0)]
    ax.barh(
        range(len(cmp)),
        cmp["ratio"] - 1,
        left=1,
        color=[colors[v] for v in cmp["verdict"]],
        xerr=err,
        capsize=2,
    )
    ax.axvline(1, color="black", linewidth=1)
    ax.set_yticks(range(len(cmp)), cmp["point"], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("typical time, new / baseline, 95 % interval (< 1 is faster)")
    ax.grid(axis="x", alpha=0.3)
    return png(
        fig,
        "New run against the baseline, per point: the ratio of typical times with its 95 % "
        "interval; green is faster, red slower (the interval excludes 1), grey tied.",
    )
