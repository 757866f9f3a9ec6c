"""Reference broadcasts on point-to-point ``isend``/``irecv``: a binomial tree for small
messages, a pipelined chain for large ones (cost model and sources: ``algorithms.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_kernels.algorithms import Ring, seg_elems, segments

SEGMENT_BYTES = 2 << 20  # pipelining grain of the chain broadcast


def tree_broadcast(t: torch.Tensor, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Binomial tree from group rank ``src``: in round k, ranks that hold the data send it
    2**k positions further.

    Cost: ceil(log2 n) (alpha + S beta). Latency-optimal: the choice for small messages.
    """
    ring = Ring(group)
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
    ring = Ring(group)
    n = ring.n
    if n == 1 or t.numel() == 0:
        return
    flat = t.view(-1)
    pos = (ring.rank - src) % n
    right, left = (ring.rank + 1) % n, (ring.rank - 1) % n
    segs = segments(0, flat.numel(), seg_elems(flat, segment_bytes))
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
