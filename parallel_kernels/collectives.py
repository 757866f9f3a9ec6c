"""One registry: every collective is one row (after nccl-tests' ``struct testColl``).

Sizes follow nccl-tests: ``count`` is the number of elements of the whole buffer S
(all-reduce, broadcast: the buffer; all-gather: the output; reduce-scatter: the input; all-to-all:
the send buffer), so ``S = count * itemsize`` and the per-rank block of the gathering and
scattering collectives is ``count / n`` (``count`` is rounded down to a multiple of n, as
nccl-tests does).

Bus bandwidth (nccl-tests doc/PERFORMANCE.md): algbw = S / t, busbw = algbw * factor(n), with
factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for
broadcast. busbw is what each rank's link must carry, so it can be compared with the link's own
bandwidth whatever n is.

Inputs are small integers stored in floating point, chosen so that every sum, average and
maximum is exact in float32, bfloat16 and float16: the expected output is known exactly, and
``#wrong`` is an exact count of differing elements. Whatever a rank must write starts as
``SENTINEL``, a value no collective produces here, so a missed element is counted.

Out of place and in place (nccl-tests, src/common.cu ``startColl``): out of place, input and
output are separate buffers; in place, they are views of one buffer, rank r's input at
``r * in_offset`` and its output at ``r * out_offset`` elements (nccl-tests' sendInplaceOffset and
recvInplaceOffset): all-reduce and broadcast (0, 0), the same buffer; all-gather (count/n, 0),
the input is the rank's block of the output; reduce-scatter (0, count/n), the output is the
rank's block of the input. nccl-tests has no in-place all-to-all (its alltoall.cu reports none),
nor has this registry: see ``no_in_place``.

torch.distributed's all_reduce and broadcast take one buffer, and so do our ring all-reduce and
broadcast: run out of place, they copy the input into the output and run in place on it. That is
how PyTorch's own out-of-place forms work (c10d's functional ``all_reduce`` and ``broadcast``,
torch/csrc/distributed/c10d/Functional.cpp: the input cloned, then the in-place op), so the
copy is part of what an out-of-place call costs there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel_kernels import algorithms as alg
from parallel_kernels import broadcasts
from parallel_kernels.facts import BUS_FACTORS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}
# Largest integer below which every integer is exact, per dtype (the sweep's dtypes, and the
# others a replayed trace may carry: bench/replay).
_EXACT_LIMIT = {
    torch.float32: 1 << 24,
    torch.bfloat16: 256,
    torch.float16: 2048,
    torch.float64: 1 << 53,
    torch.int64: 1 << 62,
    torch.int32: 1 << 31,
    torch.int16: 1 << 15,
    torch.int8: 1 << 7,
    torch.uint8: 1 << 8,
    torch.float8_e4m3fn: 16,
    torch.float8_e5m2: 8,
}
# The dtypes whose results the registry can check exactly, by torch's names ("float32").
CHECKED_DTYPES = {str(d).removeprefix("torch."): d for d in _EXACT_LIMIT}

Run = Callable[[torch.Tensor, torch.Tensor, str, "dist.ProcessGroup | None"], None]
SENTINEL = -7.0  # what output elements hold before the collective: no pattern value is negative


def _value_range(dtype: torch.dtype, n: int, op: str) -> int:
    """Largest per-rank base value k so that n ranks' sums (of n * k for avg) stay exact."""
    scale = n * n if op == "avg" else n
    return max(1, min(5, _EXACT_LIMIT[dtype] // scale))


def _tile(period: torch.Tensor, count: int) -> torch.Tensor:
    reps = -(-count // max(1, len(period)))
    return period.repeat(reps)[:count]


def base_values(rank: int, start: int, count: int, k: int) -> torch.Tensor:
    """Rank ``rank``'s value at global element indices ``start .. start+count``:
    ``(index + 3 rank) mod k + 1``, in 1..k (built from one period, so it is cheap at any size)."""
    idx = torch.arange(start, start + k, dtype=torch.int64)
    return _tile(((idx + 3 * rank) % k + 1).to(torch.float64), count)


def _reduce_over_ranks(n: int, start: int, count: int, k: int, op: str) -> torch.Tensor:
    # Every rank's pattern has period k, so their reduction does too: reduce one period.
    vals = torch.stack([base_values(r, start, k, k) for r in range(n)])
    period = vals.max(0).values if op == "max" else vals.sum(0)
    return _tile(period, count)


@dataclass(frozen=True, kw_only=True)
class Collective:
    name: str
    ops: tuple[str, ...]  # reductions it takes; ("none",) for pure data movement
    busbw_factor: Callable[[int], float]
    in_count: Callable[[int, int], int]  # (count, n) -> elements of this rank's input
    out_count: Callable[[int, int], int]
    in_place_only: bool  # the API takes one buffer (all-reduce, broadcast)
    # (count, n) -> elements between consecutive ranks' input, and output, views in the one
    # buffer of an in-place call (nccl-tests' sendInplaceOffset, recvInplaceOffset); None: none
    in_place_offsets: Callable[[int, int], tuple[int, int]] | None
    native: Run
    reference: Run
    # (count, dtype, rank, n, op) -> (input as float64, expected output as float64)
    pattern: Callable[[int, torch.dtype, int, int, str], tuple[torch.Tensor, torch.Tensor]]
    needs_multiple_of_n: bool = False
    no_in_place: str = ""  # why there is no in-place form (in_place_offsets is None)

    def align(self, count: int, n: int) -> int:
        return count - count % n if self.needs_multiple_of_n else count

    def size_bytes(self, count: int, dtype: torch.dtype) -> int:
        return count * torch.empty((), dtype=dtype).element_size()

    def buffers(
        self,
        count: int,
        dtype: torch.dtype,
        rank: int,
        n: int,
        op: str,
        device: torch.device,
        in_place: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input, output, expected) on ``device``. ``in_place``: views of one buffer, laid out
        as nccl-tests lays them (see the module docstring); False: two buffers; None: as the
        API takes them (one buffer for all-reduce and broadcast, two for the others)."""
        if in_place is None:
            in_place = self.in_place_only
        inp64, expected64 = self.pattern(count, dtype, rank, n, op)
        n_in, n_out = self.in_count(count, n), self.out_count(count, n)
        # no pattern value is 0 either: unsigned types hold that instead
        sentinel = SENTINEL if dtype.is_signed or dtype.is_floating_point else 0
        if not in_place:
            inp = inp64.to(dtype).to(device)
            out = torch.full((n_out,), sentinel, dtype=dtype, device=device)
        elif self.in_place_offsets is None:
            raise ValueError(f"{self.name} has no in-place form: {self.no_in_place}")
        else:
            in_offset, out_offset = self.in_place_offsets(count, n)
            buf = torch.full((max(n_in, n_out),), sentinel, dtype=dtype, device=device)
            inp = buf[rank * in_offset : rank * in_offset + n_in]
            out = buf[rank * out_offset : rank * out_offset + n_out]
            inp.copy_(inp64.to(dtype))
        return inp, out, expected64.to(dtype).to(device)

    def impl(self, impl: str) -> Run:
        """Implementation ``impl`` (one of ``IMPLS``): PyTorch's own or our reference, as a
        function of (input, output, op, group)."""
        runs = {"native": self.native, "reference": self.reference}
        if impl not in runs:
            raise ValueError(
                f"unknown collective implementation {impl!r} (known: {', '.join(runs)})"
            )
        return runs[impl]

    def run(self, impl: str, inp, out, op: str, group=None) -> None:
        self.impl(impl)(inp, out, op, group)


def count_wrong(out: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements that differ from the exact expected result (NaN counts as wrong)."""
    return int((out != expected).sum().item())


# -- patterns: what each rank holds before, and must hold after ------------------------------
def _all_reduce_pattern(count, dtype, rank, n, op):
    k = _value_range(dtype, n, op)
    mult = n if op == "avg" else 1
    inp = base_values(rank, 0, count, k) * mult
    return inp, _reduce_over_ranks(n, 0, count, k, op)


def _broadcast_pattern(count, dtype, rank, n, op):
    k = _value_range(dtype, n, "none")
    root = base_values(0, 0, count, k)
    # Non-root ranks start with values the root never sends, so a missed byte shows.
    return (root if rank == 0 else torch.full((count,), -7.0, dtype=torch.float64)), root


def _all_gather_pattern(count, dtype, rank, n, op):
    k = _value_range(dtype, n, "none")
    block = count // n
    inp = base_values(rank, rank * block, block, k)
    out = torch.cat([base_values(r, r * block, block, k) for r in range(n)])
    return inp, out


def _reduce_scatter_pattern(count, dtype, rank, n, op):
    k = _value_range(dtype, n, op)
    block = count // n
    mult = n if op == "avg" else 1
    inp = base_values(rank, 0, count, k) * mult
    return inp, _reduce_over_ranks(n, rank * block, block, k, op)


def _all_to_all_pattern(count, dtype, rank, n, op):
    k = _value_range(dtype, n, "none")
    block = count // n
    inp = base_values(rank, 0, count, k)  # block j goes to rank j
    out = torch.cat([base_values(src, rank * block, block, k) for src in range(n)])
    return inp, out


def _into_output(inp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The buffer a one-buffer API runs on: ``out``, holding the input (copied there when the
    call is out of place, as PyTorch's functional all_reduce and broadcast do)."""
    if out.data_ptr() != inp.data_ptr():
        out.copy_(inp)
    return out


# -- native: torch.distributed ---------------------------------------------------------------
def _native_all_reduce(inp, out, op, group):
    dist.all_reduce(_into_output(inp, out), op=OPS[op], group=group)


def _native_broadcast(inp, out, op, group):
    dist.broadcast(_into_output(inp, out), group_src=0, group=group)


def _native_all_gather(inp, out, op, group):
    # all_gather_single is the current name of all_gather_into_tensor (torch >= 2.12)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _native_reduce_scatter(inp, out, op, group):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, op=OPS[op], group=group)


def _native_all_to_all(inp, out, op, group):
    dist.all_to_all_single(out, inp, group=group)


# -- reference: parallel_kernels.algorithms --------------------------------------------------
def _ref_all_reduce(inp, out, op, group):
    alg.ring_all_reduce(_into_output(inp, out), op, group)


def _ref_broadcast(inp, out, op, group):
    broadcasts.broadcast(_into_output(inp, out), 0, group)


def _ref_all_gather(inp, out, op, group):
    alg.ring_all_gather(out, inp, group)


def _ref_reduce_scatter(inp, out, op, group):
    alg.ring_reduce_scatter(out, inp, op, group)


def _ref_all_to_all(inp, out, op, group):
    alg.pairwise_all_to_all(out, inp, group)


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            name="all_reduce",
            ops=("sum", "avg", "max"),
            busbw_factor=BUS_FACTORS["all_reduce"],
            in_count=lambda c, n: c,
            out_count=lambda c, n: c,
            in_place_only=True,
            in_place_offsets=lambda c, n: (0, 0),
            native=_native_all_reduce,
            reference=_ref_all_reduce,
            pattern=_all_reduce_pattern,
        ),
        Collective(
            name="broadcast",
            ops=("none",),
            busbw_factor=BUS_FACTORS["broadcast"],
            in_count=lambda c, n: c,
            out_count=lambda c, n: c,
            in_place_only=True,
            in_place_offsets=lambda c, n: (0, 0),
            native=_native_broadcast,
            reference=_ref_broadcast,
            pattern=_broadcast_pattern,
        ),
        Collective(
            name="all_gather",
            ops=("none",),
            busbw_factor=BUS_FACTORS["all_gather"],
            in_count=lambda c, n: c // n,
            out_count=lambda c, n: c,
            in_place_only=False,
            in_place_offsets=lambda c, n: (c // n, 0),
            native=_native_all_gather,
            reference=_ref_all_gather,
            pattern=_all_gather_pattern,
            needs_multiple_of_n=True,
        ),
        Collective(
            name="reduce_scatter",
            ops=("sum", "avg", "max"),
            busbw_factor=BUS_FACTORS["reduce_scatter"],
            in_count=lambda c, n: c,
            out_count=lambda c, n: c // n,
            in_place_only=False,
            in_place_offsets=lambda c, n: (0, c // n),
            native=_native_reduce_scatter,
            reference=_ref_reduce_scatter,
            pattern=_reduce_scatter_pattern,
            needs_multiple_of_n=True,
        ),
        Collective(
            name="all_to_all",
            ops=("none",),
            busbw_factor=BUS_FACTORS["all_to_all"],
            in_count=lambda c, n: c,
            out_count=lambda c, n: c,
            in_place_only=False,
            in_place_offsets=None,
            native=_native_all_to_all,
            reference=_ref_all_to_all,
            pattern=_all_to_all_pattern,
            needs_multiple_of_n=True,
            # found by running it: gloo's all_to_all_single(x, x) returns without an error
            # and with half of x wrong at 2 ranks; our pairwise exchange would overwrite blocks
            # it has yet to send
            no_in_place="no in-place all-to-all (nccl-tests checks none either): "
            "torch.distributed's all_to_all_single and our pairwise exchange need two buffers",
        ),
    )
}
# The implementations of every collective, each with its one fact: is it PyTorch's own (True) or
# ours, built from point-to-point primitives (False)?
IMPLS = {"native": True, "reference": False}
