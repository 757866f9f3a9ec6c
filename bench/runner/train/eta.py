"""How long a sweep will take, forecast from its first visits, and its time budget
(``--budget``).

A visit's wall time (build, warm-up, the check against the plain model, timed steps, the traced
steps on the first visit) is what the sweep is made of. Each point's own visits say its cost;
a point not yet visited is costed as the mean of those that were, and a later round of a point
as its last round did (a first visit also traces, so it is dearer than the ones after it). An
interleaved candidate not yet run is costed as the others' untimed seconds plus its share of
its cohort's cycles budget: an upper bound, since cycles stop when their verdicts are decided.
A cohort's candidates get ``max_point_s`` seconds of timed steps each, and what the cohorts
before it left unspent (quick steps end on their step count first: slower ones get their
seconds, and the sweep's timed seconds stay within its candidates' sum).

The budget is shared out so that every point is measured before any point is measured again:
the first round runs whole (a point never visited has no answer at all), and a later round's
visit runs only if what it is expected to take still fits. What is left over is split over the
visits left, capping each one's timed seconds, so that the rounds still to come all get theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.console import human_duration


@dataclass(frozen=True)
class Allowance:
    """What the budget allows a visit: whether it runs, and its timed seconds' cap (None: no
    cap beyond the point's own budget)."""

    runs: bool
    timed_cap_s: float | None


@dataclass
class SweepClock:
    """The visits of a sweep, in order ((point id, round) pairs), what each one took, and the
    sweep's budget shared out over them: the ``--budget`` (``budget_s``) and the cohorts' timed
    seconds (``max_point_s`` per candidate)."""

    visits: list[tuple[str, int]]
    budget_s: float | None = None
    cohorts: list[list[str]] = field(default_factory=list)  # their candidates' ids, in order
    max_point_s: float = 0.0
    spent: dict[tuple[str, int], float] = field(default_factory=dict)
    # seconds of each visit that were not timed steps (build, warm-up, check, traces)
    overhead: dict[tuple[str, int], float] = field(default_factory=dict)
    # point -> the seconds of timed steps its budget allows, where that is known before it
    # runs (an interleaved candidate: its share of its cohort's cycles, which may stop sooner)
    timed_bound: dict[str, float] = field(init=False)
    # seconds of timed steps the cohorts so far left to the next
    unspent: float = field(default=0.0, init=False)
    forecast_made: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.timed_bound = {p: self.max_point_s for c in self.cohorts for p in c}

    def done(self, point: str, r: int, seconds: float, timed_s: float = 0.0) -> None:
        self.spent[(point, r)] = seconds
        self.overhead[(point, r)] = max(0.0, seconds - timed_s)

    def elapsed(self) -> float:
        return sum(self.spent.values())

    def expected(self, point: str, r: int) -> float | None:
        """What visit (point, r) should take: the point's latest visit (its first visit
        traces, so a later round costs as the last one did), else the mean first visit of the
        points visited; None before any visit."""
        mine = [s for (p, q), s in self.spent.items() if p == point and q < r]
        if mine:
            return mine[-1]
        firsts = [v for v in self.spent if v[1] == 1] or list(self.spent)
        if not firsts:
            return None
        if point in self.timed_bound:  # what the others cost besides timing, and its bound
            fixed = sum(self.overhead[v] for v in firsts) / len(firsts)
            return fixed + self.timed_bound[point]
        return sum(self.spent[v] for v in firsts) / len(firsts)

    def left(self) -> float | None:
        """Seconds the visits not yet made should take (None before any visit)."""
        todo = [v for v in self.visits if v not in self.spent]
        guesses = [self.expected(p, r) for p, r in todo]
        if any(g is None for g in guesses):
            return None
        return float(sum(guesses))

    def fits(self, point: str, r: int) -> bool:
        """Whether visit (point, r) runs under the budget: every first-round visit does; a
        later one if what it should take fits in what is left."""
        if self.budget_s is None or r == 1:
            return True
        guess = self.expected(point, r) or 0.0
        return self.elapsed() + guess <= self.budget_s

    def timed_cap(self, point: str, r: int) -> float | None:
        """Seconds visit (point, r) may spend on timed steps under the budget: its share of
        what is left (split over the visits left) less what the visit costs besides timing,
        as the point's last visit (or the mean visit) did. None: no budget."""
        if self.budget_s is None:
            return None
        todo = [v for v in self.visits if v not in self.spent]
        share = (self.budget_s - self.elapsed()) / max(1, len(todo))
        mine = [s for (p, q), s in self.overhead.items() if p == point and q < r]
        every = list(self.overhead.values())
        fixed = mine[-1] if mine else (sum(every) / len(every) if every else 0.0)
        return max(0.0, share - fixed)

    def allowance(self, point: str, r: int) -> Allowance:
        """What the budget allows visit (point, r) (``fits``, ``timed_cap``)."""
        return Allowance(self.fits(point, r), self.timed_cap(point, r))

    def not_run(self, point: str, r: int) -> None:
        """Visit (point, r) does not fit the budget: it leaves the sweep's visits."""
        self.visits.remove((point, r))

    def cohort_seconds(self, i: int) -> float:
        """Cohort ``i``'s (from 0) seconds of timed steps: ``max_point_s`` per candidate and
        what the cohorts before it left unspent, within the budget's caps where it has them."""
        ids = self.cohorts[i]
        max_s = len(ids) * self.max_point_s + self.unspent
        caps = [self.timed_cap(p, 1) for p in ids]
        if caps and all(cap is not None for cap in caps):
            max_s = min(max_s, sum(caps))
        return max_s

    def cohort_done(self, i: int, max_s: float, timed_s: float) -> None:
        """Cohort ``i`` spent ``timed_s`` of its ``max_s`` seconds of timed steps (the same on
        every rank: the steps' times are agreed); the next cohort gets what is left, and the
        forecast knows who gets it."""
        self.unspent = max(0.0, max_s - timed_s)
        if i + 1 < len(self.cohorts):
            after = self.cohorts[i + 1]
            for p in after:
                self.timed_bound[p] += self.unspent / len(after)

    def forecast(self) -> str | None:
        """After the first visit (or cohort), once: how long the whole sweep should take, where
        visits are left; None otherwise."""
        if self.forecast_made:
            return None
        self.forecast_made = True
        if len(self.visits) <= len(self.spent):
            return None
        total = self.elapsed() + (self.left() or 0.0)
        text = f"sweep: about {human_duration(total)} in all ({len(self.visits)} visits"
        text += f", the first {human_duration(self.elapsed())}, tracing included)"
        if self.budget_s is not None and total > self.budget_s:
            text += (
                f"; the budget, {human_duration(self.budget_s)}, drops the later rounds' visits "
                "that no longer fit"
            )
        return text
