"""CPU (gloo) traces whose answer is known: a rank made slower on purpose must come out as the
straggler, and the other rank as the one waiting for it."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.profiler import record_function

from bench.analysis import trace_folder as trace_folder
from bench.runner.measure.profiling import profile_steps
from bench.runner.train.data import Batches
from parallel_kernels.models import MODELS, build_model
from parallel_kernels.strategies import STRATEGIES

pytestmark = pytest.mark.ranks

CPU = torch.device("cpu")


def delayed_rank_worker(trace_dir: str, slow_rank: int) -> str:
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = MODELS["mlp"]
    model = STRATEGIES["ddp"].apply(
        "reference", build_model("mlp"), group=None, device=CPU, bucket_cap_mb=25.0
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = Batches(
        spec.dataset(64 * world * 4, 0), batch_size=64, rank=rank, world_size=world, device=CPU
    )
    a = torch.randn(512, 512)

    def step():
        x, y = next(batches)
        opt.zero_grad()
        loss = spec.loss(model(x), y)
        # about 120 ms of extra computation on one rank only (30 ms was within what load
        # beside the test makes one step of the other rank late by)
        if rank == slow_rank:
            with record_function("injected_compute"):
                for _ in range(48):
                    a.mm(a)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    path, _ = profile_steps(
        step,
        trace_dir=Path(trace_dir),
        worker_name=f"rank{rank}",
        device=CPU,
        wait=1,
        warmup=1,
        active=3,
    )
    return str(path)


@pytest.mark.timeout(180)
def test_a_slowed_rank_is_the_straggler_and_the_other_waits(pool, tmp_path):
    pool(2).run(delayed_rank_worker, str(tmp_path), 1)
    tables = trace_folder.analyse(trace_folder.load_trace_dir(tmp_path))
    stragglers = tables["stragglers"]
    assert len(stragglers) == 3
    assert (stragglers["slowest_rank"] == 1).all(), stragglers
    # rank 0 sat in its all-reduce while rank 1 computed: most of the injected time
    assert (stragglers["others_wait_us"] > 10_000).all(), stragglers
    assert (stragglers["slowest_wait_us"] < stragglers["others_wait_us"] / 3).all()
    assert (stragglers["compute_skew_us"] > 10_000).all()
    coll = tables["collectives"].set_index("rank")
    assert coll.loc[0, "wait_us"] > 3 * coll.loc[1, "wait_us"]
    ranks = tables["ranks"].set_index("rank")
    assert ranks["device"].tolist() == ["cpu", "cpu"] and ranks["gpu_util_pct"].isna().all()
    assert (ranks["cpu_busy_pct"] > 0).all()
