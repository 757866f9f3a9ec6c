"""HTML tables of DataFrames: caption, header cells, numbers right-aligned."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd


def html_table(
    df: pd.DataFrame, cols: list[str], caption: str, *, row_class=None, cell_class=None
) -> str:
    """A real table (caption, header cells) of the columns present; numbers right-aligned."""
    cols = [c for c in cols if c in df]
    out = [
        f"<div class='scroll'><table><caption>{html.escape(caption)}</caption><thead><tr>"
        + "".join(f"<th scope='col'>{html.escape(c)}</th>" for c in cols)
        + "</tr></thead><tbody>"
    ]
    for idx, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            cls = cell_class(row, c) if cell_class else ""
            if isinstance(v, float | np.floating):
                text = "" if np.isnan(v) else f"{v:,.3g}" if abs(v) < 1 else f"{v:,.2f}"
                cls += " num"
            else:
                text = html.escape(str(v))
            cells.append(f"<td class='{cls.strip()}'>{text}</td>")
        rc = row_class(idx, row) if row_class else ""
        out.append(f"<tr class='{rc}'>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)
