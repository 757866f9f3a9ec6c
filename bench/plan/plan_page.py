"""``plan.html``: the plan as one offline page in the report's style: the recommendation, the
configurations tied with it within the prediction's own error, what each family's best costs
in memory (its parts drawn), and why the best is best (its exposed communication against the
others'), then every row."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from bench.plan.launch import describe
from bench.plan.table import tied
from bench.report.style import CSS
from bench.report.tables import html_table
from bench.runfolder.atomic import write_text

PARTS = ("params", "grads", "optim", "activations", "temporaries", "buffers", "inputs", "other")
COLOURS = ("#4a7", "#7ab", "#c84", "#a6c", "#bbb", "#dd8", "#8ad", "#888")
COLS = [
    "rank",
    "config",
    "activation_checkpointing",
    "precision",
    "micro_batch",
    "grad_accum",
    "peak_mem_gib",
    "fits",
    "step_ms",
    "compute_ms",
    "matmul_ms",
    "memory_bound_ms",
    "op_fixed_ms",
    "comm_ms",
    "exposed_comm_ms",
    "samples_per_s",
    "mfu_pct",
    "error",
    "time_error",
]


def _bars(best: pd.DataFrame, memory_gib: float) -> str:
    """Stacked bars of each row's peak by part, against the device's memory (an inline SVG)."""
    width, row_h = 640, 22
    scale = (width - 260) / max(memory_gib, float(best["peak_mem_gib"].max() or 1))
    out = [
        f"<svg width='{width}' height='{row_h * (len(best) + 2)}' role='img' "
        "aria-label='peak memory per rank by part'>"
    ]
    limit = 250 + memory_gib * scale
    out.append(
        f"<line x1='{limit:.1f}' x2='{limit:.1f}' y1='0' y2='{row_h * len(best)}' "
        "stroke='#b00' stroke-dasharray='4'/>"
    )
    for i, (_, r) in enumerate(best.iterrows()):
        y, x = i * row_h, 250.0
        out.append(f"<text x='0' y='{y + 15}' font-size='12'>{html.escape(r['config'])}</text>")
        for part, colour in zip(PARTS, COLOURS, strict=True):
            w = float(r.get(f"{part}_gib", 0) or 0) * scale
            if w > 0:
                out.append(
                    f"<rect x='{x:.1f}' y='{y + 3}' width='{w:.1f}' height='{row_h - 6}' "
                    f"fill='{colour}'><title>{part}</title></rect>"
                )
                x += w
    legend_y = row_h * len(best) + 16
    for j, (part, colour) in enumerate(zip(PARTS, COLOURS, strict=True)):
        out.append(
            f"<rect x='{j * 90}' y='{legend_y - 10}' width='10' height='10' "
            f"fill='{colour}'/><text x='{j * 90 + 14}' y='{legend_y}' font-size='11'>"
            f"{part}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def page(rows: pd.DataFrame, meta: dict, tie_pct: float) -> str:
    near = tied(rows, tie_pct)
    title = (
        f"Plan: {meta['model']} on {meta['world_size']} x {meta['device']}, "
        f"global batch {meta['global_batch']}"
    )
    body = [f"<h1>{html.escape(title)}</h1>"]
    if near.empty:
        body.append("<p class='headline'>No configuration is predicted to fit and run.</p>")
    else:
        best = near.iloc[0]
        body.append(
            f"<p class='headline'>Recommended: <b>{html.escape(describe(best))}</b>: "
            f"{best['step_ms']:.1f} ms per step, {best['peak_mem_gib']:.2f} GiB peak per rank "
            f"of {meta['device']}'s {rows['device_mem_gib'].iloc[0]:g}; "
            f"<code>{html.escape(best['command'])}</code></p>"
        )
        body.append(f"<h2>Tied with it (within {tie_pct:g} %, the prediction's error)</h2>")
        body.append(
            html_table(
                near,
                COLS[: COLS.index("mfu_pct") + 1],
                f"{len(near)} configurations",
                row_class=lambda i, r: "best" if r["rank"] == best["rank"] else "tied",
            )
        )
        families = rows[rows["fits"] & rows["step_ms"].notna()].groupby("family").head(1)
        body.append("<h2>Why it is best</h2>")
        others = families[families["rank"] != best["rank"]]
        lines = [
            f"{html.escape(describe(r))}: {r['step_ms']:.1f} ms, of it "
            f"{r['exposed_comm_ms']:.1f} ms of communication computation does not hide"
            for _, r in others.iterrows()
        ]
        body.append(
            f"<p>Its step: {best['compute_ms']:.1f} ms of computation{_waterfall(best)} and "
            f"{best['exposed_comm_ms']:.1f} ms of exposed communication (of "
            f"{best['comm_ms']:.1f} ms). The best of each other family:</p><ul>"
            + "".join(f"<li>{x}</li>" for x in lines)
            + "</ul>"
        )
        body.append("<h2>Memory per rank</h2>")
        body.append(
            "<p class='note'>Each family's best, its predicted peak by part; the dashed "
            "line is the device's memory less the allowance.</p>"
        )
        allowance = float(rows["allowance_gib"].iloc[0])
        body.append(_bars(families, float(rows["device_mem_gib"].iloc[0]) - allowance))
    body += _all_rows(rows)
    body += _assumed(meta)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )


def _waterfall(row: pd.Series) -> str:
    """Where the row's computation goes, as its ops price on the roofline ("" where they are
    not priced one by one)."""
    if pd.isna(row.get("matmul_ms")):
        return ""
    return (
        f" ({row['matmul_ms']:.1f} ms in compute-bound ops, {row['memory_bound_ms']:.1f} in "
        f"memory-bound ops, {row['op_fixed_ms']:.1f} in the ops' fixed costs, predicted MFU "
        f"{row['mfu_pct']:.1f} %)"
    )


def _all_rows(rows: pd.DataFrame) -> list[str]:
    """Every row, ranked; those that do not fit marked."""
    body: list[str] = []
    body.append("<h2>Every configuration</h2>")
    body.append(
        html_table(
            rows,
            COLS,
            f"{len(rows)} configurations, ranked",
            cell_class=lambda r, c: "err" if c == "fits" and not r["fits"] else "",
        )
    )
    return body


def _assumed(meta: dict) -> list[str]:
    """The plan's assumptions: links, rates, the allowance."""
    body: list[str] = []
    body.append("<h2>What it assumed</h2><ul>")
    body.append(f"<li>links: {html.escape(str(meta['links']))}</li>")
    for precision, rate in meta.get("rates", {}).items():
        how = "op by op" if "roofline" in rate else f"{rate['tflops']:.3g} TFLOP/s"
        body.append(f"<li>computation {precision}: {how}, {html.escape(rate['source'])}</li>")
    body.append(
        f"<li>memory: tracked under fake tensors with torch's MemTracker, plus "
        f"{meta['allowance_gib']:g} GiB per rank the allocator does not see</li></ul>"
    )
    return body


def write_page(rows: pd.DataFrame, meta: dict, tie_pct: float, path: Path) -> Path:
    return write_text(path, page(rows, meta, tie_pct))
