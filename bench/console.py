"""What every command line of the suite shares: one-line errors and JSON-ready rows.

Both sides (running, and reading: analysis, report, model) use it; it imports neither.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time

import numpy as np
import pandas as pd

# How long a rank other than 0 waits, on an error every rank meets, for torchrun to end it.
PEER_WAIT_S = 30.0


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr (rank 0's only under torchrun) and a non-zero exit.

    Under torchrun every rank meets the same error, and the first rank to exit makes torchrun
    end the others: had rank 1 left first, rank 0 would be ended before its line was out. So
    the other ranks wait for torchrun to end them once rank 0 has spoken and left; a rank whose
    error rank 0 did not share (another node's folder) says it itself after PEER_WAIT_S.
    """
    rank = int(os.environ.get("RANK", 0))
    if rank != 0:
        time.sleep(PEER_WAIT_S)
    prefix = "error" if rank == 0 else f"error (rank {rank})"
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)
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


# Durations as the command lines take and print them (--budget 10m; "about 32 min left").
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds (positive)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def human_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
