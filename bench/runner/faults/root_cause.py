"""A failed point's one error: the rank whose own error caused the others' timeouts."""

from __future__ import annotations

from bench.hang.calls import comm_failure


def root_cause(errors: list[str | None]) -> str:
    """The first rank's own error beats the timeouts and closed connections it caused on the
    other ranks."""
    found = [(r, e) for r, e in enumerate(errors) if e]
    primary = [(r, e) for r, e in found if not comm_failure(e)]
    rank, err = (primary or found)[0]
    return f"rank {rank}: {err}".replace("\n", " ")[:500]
