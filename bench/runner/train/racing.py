"""Which candidates keep cycling: the cohort's budget goes where a verdict still needs it.

Interleaved cycles (``cycles.py``) time every live candidate once per cycle. Once a
candidate's comparison with the best is decided at a look (its interval excludes 1 or lies in
the tie band: ``bench.stats.paired``), more of its steps answer nothing, so it leaves the
cycles (a race: Maron and Moore's Hoeffding races, 1994; Birattari's F-race, 2002) and the
cycles left cost less, so those still undecided get more of them within the same seconds.
Its verdict stays at the confidence of the look that decided it; its samples are its first
cycles, still paired cycle for cycle with the best's.

When half of the cohort's budget is spent (``HEADLINE_SHARE``), what is left goes to the
answer a user reads first: per group, the best and the default (whose cost over the best the
headline states), or, where the default is the best or already decided, the closest
undecided challenger; the other undecided candidates leave with their intervals as they
stand (reported as tied). The groups are the verdicts': each implementation's candidates (and a
grid's second value), or those whose points name one ``verdict_group`` (a plan's
verification: configurations of several implementations, compared with each other). Every
rank decides from the same all-reduced step times, so they all keep the same candidates.
"""

from __future__ import annotations

from bench.runner.train.row import point_columns
from bench.stats.paired import DECIDED, PairedVerdict, look_confidence, versus_best_paired

HEADLINE_SHARE = 0.5  # of the cohort's budget (seconds or steps) before the headline's turn


def _groups(alive: list) -> list[list]:
    """The live candidates by verdict group, in their order."""
    groups: dict[tuple, list] = {}
    for c in alive:
        key = (c.point.verdict_group,)
        if not c.point.verdict_group:
            key = (c.point.impl, str(point_columns(c.point)["value2"]))
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def _verdict(group: list, active: list, n: int, band_pct: float) -> PairedVerdict:
    """The group's cycling candidates compared at interim look ``n``, Bonferroni over all of
    the group's comparisons (those decided before included: one joint statement)."""
    return versus_best_paired(
        {c.point.id: c.times for c in active},
        look_confidence(n, early=True),
        band_pct,
        comparisons=len(group) - 1,
    )


def at_look(alive: list, n: int, band_pct: float) -> int:
    """At interim look ``n``: candidates whose comparison is decided leave (``stop`` =
    decided), and a group with none undecided leaves whole. The comparisons still undecided."""
    undecided = 0
    for group in _groups(alive):
        active = [c for c in group if c.active]
        if len(active) < 2:
            _leave(active, DECIDED)
            continue
        v = _verdict(group, active, n, band_pct)
        undecided += len(v.undecided)
        keep = set(v.undecided) | {v.best} if v.undecided else set()
        _leave([c for c in active if c.point.id not in keep], DECIDED)
    return undecided


def headline(alive: list, n: int, band_pct: float, stop: str) -> None:
    """Half the budget spent: per group, the best and the default keep cycling (or the best
    and its closest undecided challenger); the others leave, their share spent (``stop``)."""
    for group in _groups(alive):
        active = [c for c in group if c.active]
        if len(active) <= 2:
            continue
        v = _verdict(group, active, n, band_pct)
        by_id = {c.point.id: c for c in active}
        default = next((c for c in active if c.point.is_default), None)
        if default is not None and default.point.id != v.best:
            other = default
        else:
            rest = [k for k in v.undecided if k != v.best] or [k for k in v.ratios]
            other = by_id[min(rest, key=lambda k: v.ratios[k].ratio)]
        _leave([c for c in active if c.point.id not in (v.best, other.point.id)], stop)


def _leave(cands: list, stop: str) -> None:
    for c in cands:
        c.active = False
        c.stop = stop


def finish(alive: list, stop: str) -> None:
    """The cycles ended (``stop``): the candidates still in them leave."""
    _leave([c for c in alive if c.active], stop)
