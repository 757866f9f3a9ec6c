"""Which rows of a ``message_size`` run give a collective's cost.

Each size is timed out of place and in place, as nccl-tests does (the ``inplace`` column).
torch's all_reduce and broadcast work in place only: their out-of-place rows first copy the
input into the output (as PyTorch's own out-of-place functional all_reduce does), a copy that
NCCL's out-of-place kernels and DDP's buckets never pay. all_gather and reduce_scatter move the
same bytes either way, and all_to_all has no in-place form. So a collective's cost (the cost
model's fit, the report's headline and figure) is read from its in-place rows where it has ok
ones, else from its out-of-place rows; the tables show both.
"""

from __future__ import annotations

import pandas as pd


def in_place(df: pd.DataFrame) -> pd.Series:
    """True for rows timed in place (also as read back from CSV); False where the run has no
    ``inplace`` column (runs before schema 2.2 timed out of place only)."""
    if "inplace" not in df:
        return pd.Series(False, index=df.index)
    return df["inplace"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes"))


def cost_rows(df: pd.DataFrame) -> pd.Series:
    """Per implementation and collective: its in-place rows if any of them is ok, else its
    out-of-place rows."""
    inp = in_place(df)
    if not inp.any():
        return ~inp
    keys = [c for c in ("impl", "collective") if c in df]
    ok_in_place = (inp & (df["status"] == "ok")).groupby([df[k] for k in keys]).transform("any")
    return inp == ok_in_place
