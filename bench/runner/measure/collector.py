"""Python's garbage collector kept out of the measurements' way.

A full collection walks every object the process tracks (after torch, the suite and a point's
lazy imports, hundreds of thousands), and a point asks for several (before its memory baseline,
after the check against the plain model, when it ends); the collector's own full collections
can also come during a timed step. Objects alive when a point starts (modules, the run's state)
are not the point's garbage: ``settled()`` collects once and sets them aside in CPython's
permanent generation (``gc.freeze``), so that the point's own collections walk only what the
point made, and gives them back to the collector when the point ends (``gc.unfreeze``), so that
nothing set aside escapes collection past it. Inside ``for_the_run()`` (a sweep, a cohort's
rounds, a test's batch of points) they are given back when the run ends instead: each point's
first collection then walks only what the points before it left, not everything again, and
what a run keeps alive from one point to the next is the run's own long-lived state. The FLOP
counter's first use imports torch._dynamo, whose objects every later collection would walk
again: ``prepare`` imports it before the block's collection. The measurements behind both:
docs/benchmarks.md, "Measured time" and "make test's time".
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_depth = 0  # settled() blocks open: only the outermost collects and freezes
_runs = 0  # for_the_run() blocks open: the objects set aside stay so until the outermost ends


@contextmanager
def settled(prepare: Callable[[], None] | None = None) -> Iterator[None]:
    """Collect now, then keep what is alive out of every collection until the block ends.
    ``prepare`` runs first: the imports the block would make lazily (the FLOP counter's
    torch._dynamo, some 200 thousand objects) are then set aside with the rest, not walked by
    each of the block's collections."""
    global _depth
    if _depth == 0:
        if prepare is not None:
            prepare()
        gc.collect()
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        _give_back()


@contextmanager
def for_the_run() -> Iterator[None]:
    """The points of one run share what their ``settled()`` blocks set aside, given back to the
    collector when this block ends."""
    global _runs
    _runs += 1
    try:
        yield
    finally:
        _runs -= 1
        _give_back()


def _give_back() -> None:
    """What was set aside goes back to the collector once no block holds it."""
    if _depth == 0 and _runs == 0:
        gc.unfreeze()
