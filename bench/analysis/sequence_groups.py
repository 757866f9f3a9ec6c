"""Which process group a gloo trace's calls ran in, where the job's groups tell."""

from __future__ import annotations

import pandas as pd


def span(ranks: list[int]) -> str:
    """0, 2-5, 9: a list of ranks in few characters."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def gloo_group(
    calls: pd.DataFrame, traces: list, ranks: list[int], world: int, notes: list
) -> pd.DataFrame:
    """gloo traces do not name a call's group. Where the ranks traced are exactly the members
    of one of the job's groups (``distributedInfo``'s ``pg_config``) and not the whole job (a
    point of this suite's world-size sweep runs on part of it), the calls are taken to be in
    that group; otherwise each stays on every rank of the job."""
    unknown = ~calls["group_known"]
    traced = tuple(sorted(ranks))
    if not unknown.any() or len(traced) == world:
        return calls
    groups = [
        (str(g.get("pg_name")), tuple(sorted(g.get("ranks") or ())))
        for t in traces
        for g in t.dist_info.get("pg_config") or ()
    ]
    match = next((name for name, members in groups if members == traced), None)
    if match is None:
        return calls
    calls = calls.copy()
    calls.loc[unknown, "group"] = match
    calls.loc[unknown, "group_size"] = len(traced)
    calls["group_ranks"] = [
        traced if u else r for u, r in zip(unknown, calls["group_ranks"], strict=True)
    ]
    notes.append(
        f"gloo traces do not name the group: the ranks traced ({span(ranks)}) are "
        f"exactly group {match} of the job's {world}, taken as every call's group"
    )
    return calls
