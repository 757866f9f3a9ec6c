"""What ``torch.compile`` (inductor) makes of a step's ops, as the planner counts them: the
memory-bound ops inside a compiled region fused, chain by chain, into one kernel each.

The rule (``fused``), on the ops counted at dispatch (``bench.roofline.op_count``, with their
data flow): a memory-bound op (one without FLOPs: elementwise, normalisation, a reduction, a
copy) joins the chain of each memory-bound op of the same region and phase whose output it
reads; chains it links are one. A chain is one kernel: one launch, moving the bytes of what it
reads from outside it (each value once) and of what it writes that is used outside it, or by
no op counted (a gradient, a value kept for backward is read there). Matmuls, convolutions and
attention are left as they are, and ops outside any region (the loss, the optimiser) too.

The regions (``compiled_regions``): ``blocks``, each repeated block's forward, and its backward
(from the gradient of its output arriving to that of its input), as ``compile=blocks``
compiles each block; ``model``, the model's whole forward and whole backward. Inductor fuses
more than this (a matmul's epilogue, a reduction into its consumer's loop) and sometimes less
(a chain it splits where a reduction's shape changes): the rule counts what a chain of
elementwise ops saves, the bulk of it in a transformer's step (docs/roofline.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from bench.roofline.op_count import Flow, OpCounter, Record
from parallel_kernels.compiling import BLOCKS, MODEL
from parallel_kernels.workload import repeated_blocks

FUSED = "inductor fused"  # a chain's op name in a mix


def fused(records: list[Record], flows: list[Flow]) -> tuple[Record, ...]:
    """``records`` with each chain of memory-bound ops in a region one record (at its first
    op's place): no FLOPs, the chain's bytes (the module's docstring)."""
    chain = list(range(len(records)))  # union-find over the records

    def root(i: int) -> int:
        while chain[i] != i:
            chain[i] = chain[chain[i]]
            i = chain[i]
        return i

    producer: dict[int, int] = {}
    for i, (r, f) in enumerate(zip(records, flows, strict=True)):
        if _fusible(r, f):
            for value, _ in f.reads:
                p = producer.get(value)
                if (
                    p is not None
                    and _fusible(records[p], flows[p])
                    and _alike(r, f, records[p], flows[p])
                ):
                    chain[root(p)] = root(i)
        for value, _ in f.writes:
            producer[value] = i
    readers: dict[int, set[int]] = {}
    for i, f in enumerate(flows):
        for value, _ in f.reads:
            readers.setdefault(value, set()).add(root(i))
    members: dict[int, list[int]] = {}
    for i in range(len(records)):
        members.setdefault(root(i), []).append(i)
    out = []
    for i, r in enumerate(records):
        group = members[root(i)]
        if len(group) == 1:
            out.append(r)
        elif group[0] == i:
            out.append((r[0], FUSED, r[2], 0.0, _chain_bytes(group, flows, readers, root(i))))
    return tuple(out)


def _fusible(r: Record, f: Flow) -> bool:
    return f.region is not None and r[3] == 0.0


def _alike(a: Record, fa: Flow, b: Record, fb: Flow) -> bool:
    """Same phase and same region: one compiled graph."""
    return a[0] == b[0] and fa.region == fb.region


def _chain_bytes(group: list[int], flows: list[Flow], readers: dict, me: int) -> float:
    """What a chain moves: each value it reads from outside it once, and each it writes that an
    op outside it reads, or none does."""
    written = {v for i in group for v, _ in flows[i].writes}
    read: dict[int, float] = {}
    for i in group:
        for v, nbytes in flows[i].reads:
            if v not in written:
                read[v] = max(read.get(v, 0.0), nbytes)
    out = 0.0
    for i in group:
        for v, nbytes in flows[i].writes:
            if readers.get(v, set()) - {me} or v not in readers:
                out += nbytes
    return sum(read.values()) + out


@contextlib.contextmanager
def compiled_regions(model: nn.Module, mode: str, counter: OpCounter) -> Iterator[None]:
    """``counter.region`` set while ``model``'s compiled parts run (``mode``: the ``compile``
    knob's): forward hooks on each block (``blocks``) or the model (``model``) around its
    forward, and hooks on its output's and input's gradients around its backward. Off: no
    region."""
    parts = {BLOCKS: list(repeated_blocks(model)), MODEL: [model]}.get(mode, [])
    handles = []
    for n, part in enumerate(parts):
        handles.append(part.register_forward_pre_hook(_entered(counter, n), with_kwargs=True))
        handles.append(part.register_forward_hook(_left(counter, n), with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        counter.region = None


def _first_grad_tensor(tree) -> torch.Tensor | None:
    return next(
        (t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad), None
    )


def _entered(counter: OpCounter, n: int):
    def hook(module, args, kwargs):
        counter.region = n
        given = _first_grad_tensor((args, kwargs))
        if given is not None:  # its gradient computed: the part's backward is done
            given.register_hook(lambda grad: _set(counter, None, n))

    return hook


def _left(counter: OpCounter, n: int):
    def hook(module, args, kwargs, output):
        counter.region = None
        made = _first_grad_tensor(output)
        if made is not None:  # its gradient arrives: the part's backward starts
            made.register_hook(lambda grad: _set(counter, n))

    return hook


def _set(counter: OpCounter, region, leaving: object = None) -> None:
    """The region now ``region``; ``leaving``: only where the counter is in that one (the
    gradient a part's input shares with the part before's output may reach its hooks in
    either order)."""
    if leaving is None or counter.region == leaving:
        counter.region = region
