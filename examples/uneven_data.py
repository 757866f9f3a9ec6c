"""The classic hang of uneven data, and its two fixes, for ``python -m bench.hang``.

Each rank trains DDP on its own shard of a dataset of 9 samples, in batches of 2. Shards taken
with a stride and no padding or dropping (``--fix none``) give rank 0 five samples (3 batches)
and rank 1 four (2 batches): rank 0 runs a third step whose all-reduce rank 1 never joins, while
rank 1 waits at the barrier after its loop. Both time out; the flight-recorder dumps say which
rank ran the extra step:

    TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/tmp/uneven/fr_rank \\
        torchrun --nproc_per_node=2 examples/uneven_data.py --fix none
    python -m bench.hang /tmp/uneven

``--fix drop_last``: ``DistributedSampler(drop_last=True)`` gives every rank 4 samples.
``--fix join``: DDP's ``Join`` context shadows the finished rank's collectives.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for bench

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from bench.runner.faults.flight import record_hangs

SAMPLES, BATCH, DIM = 9, 2, 8


def loader(fix: str, rank: int, world: int) -> DataLoader:
    data = TensorDataset(torch.randn(SAMPLES, DIM), torch.randn(SAMPLES, 1))
    if fix == "drop_last":
        sampler = DistributedSampler(data, world, rank, shuffle=False, drop_last=True)
        return DataLoader(data, batch_size=BATCH, sampler=sampler)
    return DataLoader(Subset(data, range(rank, SAMPLES, world)), batch_size=BATCH)  # uneven


def train(fix: str, rank: int, world: int) -> int:
    """This rank's training loop, on a default process group already initialised (``main``'s,
    or that of ranks a caller already holds): its number of steps."""
    torch.manual_seed(0)  # every rank the same dataset and model
    model = DDP(torch.nn.Linear(DIM, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    with Join([model], enable=fix == "join"):
        for x, y in loader(fix, rank, world):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
    dist.barrier()  # every rank done before (say) rank 0 saves a checkpoint
    print(f"rank {rank}: {steps} steps, done", flush=True)
    # DDP holds the group in reference cycles: freed only by the interpreter's last collection,
    # the group's gloo threads would drop their finished work (tensors) with the interpreter
    # gone, and the rank aborts ("terminate called without an active exception") after its
    # work. Freed here, the group goes with the caller's destroy_process_group.
    del model, opt
    gc.collect()
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fix", choices=("none", "drop_last", "join"), default="none")
    p.add_argument("--timeout-s", type=float, default=10.0)
    args = p.parse_args()
    record_hangs()  # before init_process_group: the recorder on, dumps when a rank fails
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    train(args.fix, dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
