"""Reference collective algorithms built only on point-to-point ``isend``/``irecv``.

Cost model (alpha-beta, Hockney): sending m bytes between two ranks costs alpha + m * beta;
gamma is the per-byte cost of the reduction arithmetic. n is the group size and S the size in
bytes of the whole buffer as nccl-tests counts it (see ``collectives.py``). The formulas are the
standard ones (Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 2005; Chan et al., "Collective communication: theory, practice,
and experience", 2007).

Large messages are cut into segments that travel as separate messages, and each ring step is
pipelined: the receives of the next step are posted before the current one is reduced, and a
segment is forwarded as soon as it is reduced, so the transport's thread moves segment k+1 while
this thread adds segment k. Every message carries a tag unique within the collective, so
matching never depends on arrival order. Send handles are kept until they complete (a dropped
gloo send handle can stall its peer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Rings cut each chunk in two segments (pipelining needs two; each more adds a message, which
# costs more than it hides on an oversubscribed CPU), of 2 to 8 MiB (docs/benchmarks.md,
# "Collectives").
RING_SEGMENT_MIN, RING_SEGMENT_MAX = 2 << 20, 8 << 20

Reduce = Callable[[torch.Tensor, torch.Tensor], None]  # acc <- acc (op) incoming


def _reducer(op: str) -> Reduce:
    if op in ("sum", "avg"):
        return lambda acc, inc: acc.add_(inc)
    if op == "max":
        return lambda acc, inc: torch.maximum(acc, inc, out=acc)
    raise ValueError(f"unsupported reduction {op!r}")


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """``parts + 1`` offsets splitting ``numel`` as evenly as possible (first chunks larger)."""
    base, extra = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def segments(start: int, stop: int, seg_elems: int) -> list[tuple[int, int]]:
    if stop <= start:
        return []
    return [(s, min(s + seg_elems, stop)) for s in range(start, stop, seg_elems)]


_WORKSPACE: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def workspace(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch buffer kept between calls, as NCCL keeps its buffers: allocating (and so
    page-faulting) tens of MB per call would be measured as communication time."""
    key = (name, dtype, device)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def seg_elems(t: torch.Tensor, segment_bytes: int) -> int:
    return max(1, segment_bytes // t.element_size())


def _ring_seg_elems(t: torch.Tensor, chunk_elems: int, segment_bytes: int | None) -> int:
    """Segment length of a ring: ``segment_bytes`` when given, else half a chunk within
    RING_SEGMENT_MIN .. RING_SEGMENT_MAX."""
    if segment_bytes is None:
        half = chunk_elems * t.element_size() // 2
        segment_bytes = min(max(half, RING_SEGMENT_MIN), RING_SEGMENT_MAX)
    return seg_elems(t, segment_bytes)


class Ring:
    """Ring neighbours within a group and tagged point-to-point helpers."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.right = (self.rank + 1) % self.n
        self.left = (self.rank - 1) % self.n
        self.sends: list[dist.Work] = []

    def send(self, t: torch.Tensor, tag: int, to: int | None = None) -> None:
        dst = self.right if to is None else to
        self.sends.append(dist.isend(t, group_dst=dst, group=self.group, tag=tag))

    def recv(self, t: torch.Tensor, tag: int, frm: int | None = None) -> dist.Work:
        src = self.left if frm is None else frm
        return dist.irecv(t, group_src=src, group=self.group, tag=tag)

    def finish(self) -> None:
        for w in self.sends:
            w.wait()
        self.sends.clear()


_AG_TAG = 1 << 24  # all-gather tags: distinct from any reduce-scatter tag
_STEP_TAG = 65536  # tag stride of a ring step: segment k of step s has tag s * _STEP_TAG + k

_Segments = Callable[[int], list[tuple[int, int]]]  # chunk index (mod n) -> its segments
_Recv = tuple[dist.Work, torch.Tensor, int, int]  # (receive, landing buffer, start, stop)


@dataclass(frozen=True)
class _Phases:
    """What a pipelined ring does: a reduce-scatter with ``reduce`` (None: none), then an
    all-gather (``gather``); each rank's reduced chunk divided by ``divide_by`` (an average)."""

    reduce: Reduce | None
    gather: bool
    divide_by: int | None = None


def _post_reduce_scatter(
    ring: Ring, src: torch.Tensor, bounds: list[int], segs: _Segments
) -> list[list[_Recv]]:
    """Post every reduce-scatter receive (per step, into a workspace row), then send the first
    step's segments of ``src``; the receives per step."""
    n, r = ring.n, ring.rank
    max_chunk = max(bounds[i + 1] - bounds[i] for i in range(n))
    tmp = workspace("ring_recv", (n - 1) * max_chunk, src.dtype, src.device).view(n - 1, max_chunk)
    rs_recvs: list[list[_Recv]] = []
    for step in range(n - 1):
        lo = bounds[(r - step - 2) % n]
        rs_recvs.append(
            [
                (
                    ring.recv(tmp[step, a - lo : b - lo], tag=step * _STEP_TAG + k),
                    tmp[step, a - lo : b - lo],
                    a,
                    b,
                )
                for k, (a, b) in enumerate(segs(r - step - 2))
            ]
        )
    for k, (a, b) in enumerate(segs(r - 1)):
        ring.send(src[a:b], tag=k)
    return rs_recvs


def _reduce_scatter_steps(
    ring: Ring, src: torch.Tensor, dst: torch.Tensor, rs_recvs: list[list[_Recv]], phases: _Phases
) -> None:
    """Reduce each received segment into ``dst`` and forward it at once: to the next step, or
    after the last step (divided by ``divide_by``) as the first all-gather send."""
    n = ring.n
    reduce, gather, divide_by = phases.reduce, phases.gather, phases.divide_by
    for step, recvs in enumerate(rs_recvs):
        last = step == n - 2
        for k, (work, incoming, a, b) in enumerate(recvs):
            work.wait()
            if dst is src:
                reduce(dst[a:b], incoming)
            else:
                dst[a:b].copy_(src[a:b])
                reduce(dst[a:b], incoming)
            if not last:
                ring.send(dst[a:b], tag=(step + 1) * _STEP_TAG + k)
            else:
                if divide_by is not None:
                    dst[a:b].div_(divide_by)
                if gather:
                    ring.send(dst[a:b], tag=_AG_TAG + k)


def _pipelined_ring(
    ring: Ring, src: torch.Tensor, dst: torch.Tensor, bounds: list[int], seg: int, phases: _Phases
) -> None:
    """Ring reduce-scatter (when ``phases.reduce``) then ring all-gather (when
    ``phases.gather``), pipelined segment by segment across steps and across the two phases.

    Reduce-scatter step s sends chunk (r - s - 1) and receives chunk (r - s - 2), which it
    reduces with the local ``src`` chunk into ``dst``; after n - 1 steps ``dst`` chunk r is
    complete (divided by ``phases.divide_by`` if given). All-gather step s sends chunk (r - s) and
    receives chunk (r - s - 1) straight into ``dst``. A segment moves on the moment it is
    ready: reduced segments of the last reduce-scatter step are the first all-gather sends.

    Every receive is posted up front, so no sender ever waits for its peer to ask. That is safe
    although all-gather receives land in chunks this rank is still sending: a chunk can only
    come back after it has gone once round the ring, i.e. after the send left this buffer.
    """
    n, r = ring.n, ring.rank
    gather = phases.gather

    def segs(c: int) -> list[tuple[int, int]]:
        return segments(bounds[c % n], bounds[c % n + 1], seg)

    rs_recvs: list[list[_Recv]] = []
    if phases.reduce is not None:
        rs_recvs = _post_reduce_scatter(ring, src, bounds, segs)
    elif gather:
        for k, (a, b) in enumerate(segs(r)):
            ring.send(dst[a:b], tag=_AG_TAG + k)
    ag_recvs = []
    if gather:
        for step in range(n - 1):
            for k, (a, b) in enumerate(segs(r - step - 1)):
                tag = _AG_TAG + step * _STEP_TAG + k
                ag_recvs.append((step, k, a, b, ring.recv(dst[a:b], tag=tag)))

    if phases.reduce is not None:
        _reduce_scatter_steps(ring, src, dst, rs_recvs, phases)
    for step, k, a, b, work in ag_recvs:
        work.wait()
        if step + 1 < n - 1:
            ring.send(dst[a:b], tag=_AG_TAG + (step + 1) * _STEP_TAG + k)
    ring.finish()


def ring_all_reduce(
    t: torch.Tensor,
    op: str = "sum",
    group: dist.ProcessGroup | None = None,
    segment_bytes: int | None = None,
) -> None:
    """In-place all-reduce: ring reduce-scatter, then ring all-gather (bandwidth-optimal).

    Cost: 2(n-1) alpha + 2 (n-1)/n S beta + (n-1)/n S gamma; each rank sends and receives
    2 (n-1)/n S bytes, the lower bound for all-reduce, so busbw = algbw * 2(n-1)/n compares it
    with the link. Works for any n and any element count (chunks differ by at most one).
    """
    ring = Ring(group)
    if ring.n == 1 or t.numel() == 0:
        return
    flat = t.view(-1)
    _pipelined_ring(
        ring,
        flat,
        flat,
        chunk_bounds(flat.numel(), ring.n),
        _ring_seg_elems(flat, -(-flat.numel() // ring.n), segment_bytes),
        _Phases(reduce=_reducer(op), gather=True, divide_by=ring.n if op == "avg" else None),
    )


def ring_reduce_scatter(
    out: torch.Tensor,
    inp: torch.Tensor,
    op: str = "sum",
    group: dist.ProcessGroup | None = None,
    segment_bytes: int | None = None,
) -> None:
    """``out`` (count) <- reduction over ranks of block r of ``inp`` (n * count).

    Cost: (n-1) alpha + (n-1)/n S beta + (n-1)/n S gamma, S = n * count * itemsize: half of
    an all-reduce. ``inp`` is not modified; partial sums live in a working buffer.
    """
    ring = Ring(group)
    n = ring.n
    count = out.numel()
    if inp.numel() != n * count:
        raise ValueError(f"input has {inp.numel()} elements, expected {n} x {count}")
    src = inp.reshape(-1)
    if n == 1 or count == 0:
        out.view(-1).copy_(src[:count])
        if op == "avg" and count:
            out.div_(n)
        return
    work = workspace("reduce_scatter", src.numel(), src.dtype, src.device)
    bounds = [i * count for i in range(n + 1)]
    _pipelined_ring(
        ring,
        src,
        work,
        bounds,
        _ring_seg_elems(src, count, segment_bytes),
        _Phases(reduce=_reducer(op), gather=False),
    )
    mine = work[ring.rank * count : (ring.rank + 1) * count]
    out.view(-1).copy_(mine)
    if op == "avg":
        out.div_(n)


def ring_all_gather(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    segment_bytes: int | None = None,
) -> None:
    """``out`` (n * count) <- every rank's ``inp`` (count), in rank order.

    Cost: (n-1) alpha + (n-1)/n S beta, S = n * count * itemsize (the output).
    """
    ring = Ring(group)
    count = inp.numel()
    if out.numel() != ring.n * count:
        raise ValueError(f"output has {out.numel()} elements, expected {ring.n} x {count}")
    flat = out.view(-1)
    flat[ring.rank * count : (ring.rank + 1) * count].copy_(inp.reshape(-1))
    if ring.n == 1 or count == 0:
        return
    bounds = [i * count for i in range(ring.n + 1)]
    _pipelined_ring(
        ring,
        flat,
        flat,
        bounds,
        _ring_seg_elems(flat, count, segment_bytes),
        _Phases(reduce=None, gather=True),
    )


def pairwise_all_to_all(
    out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """Block j of ``inp`` goes to rank j; block i of ``out`` comes from rank i.

    Pairwise exchange: in step s = 1 .. n-1 rank r sends to r + s and receives from r - s, so
    each step is a perfect matching and no rank is hit by two senders at once.
    Cost: (n-1) (alpha + S/n beta), S the size of the whole send buffer.
    """
    ring = Ring(group)
    n, r = ring.n, ring.rank
    if inp.numel() % n or out.numel() != inp.numel():
        raise ValueError(f"all-to-all needs equal buffers divisible by {n}")
    src_blocks, dst_blocks = inp.reshape(n, -1), out.view(n, -1)
    dst_blocks[r].copy_(src_blocks[r])
    if n == 1 or inp.numel() == 0:
        return
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        recv = ring.recv(dst_blocks[frm], tag=s, frm=frm)
        ring.send(src_blocks[to], tag=s, to=to)
        recv.wait()
        ring.finish()
