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

import torch
import torch.distributed as dist

SEGMENT_BYTES = 2 << 20  # pipelining grain of the chain broadcast
# Rings cut each chunk in two segments (pipelining needs two; each more adds a message, which
# costs more than it hides on an oversubscribed CPU), of 2 to 8 MiB. Measured here with gloo
# at 2 and 4 ranks from 4 to 64 MiB, against fixed 1, 2, 4 and 8 MiB segments.
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


def _segments(start: int, stop: int, seg_elems: int) -> list[tuple[int, int]]:
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


def _seg_elems(t: torch.Tensor, segment_bytes: int) -> int:
    return max(1, segment_bytes // t.element_size())


def _ring_seg_elems(t: torch.Tensor, chunk_elems: int, segment_bytes: int | None) -> int:
    """Segment length of a ring: ``segment_bytes`` when given, else half a chunk within
    RING_SEGMENT_MIN .. RING_SEGMENT_MAX."""
    if segment_bytes is None:
        half = chunk_elems * t.element_size() // 2
        segment_bytes = min(max(half, RING_SEGMENT_MIN), RING_SEGMENT_MAX)
    return _seg_elems(t, segment_bytes)


class _Ring:
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


def _pipelined_ring(
    ring: _Ring,
    src: torch.Tensor,
    dst: torch.Tensor,
    bounds: list[int],
    seg: int,
    *,
    reduce: Reduce | None,
    gather: bool,
    divide_by: int | None = None,
) -> None:
    """Ring reduce-scatter (when ``reduce``) then ring all-gather (when ``gather``), pipelined
    segment by segment across steps and across the two phases.

    Reduce-scatter step s sends chunk (r - s - 1) and receives chunk (r - s - 2), which it
    reduces with the local ``src`` chunk into ``dst``; after n - 1 steps ``dst`` chunk r is
    complete (divided by ``divide_by`` if given). All-gather step s sends chunk (r - s) and
    receives chunk (r - s - 1) straight into ``dst``. A segment moves on the moment it is
    ready: reduced segments of the last reduce-scatter step are the first all-gather sends.

    Every receive is posted up front, so no sender ever waits for its peer to ask. That is safe
    although all-gather receives land in chunks this rank is still sending: a chunk can only
    come back after it has gone once round the ring, i.e. after the send left this buffer.
    """
    n, r = ring.n, ring.rank
    ag_tag = 1 << 24  # all-gather tags: distinct from any reduce-scatter tag

    def segs(c: int) -> list[tuple[int, int]]:
        return _segments(bounds[c % n], bounds[c % n + 1], seg)

    rs_recvs: list[list[tuple[dist.Work, torch.Tensor, int, int]]] = []
    if reduce is not None:
        max_chunk = max(bounds[i + 1] - bounds[i] for i in range(n))
        tmp = workspace("ring_recv", (n - 1) * max_chunk, src.dtype, src.device).view(
            n - 1, max_chunk
        )
        for step in range(n - 1):
            lo = bounds[(r - step - 2) % n]
            rs_recvs.append(
                [
                    (
                        ring.recv(tmp[step, a - lo : b - lo], tag=step * 65536 + k),
                        tmp[step, a - lo : b - lo],
                        a,
                        b,
                    )
                    for k, (a, b) in enumerate(segs(r - step - 2))
                ]
            )
        for k, (a, b) in enumerate(segs(r - 1)):
            ring.send(src[a:b], tag=k)
    elif gather:
        for k, (a, b) in enumerate(segs(r)):
            ring.send(dst[a:b], tag=ag_tag + k)
    ag_recvs = []
    if gather:
        for step in range(n - 1):
            for k, (a, b) in enumerate(segs(r - step - 1)):
                ag_recvs.append((step, k, a, b, ring.recv(dst[a:b], tag=ag_tag + step * 65536 + k)))

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
                ring.send(dst[a:b], tag=(step + 1) * 65536 + k)
            else:
                if divide_by is not None:
                    dst[a:b].div_(divide_by)
                if gather:
                    ring.send(dst[a:b], tag=ag_tag + k)
    for step, k, a, b, work in ag_recvs:
        work.wait()
        if step + 1 < n - 1:
            ring.send(dst[a:b], tag=ag_tag + (step + 1) * 65536 + k)
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
    ring = _Ring(group)
    if ring.n == 1 or t.numel() == 0:
        return
    flat = t.view(-1)
    _pipelined_ring(
        ring,
        flat,
        flat,
        chunk_bounds(flat.numel(), ring.n),
        _ring_seg_elems(flat, -(-flat.numel() // ring.n), segment_bytes),
        reduce=_reducer(op),
        gather=True,
        divide_by=ring.n if op == "avg" else None,
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
    ring = _Ring(group)
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
        reduce=_reducer(op),
        gather=False,
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
    ring = _Ring(group)
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
        reduce=None,
        gather=True,
    )


def tree_broadcast(t: torch.Tensor, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Binomial tree from group rank ``src``: in round k, ranks that hold the data send it
    2**k positions further.

    Cost: ceil(log2 n) (alpha + S beta). Latency-optimal: the choice for small messages.
    """
    ring = _Ring(group)
    n = ring.n
    if n == 1 or t.numel() == 0:
        return
    v = (ring.rank - src) % n  # position relative to the root
    mask = 1
    while mask < n:
        if v < mask and v + mask < n:
            ring.send(t, tag=mask, to=(v + mask + src) % n)
        elif mask <= v < 2 * mask:
            ring.recv(t, tag=mask, frm=(v - mask + src) % n).wait()
        mask <<= 1
    ring.finish()


def chain_broadcast(
    t: torch.Tensor,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
    segment_bytes: int = SEGMENT_BYTES,
) -> None:
    """Pipelined chain from ``src`` through the ranks in order: each segment is forwarded as
    soon as it arrives.

    Cost with P segments: (n - 2 + P) (alpha + S/P beta), about S beta for large S: every
    link carries the message once, concurrently, so it is bandwidth-optimal.
    """
    ring = _Ring(group)
    n = ring.n
    if n == 1 or t.numel() == 0:
        return
    flat = t.view(-1)
    pos = (ring.rank - src) % n
    right, left = (ring.rank + 1) % n, (ring.rank - 1) % n
    segs = _segments(0, flat.numel(), _seg_elems(flat, segment_bytes))
    if pos == 0:
        for k, (a, b) in enumerate(segs):
            ring.send(flat[a:b], tag=k, to=right)
    else:
        recvs = [ring.recv(flat[a:b], tag=k, frm=left) for k, (a, b) in enumerate(segs)]
        for k, ((a, b), work) in enumerate(zip(segs, recvs, strict=True)):
            work.wait()
            if pos < n - 1:
                ring.send(flat[a:b], tag=k, to=right)
    ring.finish()


def broadcast(
    t: torch.Tensor,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
    segment_bytes: int = SEGMENT_BYTES,
) -> None:
    """Tree for messages of one segment or less (latency-bound) and for two ranks (where the
    chain is a single hop, and cutting the message only adds per-message cost); pipelined chain
    otherwise (bandwidth-bound)."""
    if t.numel() * t.element_size() <= segment_bytes or dist.get_world_size(group) <= 2:
        tree_broadcast(t, src, group)
    else:
        chain_broadcast(t, src, group, segment_bytes)


def pairwise_all_to_all(
    out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """Block j of ``inp`` goes to rank j; block i of ``out`` comes from rank i.

    Pairwise exchange: in step s = 1 .. n-1 rank r sends to r + s and receives from r - s, so
    each step is a perfect matching and no rank is hit by two senders at once.
    Cost: (n-1) (alpha + S/n beta), S the size of the whole send buffer.
    """
    ring = _Ring(group)
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
