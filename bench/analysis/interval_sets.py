"""Set algebra on time intervals, vectorised with numpy.

An interval set is an ``(n, 2)`` float array of ``[start, end)`` rows. ``union`` returns the
canonical form (sorted, disjoint, non-empty); the other functions accept any form and normalise
their inputs, so callers never have to remember whether a set is merged.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.zeros((0, 2))


def as_intervals(starts, ends) -> np.ndarray:
    a = np.column_stack([np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)])
    return a.reshape(-1, 2)


def union(iv: np.ndarray) -> np.ndarray:
    """Merge overlapping or touching intervals; drop empty ones."""
    iv = np.asarray(iv, dtype=float).reshape(-1, 2)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if len(iv) == 0:
        return EMPTY.copy()
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    starts, ends = iv[:, 0], np.maximum.accumulate(iv[:, 1])
    # A new run starts where the start lies beyond every end seen so far.
    new_run = np.empty(len(iv), dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > ends[:-1]
    run_id = np.cumsum(new_run) - 1
    out_starts = starts[new_run]
    out_ends = np.zeros(len(out_starts))
    np.maximum.at(out_ends, run_id, ends)
    return np.column_stack([out_starts, out_ends])


def length(iv: np.ndarray) -> float:
    u = union(iv)
    return float((u[:, 1] - u[:, 0]).sum())


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection of two interval sets."""
    a, b = union(a), union(b)
    if len(a) == 0 or len(b) == 0:
        return EMPTY.copy()
    # Walk the merged boundaries: a point is inside both when both coverage counts are 1.
    points = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    delta = np.concatenate([np.ones(len(a)), -np.ones(len(a)), np.ones(len(b)), -np.ones(len(b))])
    order = np.lexsort((delta, points))  # at equal times, ends (-1) before starts (+1)
    points, depth = points[order], np.cumsum(delta[order])
    inside = depth == 2
    starts = points[:-1][inside[:-1]]
    ends = points[1:][inside[:-1]]
    return union(np.column_stack([starts, ends]))


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of ``a`` not covered by ``b``."""
    a = union(a)
    if len(a) == 0:
        return a
    lo, hi = a[:, 0].min(), a[:, 1].max()
    complement_b = _complement(union(b), lo, hi)
    return intersect(a, complement_b)


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    iv = np.asarray(iv, dtype=float).reshape(-1, 2)
    return union(np.column_stack([np.maximum(iv[:, 0], lo), np.minimum(iv[:, 1], hi)]))


def window(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The part of a canonical union ``u`` (sorted, disjoint) inside ``[lo, hi)``, found by
    binary search: O(log n + k), for cutting one long union into many step windows."""
    first = np.searchsorted(u[:, 1], lo, side="right")
    last = np.searchsorted(u[:, 0], hi, side="left")
    part = u[first:last].copy()
    if len(part):
        part[0, 0] = max(part[0, 0], lo)
        part[-1, 1] = min(part[-1, 1], hi)
    return part[part[:, 1] > part[:, 0]]


def _complement(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    if len(u) == 0:
        return np.array([[lo, hi]])
    starts = np.concatenate([[lo], u[:, 1]])
    ends = np.concatenate([u[:, 0], [hi]])
    return union(np.column_stack([starts, ends]))
