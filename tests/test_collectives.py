"""Reference collectives against native ones and the exact expected result, at n = 2, 3, 4."""

import pytest
import torch
import torch.distributed as dist

from parallel_kernels import algorithms as alg
from parallel_kernels.collectives import COLLECTIVES, DTYPES, count_wrong

CPU = torch.device("cpu")


def sizes(coll, n):
    """Empty, one element, odd, and a few MB (several 1 MiB pipelining segments)."""
    unit = n if coll.needs_multiple_of_n else 1
    return sorted({0, unit, unit * 333, coll.align(3 * 2**20 // 2 + 7, n)})


def collectives_worker() -> list[tuple]:
    n, rank = dist.get_world_size(), dist.get_rank()
    seen = []
    for coll in COLLECTIVES.values():
        for dtype_name, dtype in DTYPES.items():
            for op in coll.ops:
                for count in sizes(coll, n):
                    outs = {}
                    for impl in ("reference", "native"):
                        inp, out, expected = coll.buffers(count, dtype, rank, n, op, CPU)
                        try:
                            coll.run(impl, inp, out, op)
                        except (RuntimeError, ValueError) as e:
                            seen.append((coll.name, dtype_name, op, count, impl, f"error: {e}"))
                            continue
                        wrong = count_wrong(out, expected)
                        seen.append((coll.name, dtype_name, op, count, impl, wrong))
                        torch.testing.assert_close(out, expected, rtol=0, atol=0)
                        outs[impl] = out
                    if len(outs) == 2:
                        torch.testing.assert_close(
                            outs["reference"], outs["native"], rtol=0, atol=0
                        )
    return seen


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_reference_collectives_are_exact(pool, world):
    per_rank = pool(world).run(collectives_worker)
    for seen in per_rank:
        reference = [s for s in seen if s[4] == "reference"]
        assert reference and all(s[5] == 0 for s in reference), [s for s in reference if s[5]]
        native_errors = [s for s in seen if s[4] == "native" and s[5] != 0]
        # gloo runs every native collective here except where it says it cannot
        assert all(str(s[5]).startswith("error:") for s in native_errors), native_errors


def small_segments_worker() -> None:
    """Many tiny pipelining segments and uneven chunks: the ring bookkeeping under stress."""
    n, rank = dist.get_world_size(), dist.get_rank()
    for count in (1, n - 1, 10_007):
        t = torch.arange(count, dtype=torch.float32) + rank
        alg.ring_all_reduce(t, "sum", segment_bytes=64)
        expected = n * torch.arange(count, dtype=torch.float32) + sum(range(n))
        torch.testing.assert_close(t, expected)
        b = torch.arange(count, dtype=torch.float32) if rank == 2 % n else torch.zeros(count)
        alg.chain_broadcast(b, src=2 % n, segment_bytes=64)
        torch.testing.assert_close(b, torch.arange(count, dtype=torch.float32))
        b = torch.arange(count, dtype=torch.float32) if rank == 1 else torch.zeros(count)
        alg.tree_broadcast(b, src=1)
        torch.testing.assert_close(b, torch.arange(count, dtype=torch.float32))
    block = 1001
    inp = torch.arange(n * block, dtype=torch.float32) * (rank + 1)
    out = torch.empty(block)
    alg.ring_reduce_scatter(out, inp, "max", segment_bytes=100)
    torch.testing.assert_close(
        out, n * torch.arange(rank * block, (rank + 1) * block, dtype=torch.float32)
    )
    gathered = torch.empty(n * block)
    alg.ring_all_gather(gathered, torch.full((block,), float(rank)), segment_bytes=100)
    torch.testing.assert_close(gathered, torch.arange(n).repeat_interleave(block).float())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [3, 4])
def test_pipelined_rings_with_tiny_segments(pool, world):
    pool(world).run(small_segments_worker)


def test_a_corrupted_result_is_counted():
    coll = COLLECTIVES["all_reduce"]
    _, out, expected = coll.buffers(1000, torch.bfloat16, 0, 4, "sum", CPU)
    out.copy_(expected)
    assert count_wrong(out, expected) == 0
    out[[3, 500, 999]] += 1
    out[7] = float("nan")
    assert count_wrong(out, expected) == 4


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_expected_results_are_exact_in_every_dtype(dtype, n):
    for coll in COLLECTIVES.values():
        for op in coll.ops:
            count = coll.align(999, n)
            _, _, expected = coll.buffers(count, dtype, 0, n, op, CPU)
            _, exact = coll.pattern(count, dtype, 0, n, op)
            assert torch.equal(expected.double(), exact), (coll.name, op)


def test_chunk_bounds_cover_everything_evenly():
    for numel in (0, 1, 5, 1001):
        for parts in (1, 2, 3, 4, 7):
            b = alg.chunk_bounds(numel, parts)
            sizes_ = [b[i + 1] - b[i] for i in range(parts)]
            assert b[0] == 0 and b[-1] == numel and max(sizes_) - min(sizes_) <= 1
