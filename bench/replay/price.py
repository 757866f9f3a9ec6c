"""A traced step's collectives priced without running them: on a link (the cost model's presets,
or ``alpha=..,beta=..``: ``bench.model.links``) or with this machine's fitted costs (a
``message_size`` run: ``bench.model.comm``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.model.comm import COLLECTIVES as MODELLED
from bench.model.comm import load_runs
from bench.model.links import LinkCosts, parse_link


def parse_links(values: list[str]) -> list[tuple[str, object]]:
    """(label, costs) of each ``--link``: a comma list of presets, or one ``alpha=..,beta=..``
    (whose own commas are its fields). Raises ValueError with one line."""
    out = []
    for value in values:
        texts = [value] if "=" in value else [v for v in value.split(",") if v.strip()]
        for text in texts:
            link = parse_link(text)
            label = link.name if link.name != "custom" else text.replace(" ", "")
            out.append((label, LinkCosts(link)))
    return out


def fitted(run: Path) -> tuple[str, object]:
    """(label, costs) of a ``message_size`` run's fitted collectives (its native fits)."""
    return f"fitted:{run}", load_runs([run])


def priced_us(costs, op: str, size_bytes: float, n: int) -> tuple[float, str]:
    """(microseconds, why not) of one call."""
    if op not in MODELLED:
        return np.nan, f"not priced: the cost model has no {op}"
    if not np.isfinite(size_bytes):
        return np.nan, "not priced: the trace gives no size for this call"
    try:
        return costs.time(op, float(size_bytes), int(n)) * 1e6, ""
    except ValueError as e:  # a fitted run without this collective
        return np.nan, f"not priced: {e}"
