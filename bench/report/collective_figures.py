"""The collective sweep's figure: busbw against message size, as nccl-tests' tables read."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.report.charts import plt, png


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
            (line,) = ax.plot(
                g["size_bytes"], g["busbw_GBps"], marker="o", markersize=3, label=impl
            )
            if {"busbw_GBps_ci_low", "busbw_GBps_ci_high"} <= set(g):  # runs before 0.3: none
                ax.fill_between(
                    g["size_bytes"],
                    g["busbw_GBps_ci_low"],
                    g["busbw_GBps_ci_high"],
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
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
    return png(
        fig,
        "Bus bandwidth against message size, one panel per collective, one line "
        "per implementation with its 95 % interval shaded; the dashed line is the measured "
        "point-to-point bandwidth.",
    )
