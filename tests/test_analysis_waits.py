"""CPU (gloo) traces: time the main thread spends blocked on a collective is waiting, not
computation, however the code that blocks is named. Here a module calls ``dist.all_reduce``
inside its own autograd Function, a case no list of names knew: rank 1 computes 30 ms more
before the collective, so rank 0 sits blocked inside the Function's span for that long."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bench.analysis import breakdown as analysis
from bench.runner.measure.profiling import profile_steps

pytestmark = pytest.mark.ranks

CPU = torch.device("cpu")


class SumInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class SumInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


def blocking_function_worker(trace_dir: str, where: str) -> tuple[str, dict]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 128)
    fn = SumInForward if where == "forward" else SumInBackward
    a = torch.randn(512, 512)

    def slow() -> None:  # about 30 ms of computation, on rank 1 only
        if rank == 1:
            for _ in range(12):
                a.mm(a)

    def step() -> None:
        x = torch.randn(16, 128)
        if where == "forward":
            slow()
        y = fn.apply(lin(x))
        loss = y.square().mean()
        if where == "backward":
            slow()
        loss.backward()

    for _ in range(2):
        step()
    path, _ = profile_steps(
        step, trace_dir=Path(trace_dir), worker_name=f"rank{rank}", device=CPU, active=3
    )
    return str(path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_blocking_inside_an_autograd_function_is_waiting(pool, tmp_path, where):
    paths = pool(2).run(blocking_function_worker, str(tmp_path), where)
    steps = analysis.breakdown(analysis.load_trace(paths[0]))
    assert len(steps) == 3
    # rank 0 waited in the collective while rank 1 computed: most of the injected 30 ms
    assert (steps["comm_us"] > 10_000).all(), steps
    # ... and computed nothing meanwhile: its blocked time is exposed communication, not
    # computation overlapping it (the Function's span covers the wait: counted as
    # computation, this was ~100 % overlap)
    assert (steps["overlap_us"] < 0.05 * steps["comm_us"]).all(), steps
    assert (steps["exposed_comm_us"] > 0.95 * steps["comm_us"]).all(), steps
    assert (steps["compute_us"] < steps["comm_us"] / 3).all(), steps
    # rank 1 did not wait: its collective is short and its computation is the injected time
    slow = analysis.breakdown(analysis.load_trace(paths[1]))
    assert (slow["compute_us"] > 10_000).all() and (slow["comm_us"] < steps["comm_us"]).all()
