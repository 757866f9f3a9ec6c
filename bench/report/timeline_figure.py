"""The step timeline figure: per rank a lane pair (computation, with waiting and idle marked in
it; communication, each collective a labelled bar) under a strip of the step's phases, every
rank and every panel on one time scale. Drawn from ``bench.analysis.timeline``'s table; colours
are paired with hatches so that a grey print still tells the lanes apart."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from bench.report.charts import png

STYLE = {  # lane -> (face colour, hatch)
    "compute": ("#4c72b0", ""),
    "wait": ("#dd8452", "///"),
    "idle": ("#d0d0d0", ".."),
    "comm": ("#55a868", ""),
}
PHASE = {"forward": "#e8e8f4", "backward": "#f4e8e8", "optimizer": "#e8f4e8"}
MICRO_KIND = re.compile(r"^\d*([FBIW])\d+$")  # a pipeline micro-batch's label (timeline.py)
MICRO_PHASE = {"F": "forward", "B": "backward", "I": "backward", "W": "backward"}
PATH_COLOUR = "#c0392b"  # the critical path, a thin line over the rank's compute lane
LABEL_MIN_SHARE = 0.04  # a bar narrower than this share of the axis goes unlabelled


def _rows(starts, ends) -> list[int]:
    """A sub-row per call, the lowest free one: calls in flight together (DDP's buckets on
    gloo's two threads) are drawn one above the other, not on top of each other."""
    free_at: list[float] = []  # per sub-row, when its last call ends
    out = []
    for s, e in zip(starts, ends, strict=True):
        row = next((k for k, t in enumerate(free_at) if t <= s), len(free_at))
        if row == len(free_at):
            free_at.append(e)
        else:
            free_at[row] = e
        out.append(row)
    return out


def _phase_colour(label: str) -> str:
    """A phase's colour; a pipeline's micro-batch (``F3``, ``B3``, ``1W3``) takes its kind's."""
    if label in PHASE:
        return PHASE[label]
    kind = MICRO_KIND.match(label)
    return PHASE[MICRO_PHASE[kind[1]]] if kind else "#eeeeee"


def _phase_strip(ax, g: pd.DataFrame, base: float, span: float) -> None:
    """One rank's strip of step phases (forward, backward, optimizer), labelled where wide."""
    for p in g[g["lane"] == "phase"].itertuples():
        ax.broken_barh(
            [(p.start_ms, p.end_ms - p.start_ms)],
            (base + 2.05, 0.5),
            facecolor=_phase_colour(p.label),
            edgecolor="#888888",
            linewidth=0.5,
        )
        if (p.end_ms - p.start_ms) > LABEL_MIN_SHARE * span:
            ax.text(
                (p.start_ms + p.end_ms) / 2,
                base + 2.3,
                p.label,
                ha="center",
                va="center",
                fontsize=7,
            )


def _comm_lane(ax, g: pd.DataFrame, base: float, span: float) -> None:
    """One rank's communication lane: each collective a bar, labelled where wide."""
    calls = g[g["lane"] == "comm"].sort_values("start_ms")
    rows = _rows(calls["start_ms"].to_numpy(), calls["end_ms"].to_numpy())
    n = max(rows, default=0) + 1
    height = 0.9 / n
    face, _ = STYLE["comm"]
    for c, row in zip(calls.itertuples(), rows, strict=True):
        y = base + row * height
        ax.broken_barh(
            [(c.start_ms, c.end_ms - c.start_ms)],
            (y, height * 0.95),
            facecolor=face,
            edgecolor="#1f4f2a",
            linewidth=0.6,
        )
        if (c.end_ms - c.start_ms) > LABEL_MIN_SHARE * span * (1 + len(c.label) / 16):
            ax.text(
                (c.start_ms + c.end_ms) / 2,
                y + height * 0.47,
                c.label,
                ha="center",
                va="center",
                fontsize=7 if n == 1 else 6,
                color="white",
            )


def _panel(ax, tl: pd.DataFrame, title: str, span: float) -> None:
    ranks = sorted(tl["rank"].unique())
    ticks, names = [], []
    for k, rank in enumerate(ranks):
        g = tl[tl["rank"] == rank]
        base = (len(ranks) - 1 - k) * 3.2  # rank 0 on top
        _phase_strip(ax, g, base, span)
        for lane in ("idle", "compute", "wait"):
            bars = g[g["lane"] == lane]
            face, hatch = STYLE[lane]
            ax.broken_barh(
                list(zip(bars["start_ms"], bars["end_ms"] - bars["start_ms"], strict=True)),
                (base + 1.05, 0.9),
                facecolor=face,
                hatch=hatch,
                edgecolor="none" if not hatch else "#555555",
                linewidth=0,
            )
        _comm_lane(ax, g, base, span)
        on_path = g[g["lane"] == "path"]
        ax.broken_barh(
            list(zip(on_path["start_ms"], on_path["end_ms"] - on_path["start_ms"], strict=True)),
            (base + 1.95, 0.1),
            facecolor=PATH_COLOUR,
            edgecolor="none",
        )
        ticks += [base + 1.5, base + 0.45]
        names += [f"rank {rank} compute", f"rank {rank} comm"]
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_xlim(0, span)
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def timeline_figure(panels: list[tuple[str, pd.DataFrame]], alt: str) -> str:
    """One panel per (title, timeline table), stacked, on one time scale; an <img> with the
    PNG embedded."""
    span = max(float(tl["end_ms"].max()) for _, tl in panels)
    heights = [max(1.6, 0.95 * tl["rank"].nunique() + 0.6) for _, tl in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(11, sum(heights) + 0.6),
        sharex=True,
        height_ratios=heights,
        squeeze=False,
    )
    for ax, (title, tl) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, tl, title, span)
    axes[-1, 0].set_xlabel("ms from the step's start (earliest rank)")
    legend = [
        Patch(facecolor=STYLE[k][0], hatch=STYLE[k][1], edgecolor="#555555", label=k)
        for k in ("compute", "wait", "idle", "comm")
    ]
    legend += [Patch(facecolor=c, edgecolor="#888888", label=p) for p, c in PHASE.items()]
    if any((tl["lane"] == "path").any() for _, tl in panels):
        legend.append(Patch(facecolor=PATH_COLOUR, label="critical path"))
    fig.legend(
        handles=legend,
        loc="upper center",
        ncol=8,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 1.0 + 0.25 / (sum(heights) + 0.6)),
    )
    fig.tight_layout()
    return png(fig, alt)
