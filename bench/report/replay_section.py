"""The report of a replay run (``python -m bench.replay``): each traced step's communication,
traced against replayed and priced, in total and per collective."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bench.report.charts import png
from bench.report.tables import html_table
from bench.runfolder import columns
from bench.runfolder.schema import Run

CALL_TABLE = columns.report_columns(columns.REPLAY)


def _how(row) -> str:
    """A source's label: replayed with an implementation, or priced on a link."""
    return f"replayed ({row['impl']})" if row["source"] == "replayed" else f"priced ({row['link']})"


def _headline(steps: pd.DataFrame) -> str:
    parts = []
    for step, g in steps.groupby("step", sort=True):
        traced = g["traced_us"].iloc[0]
        each = [
            f"{_how(r)} {r['time_us'] / 1e3:.2f} ms ({r['time_us'] / traced:.2f}x)"
            for _, r in g.iterrows()
            if traced > 0 and np.isfinite(r["time_us"])
        ]
        parts.append(
            f"step {step}: traced {traced / 1e3:.2f} ms of communication; " + ", ".join(each)
        )
    return "<br>".join(html.escape(p) for p in parts)


def step_figure(calls: pd.DataFrame, step: int) -> str:
    """One step's calls in issue order: traced time against each source's (log scale)."""
    g = calls[(calls["step"] == step) & (calls["kind"] == "call")]
    first = g.drop_duplicates("index").sort_values("index")
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(first) + 3), 3.6))
    x = np.arange(len(first))
    sources = [(s, rows) for s, rows in g.groupby(["source", "impl", "link"], dropna=False)]
    width = 0.8 / (len(sources) + 1)
    ax.bar(x, first["traced_us"], width, label="traced (transfer)", color="0.3")
    for k, (_, rows) in enumerate(sources, 1):
        rows = rows.set_index("index").reindex(first["index"])
        ax.bar(x + k * width, rows["time_us"], width, label=_how(rows.iloc[0]))
    ax.set_yscale("log")
    ax.set_xticks(
        x + 0.4 - width / 2,
        [f"{i}\n{op}" for i, op in zip(first["index"], first["op"], strict=True)],
        fontsize=7,
    )
    ax.set_ylabel("time per call (us)")
    ax.set_title(f"Step {step}: each collective, traced and replayed/priced")
    ax.legend(fontsize=8)
    return png(
        fig,
        f"Step {step}'s collectives in issue order: traced time (the shortest across "
        "ranks) against each implementation's replay and each link's price",
    )


def replay_sections(run: Run) -> list[str]:
    meta, df = run.meta, run.results
    if df.empty:
        return ["<p>No rows.</p>"]
    steps = df[df["kind"] == "step"]
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in meta.get("notes", []))
    parts = [
        "<h2>Replayed communication</h2>",
        f"<p class='headline'>{_headline(steps)}</p>",
        f"<p>Traces: <code>{html.escape(str(meta.get('trace_dir')))}</code>, "
        f"{meta.get('traced_world_size')} ranks, steps {meta.get('steps')}; replayed on "
        f"{meta.get('world_size')} ranks ({html.escape(str(meta.get('backend')))}). A call's "
        "traced and replayed time is its shortest duration across ranks (the transfer, without "
        "waiting for a late rank; replayed: the median over the passes); priced: the cost "
        "model's alpha-beta time on the link, not run. busbw as nccl-tests defines it.</p>",
    ]
    if notes:
        parts.append(f"<ul>{notes}</ul>")
    for step in sorted(steps["step"].unique()):
        parts.append(step_figure(df, int(step)))
    parts.append(
        html_table(
            df.sort_values(["step", "kind", "index", "source", "impl", "link"]),
            CALL_TABLE,
            "Every call of every step, per source; a step row sums its calls",
            cell_class=lambda r, c: "flag" if c == "wrong" and r.get(c, 0) else "",
        )
    )
    return parts
