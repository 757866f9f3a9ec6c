"""What every command line of the suite shares: one-line errors and JSON-ready rows.

Both sides (running, and reading: analysis, report, model) use it; it imports neither.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pandas as pd


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr (rank 0 only under torchrun) and a non-zero exit."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: NaN as None, numpy scalars as Python ones."""
    out = []
    for rec in df.to_dict(orient="records"):
        out.append({k: _plain(v) for k, v in rec.items()})
    return out


def _plain(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.item() if isinstance(v, np.generic) else v


def human_bytes(n: float) -> str:
    """A size in binary units, as nccl-tests and the tables print it ("64 KiB", "1.5 MiB")."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)
