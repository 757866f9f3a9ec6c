"""Alpha-beta(-gamma) costs of collectives, fitted to a ``--sweep message_size`` run.

Hockney's model: a message of m bytes costs alpha + m beta; a reduction costs gamma per byte.
For a buffer of S bytes (nccl-tests' S: the whole buffer) on n ranks, the algorithms' costs are
(Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 2005; Chan et al., "Collective communication: theory, practice, and experience", 2007):

    ring all-reduce          2(n-1) alpha + 2(n-1)/n S beta + (n-1)/n S gamma
    ring reduce-scatter       (n-1) alpha +  (n-1)/n S beta + (n-1)/n S gamma
    ring all-gather           (n-1) alpha +  (n-1)/n S beta
    pairwise all-to-all       (n-1) alpha +  (n-1)/n S beta
    binomial-tree broadcast   ceil(log2 n) (alpha + S beta)
    double-binary-tree all-reduce (NCCL's "tree", what-if only)
                              2 ceil(log2 n) alpha + 2 S beta + S gamma

In the ring algorithms gamma's coefficient is proportional to beta's at every n, so timings of
one algorithm cannot tell them apart; nor need they: t = a(n) alpha + b(n) S beta_eff with
beta_eff = beta + gamma g(n)/b(n) extrapolates over n exactly as the three-term form does. Each
collective's fit therefore has alpha and beta_eff; gamma, the reduction's own cost per byte, is
derived across collectives (all-reduce's beta_eff less all-gather's, times 2) and reported.

The fit itself, its intervals and its quality: ``fitting.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.console import human_bytes
from bench.model.errors import FitError
from bench.model.fitting import (
    fit_relative,
    interval,
    r2_log,
    refit_intervals,
)
from bench.model.runs import read_collectives_runs
from bench.runfolder.placement import cost_rows

__all__ = ["FitError"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    a: Callable[[int], float]  # coefficient of alpha
    b: Callable[[int], float]  # coefficient of S beta
    g: Callable[[int], float]  # coefficient of S gamma

    def time(self, nbytes: float, n: int, alpha: float, beta: float, gamma: float = 0.0) -> float:
        if n <= 1:
            return 0.0
        return self.a(n) * alpha + nbytes * (self.b(n) * beta + self.g(n) * gamma)


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


RING_ALL_REDUCE = Algorithm(
    "ring", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n, lambda n: (n - 1) / n
)
TREE_ALL_REDUCE = Algorithm(
    "double binary tree", lambda n: 2 * _log2(n), lambda n: 2.0, lambda n: 1.0
)
RING_REDUCE_SCATTER = Algorithm(
    "ring", lambda n: n - 1, lambda n: (n - 1) / n, lambda n: (n - 1) / n
)
RING_ALL_GATHER = Algorithm("ring", lambda n: n - 1, lambda n: (n - 1) / n, lambda n: 0.0)
PAIRWISE_ALL_TO_ALL = Algorithm("pairwise", lambda n: n - 1, lambda n: (n - 1) / n, lambda n: 0.0)
TREE_BROADCAST = Algorithm("binomial tree", _log2, lambda n: float(_log2(n)), lambda n: 0.0)
RING_BROADCAST = Algorithm("pipelined ring", lambda n: n - 1, lambda n: 1.0, lambda n: 0.0)

# The algorithm each backend runs. gloo: ring all-reduce (its default), binomial-tree broadcast;
# NCCL: rings, pipelined ring broadcast, and for all-reduce the faster of ring and tree (what
# its tuner chooses between). Our reference collectives (parallel_kernels/algorithms.py) are
# rings, a pairwise all-to-all and a tree/chain broadcast; their fits use the same forms.
ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "gloo": {
        "all_reduce": RING_ALL_REDUCE,
        "reduce_scatter": RING_REDUCE_SCATTER,
        "all_gather": RING_ALL_GATHER,
        "all_to_all": PAIRWISE_ALL_TO_ALL,
        "broadcast": TREE_BROADCAST,
    },
    "nccl": {
        "all_reduce": RING_ALL_REDUCE,
        "reduce_scatter": RING_REDUCE_SCATTER,
        "all_gather": RING_ALL_GATHER,
        "all_to_all": PAIRWISE_ALL_TO_ALL,
        "broadcast": RING_BROADCAST,
    },
}
COLLECTIVES = tuple(ALGORITHMS["gloo"])
# The algorithms a backend's tuner also chooses from, per collective (NCCL: all-reduce by ring or
# double binary tree, whichever is faster at the size); a link's cost is the fastest of them.
ALTERNATIVES: dict[str, dict[str, tuple[Algorithm, ...]]] = {
    "nccl": {"all_reduce": (TREE_ALL_REDUCE,)},
}


def algorithm(backend: str, collective: str) -> Algorithm:
    return ALGORITHMS.get(backend, ALGORITHMS["nccl"])[collective]


@dataclass(frozen=True)
class Fit:
    """t(S, n) = a(n) alpha + b(n) S beta for one collective (times in seconds)."""

    backend: str
    impl: str
    collective: str
    algorithm: Algorithm
    alpha: float  # s
    beta: float  # s/byte (beta_eff: includes the reduction, see the module docstring)
    r2_log: float  # R^2 of log time, every size (outliers too)
    residuals: pd.DataFrame = field(repr=False)  # world_size, size_bytes, measured/predicted
    # (RESAMPLES, 2): alpha, beta refitted to each bootstrap resample; None without samples
    replicates: np.ndarray | None = field(default=None, repr=False)

    def time(self, nbytes: float, n: int) -> float:
        return self.algorithm.time(nbytes, n, self.alpha, self.beta)

    def time_interval(self, nbytes: float, n: int) -> tuple[float, float]:
        """The time's 95 % interval over the bootstrap's (alpha, beta) pairs; NaN without."""
        if self.replicates is None:
            return math.nan, math.nan
        alpha, beta = self.replicates.T
        times = np.broadcast_to(self.algorithm.time(nbytes, n, alpha, beta), alpha.shape)
        return interval(times, self.time(nbytes, n))

    @property
    def alpha_interval(self) -> tuple[float, float]:
        return interval(None if self.replicates is None else self.replicates[:, 0], self.alpha)

    @property
    def beta_interval(self) -> tuple[float, float]:
        return interval(None if self.replicates is None else self.replicates[:, 1], self.beta)

    @property
    def bandwidth_GBps(self) -> float:
        return 1e-9 / self.beta if self.beta > 0 else math.inf

    @property
    def max_abs_residual_pct(self) -> float:
        """Over the sizes fitted; those set aside are in ``outlier_residuals``."""
        kept = self.residuals[~self.residuals["outlier"]]
        return float(kept["residual_pct"].abs().max())

    @property
    def outliers(self) -> int:
        return int(self.residuals["outlier"].sum())

    @property
    def outlier_residuals(self) -> str:
        """The sizes set aside and the fit's residual at each ("64 KiB -88 %"; with the world
        size when the fit is over several)."""
        out = self.residuals[self.residuals["outlier"]]
        several = self.residuals["world_size"].nunique() > 1
        return ", ".join(
            f"{human_bytes(int(r.size_bytes))}{f' at {r.world_size} ranks' * several} "
            f"{r.residual_pct:+.0f} %"
            for r in out.itertuples()
        )


def fit_collective(rows: pd.DataFrame, *, backend: str, impl: str, collective: str) -> Fit:
    """Least-squares alpha, beta from rows with ``world_size``, ``size_bytes`` and ``time_us``
    (one collective, one implementation), relative residuals weighted equally, and their
    bootstrap from ``samples_ms`` (each row's timed iterations, where the rows have them).

    Robust to a scheduling hiccup: sizes far off the first fit are set aside and the fit is
    made again (``_fit``); they stay in the residual table, marked ``outlier``, and in R^2."""
    algo = algorithm(backend, collective)
    n = rows["world_size"].to_numpy(int)
    s = rows["size_bytes"].to_numpy(float)
    t = rows["time_us"].to_numpy(float) * 1e-6
    if len(rows) < 2 or len(np.unique(s)) < 2:
        raise FitError(f"{collective} ({impl}): need two sizes or more to fit, have {len(rows)}")
    X = np.column_stack([[algo.a(k) for k in n], [algo.b(k) for k in n] * s])
    coef, keep = fit_relative(X, t, s)
    samples = list(rows["samples_ms"]) if "samples_ms" in rows else [None] * len(rows)
    alpha, beta = coef
    pred = X @ coef
    residuals = pd.DataFrame(
        {
            "world_size": n,
            "size_bytes": s.astype(np.int64),
            "measured_us": t * 1e6,
            "predicted_us": pred * 1e6,
            "residual_pct": 100.0 * (pred / t - 1.0),
            "outlier": ~keep,
        }
    )
    return Fit(
        backend,
        impl,
        collective,
        algo,
        float(alpha),
        float(beta),
        r2_log(t, pred),
        residuals,
        refit_intervals(X, t, s, samples),
    )


@dataclass
class CommModel:
    """Fitted costs by (implementation, collective), from one backend and machine: one fit over
    every world size measured (for other world sizes), and one per world size when several were
    measured (used at that size: oversubscribed CPUs add latency the algorithm's n alone does
    not explain; docs/benchmarks.md, "Collectives")."""

    backend: str
    host: str
    world_sizes: tuple[int, ...]
    fits: dict[tuple[str, str], Fit]
    source: str = ""
    per_size: dict[tuple[str, str, int], Fit] = field(default_factory=dict)

    def fit(self, collective: str, impl: str = "native", n: int | None = None) -> Fit:
        if (impl, collective, n) in self.per_size:
            return self.per_size[impl, collective, n]
        try:
            return self.fits[impl, collective]
        except KeyError:
            have = sorted({c for (i, c) in self.fits if i == impl})
            raise FitError(
                f"the collectives run {self.source} has no {impl} {collective} "
                f"(it has: {', '.join(have) or 'none'}); run --sweep message_size with it"
            ) from None

    def time(self, collective: str, nbytes: float, n: int, impl: str = "native") -> float:
        """Seconds for ``collective`` of ``nbytes`` (nccl-tests' S) on ``n`` ranks."""
        return self.fit(collective, impl, n).time(nbytes, n)

    def interval_ends(self) -> tuple[CostsAtEnd, CostsAtEnd] | None:
        """The costs with every collective at the low, and at the high, end of its 95 %
        interval; None unless every fit has one (a run without samples.csv)."""
        if any(f.replicates is None for _, f in self.all_fits()):
            return None
        return CostsAtEnd(self, 0), CostsAtEnd(self, 1)

    @property
    def gamma(self) -> float | None:
        """The reduction's cost per byte, s/byte: 2 (beta_eff(all-reduce) - beta(all-gather)),
        from the native fits, or None without both."""
        ar, ag = self.fits.get(("native", "all_reduce")), self.fits.get(("native", "all_gather"))
        if ar is None or ag is None:
            return None
        return max(0.0, 2.0 * (ar.beta - ag.beta))

    def all_fits(self) -> list[tuple[str, Fit]]:
        """(world sizes it is over, fit): the joint fits, then those per world size."""
        every = ",".join(map(str, self.world_sizes))
        return [(every, f) for f in self.fits.values()] + [
            (str(n), f) for (_, _, n), f in self.per_size.items()
        ]

    def table(self) -> pd.DataFrame:
        """One row per fit: alpha (us) and beta (ns/B) with their 95 % intervals, bandwidth,
        R^2 of log time, the worst residual of the sizes fitted and the sizes set aside with
        theirs; ``ranks`` says which world sizes the fit is over."""
        rows = []
        for ranks, f in self.all_fits():
            (a_lo, a_hi), (b_lo, b_hi) = f.alpha_interval, f.beta_interval
            rows.append(
                {
                    "ranks": ranks,
                    "impl": f.impl,
                    "collective": f.collective,
                    "algorithm": f.algorithm.name,
                    "alpha_us": f.alpha * 1e6,
                    "alpha_us_low": a_lo * 1e6,
                    "alpha_us_high": a_hi * 1e6,
                    "beta_ns_per_B": f.beta * 1e9,
                    "beta_ns_per_B_low": b_lo * 1e9,
                    "beta_ns_per_B_high": b_hi * 1e9,
                    "bandwidth_GBps": f.bandwidth_GBps,
                    "r2_log": f.r2_log,
                    "sizes": len(f.residuals),
                    "max_abs_residual_pct": f.max_abs_residual_pct,
                    "outliers": f.outliers,
                    "outlier_residuals": f.outlier_residuals,
                }
            )
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class CostsAtEnd:
    """A ``CommModel``'s costs with every collective at one end of its 95 % interval (0: low,
    1: high): what a what-if's range is simulated with."""

    model: CommModel
    end: int

    def time(self, collective: str, nbytes: float, n: int, impl: str = "native") -> float:
        return self.model.fit(collective, impl, n).time_interval(nbytes, n)[self.end]

    def interval_ends(self) -> None:
        return None


def fit_rows(df: pd.DataFrame, *, backend: str, host: str = "", source: str = "") -> CommModel:
    """Fit every (implementation, collective) in a message_size results table, on the ok rows
    that give its cost (in place where it has that form: ``runfolder.placement``)."""
    ok = df[(df["status"] == "ok") & df["time_us"].notna() & cost_rows(df)]
    if ok.empty:
        raise FitError(f"the collectives run {source} has no ok rows to fit")
    fits, per_size = {}, {}
    sizes = tuple(sorted(int(n) for n in ok["world_size"].unique()))
    for (impl, coll), rows in ok.groupby(["impl", "collective"], sort=True):
        if coll not in ALGORITHMS["gloo"]:
            continue
        fits[impl, coll] = fit_collective(rows, backend=backend, impl=impl, collective=coll)
        if len(sizes) > 1:
            for n, at_n in rows.groupby("world_size"):
                per_size[impl, coll, int(n)] = fit_collective(
                    at_n, backend=backend, impl=impl, collective=coll
                )
    return CommModel(
        backend=backend, host=host, world_sizes=sizes, fits=fits, source=source, per_size=per_size
    )


def load_runs(run_dirs: list[Path]) -> CommModel:
    """Fit one model from one or more message_size runs of the same backend and machine (for
    instance 2 and 4 ranks)."""
    meta, df = read_collectives_runs(run_dirs)
    src = ", ".join(str(p) for p in run_dirs)
    return fit_rows(df, backend=meta["backend"], host=meta.get("host", ""), source=src)
