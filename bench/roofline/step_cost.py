"""What an op costs inside a training step on this host, beyond what a profile's curves give an
op called alone: a fixed cost per op and a factor on the curves' efficiencies
(``profile.StepCost``), fitted to measured steps of a small transformer built here.

An op timed alone in a loop (``measure.py``) pays its dispatch only, on operands hot in the
caches. In a model's step on a CPU it pays besides the modules' Python and autograd's
bookkeeping, and runs on operands just written by other ops, in the layouts backward
transposes; nothing overlaps those costs, so a step priced as its ops alone reads a third to a
half of the measured one. A generic step measures them once per host, for any model:

- a pre-norm transformer (embedding, attention through ``scaled_dot_product_attention``, GELU
  MLP, layer norms, a vocabulary head, cross-entropy, AdamW) of width 32 and one sample, whose
  FLOPs and bytes are a few percent of its time: the rest over its ops (``op_count``'s
  convention, the planner's) is ``op_us``;
- the same at widths and batches where the FLOPs and bytes take most of the step: the factor
  that prices them at their measured time less ``op_us`` per op, least squares on relative
  error over the sizes, is ``1 / efficiency``.

And what an op costs in a trace of such a step recorded with ``record_shapes`` (the profiler's
record beside the dispatch, per operator the op dispatches: ``traced_op_us``), which the
analyses that compare a price with a trace's spans use (``bench.analysis.op_accuracy``): the
median over the overhead step's top-level ops of their span over the operators they hold.

The planner prices a step's ops with them (``bench.plan.op_prices``); the waterfall of a
measured trace does not (its ops' times are measured).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.roofline.op_count import OP_NAME, OpCounter, Record
from bench.roofline.profile import Roofline, StepCost

VOCAB, SEQ, LAYERS, HEADS = 512, 64, 2, 4
OVERHEAD_SIZE = (32, 1)  # (width, samples): a step of ops whose FLOPs and bytes are negligible
FIT_SIZES = ((64, 4), (128, 8), (256, 8))  # steps whose FLOPs and bytes take most of them
WARMUP, TIMED = 2, 7  # steps per size: the fastest timed one counts, as in ``measure.py``


class Block(nn.Module):
    """Pre-norm attention and MLP, GPT-2's layout."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        heads = (
            z.view(b, t, HEADS, w // HEADS).transpose(1, 2)
            for z in self.qkv(self.norm1(x)).split(w, dim=-1)
        )
        att = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@dataclass(frozen=True)
class Measured:
    """One size's step: its fastest seconds, and its ops as counted."""

    seconds: float
    records: tuple[Record, ...]


Step = Callable[[OpCounter | None], None]


def training_step(width: int, batch: int, device: torch.device) -> Step:
    """A step of the transformer at ``width`` over ``batch`` samples; given a counter, it sets
    the counter's phase as it goes."""
    torch.manual_seed(0)
    model = Transformer(width).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=device.type == "cuda")
    ids, targets = (torch.randint(0, VOCAB, (batch, SEQ), device=device) for _ in range(2))

    def step(counter: OpCounter | None = None) -> None:
        def phase(name: str) -> None:
            if counter is not None:
                counter.phase = name

        phase("optimiser")
        opt.zero_grad(set_to_none=True)
        phase("forward")
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        phase("backward")
        loss.backward()
        phase("optimiser")
        opt.step()

    return step


def measured(width: int, batch: int, device: torch.device, sync: Callable[[], None]) -> Measured:
    step = training_step(width, batch, device)
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(TIMED):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    with OpCounter() as counter:
        step(counter)
    return Measured(min(times), tuple(counter.records))


def body_us(roofline: Roofline, records: Iterable[Record]) -> float:
    """The ops' FLOPs or bytes on ``roofline``'s curves, each op's longer, launches left out."""
    return sum(roofline.body_us(flops, nbytes, p)[0] for _, _, p, flops, nbytes in records)


def fit(roofline: Roofline, overhead: Measured, sized: Iterable[Measured]) -> StepCost:
    """``op_us`` from the overhead step (its time less its ops' FLOPs and bytes, per op; at
    least a bare launch), then the factor on the curves that prices the sized steps at their
    time less ``op_us`` per op (least squares on relative error)."""
    left_us = overhead.seconds * 1e6 - body_us(roofline, overhead.records)
    op_us = max(roofline.launch_us, left_us / len(overhead.records))
    num = den = 0.0
    for m in sized:
        t = m.seconds * 1e6
        b = body_us(roofline, m.records) / t
        num += b * (1 - op_us * len(m.records) / t)
        den += b * b
    slower = num / den if den > 0 and num > 0 else 1.0
    return StepCost(op_us=op_us, efficiency=1.0 / slower)


def step_cost(roofline: Roofline, device: torch.device, sync: Callable[[], None]) -> StepCost:
    """This host's ``StepCost`` on ``roofline`` (its curves measured on ``device``)."""
    overhead = measured(*OVERHEAD_SIZE, device, sync)
    return fit(roofline, overhead, [measured(w, b, device, sync) for w, b in FIT_SIZES])


TRACED_STEPS = 3


def _operators(event) -> int:
    """The operators ``event`` dispatched, itself included."""
    return int(OP_NAME.match(event.name) is not None) + sum(
        _operators(c) for c in event.cpu_children
    )


def _outermost(event) -> bool:
    """Whether ``event`` is an operator no operator holds."""
    if OP_NAME.match(event.name) is None:
        return False
    parent = event.cpu_parent
    while parent is not None:
        if OP_NAME.match(parent.name):
            return False
        parent = parent.cpu_parent
    return True


def traced_op_us(device: torch.device) -> float:
    """Microseconds one operator costs in a ``record_shapes`` trace of the overhead step (whose
    FLOPs and bytes are negligible): the median over its outermost operators of their span
    over the operators each dispatched."""
    from torch.profiler import ProfilerActivity, profile

    step = training_step(*OVERHEAD_SIZE, device)
    for _ in range(WARMUP):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(TRACED_STEPS):
            step()
    units = [e for e in p.events() if _outermost(e)]
    return statistics.median(e.time_range.elapsed_us() / _operators(e) for e in units)
