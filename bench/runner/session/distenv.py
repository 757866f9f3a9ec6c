"""Who and where this rank is: backend and device picked from the machine, not from flags.

With CUDA available each rank takes GPU ``local_rank`` and NCCL; otherwise gloo on the CPU.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bench.console import fail
from bench.runner.faults import flight

__all__ = ["fail"]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    host: str
    nnodes: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


def pick_backend(requested: str = "auto") -> tuple[str, str]:
    """(backend, device type): NCCL on CUDA when GPUs are present, else gloo on CPU;
    ``gloo-cuda``: gloo with CUDA tensors, so that several ranks can share one GPU (NCCL
    refuses two ranks on one device; gloo runs all-reduce and broadcast on CUDA tensors, so
    DDP works, not FSDP's reduce-scatter)."""
    if requested == "auto":
        return ("nccl", "cuda") if torch.cuda.is_available() else ("gloo", "cpu")
    if requested in ("nccl", "gloo-cuda") and not torch.cuda.is_available():
        raise ValueError(f"backend {requested} needs CUDA, and torch sees no GPU here")
    if requested == "gloo-cuda":
        return "gloo", "cuda"
    return (requested, "cuda" if requested == "nccl" else "cpu")


def init_distributed(*, backend: str = "auto", timeout_s: float = 300.0) -> DistEnv:
    """Initialise the default process group from torchrun's environment."""
    backend, device_type = pick_backend(backend)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG"):
        dist.set_debug_level_from_env()  # --debug: collective mismatches raise
    if not dist.is_initialized():
        flight.enable()  # every point's collectives recorded, for bench.hang
        dist.init_process_group(
            backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    # Nodes are counted by torchrun's node rank (GROUP_RANK), not by host name: two nodes
    # may share a name (containers, network namespaces on one machine).
    host = socket.gethostname()
    node = os.environ.get("GROUP_RANK", host)
    nodes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    return DistEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        backend=backend,
        device=device,
        host=host,
        nnodes=len(set(nodes)),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank0_print(*args, **kwargs) -> None:
    """Print on global rank 0 only (or when no process group exists), flushed at once."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)
