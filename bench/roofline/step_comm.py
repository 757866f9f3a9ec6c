"""What a data-parallel step on this host pays for its collectives against the same collectives
alone: a factor measured once per host in two processes, for the planner's CPU plans made
without a calibration launch.

On a CPU whose cores the ranks share, a DDP step's all-reduce costs two to six times what the
same all-reduce costs alone, which the collectives sweep, timing each collective alone, cannot
see (docs/benchmarks.md, "The planner on the roofline"). Two processes on gloo step the step
costs' transformer (``step_cost.Transformer``) under DDP and under ``no_sync`` (no all-reduce),
and all-reduce its gradients alone, at three widths, alternating round by round: the step's
all-reduce is DDP's step less its ``no_sync`` twin, and ``factor`` is their sum over the widths
over the all-reduces' alone (the larger widths weigh most, where the figure alone is steadiest).
A plan made with a calibration launch does not use it: the launch measures the steps
themselves. ``bench/selftime/ddp_in_step.py`` prints the figures per width.
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from bench.roofline.measure import cache_file_name
from bench.roofline.step_cost import SEQ, VOCAB, Transformer
from bench.runfolder import atomic

WIDTHS = (64, 128, 256)
WARMUP = 3
CACHE_DIR = Path.home() / ".cache" / "parallel-bench" / "step-comm"


@dataclass(frozen=True)
class Timing:
    batch: int = 8  # samples a rank a step
    rounds: int = 2  # rounds the three figures alternate over
    steps: int = 15  # timed calls a figure a round


@dataclass(frozen=True)
class StepComm:
    """The factor and what it was measured from: per width, the step's all-reduce and the
    all-reduce alone, ms."""

    factor: float
    in_step_ms: tuple[float, ...]
    alone_ms: tuple[float, ...]
    widths: tuple[int, ...]
    source: str  # where it was measured, or read from

    def describe(self) -> str:
        return f"collectives x{self.factor:.2f} as a 2-rank DDP step pays them here ({self.source})"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], steps: int, device: torch.device, barrier: bool) -> float:
    """``fn``'s median time over ``steps`` calls after ``WARMUP``, each from a barrier where
    ``barrier`` (the ranks start together)."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(steps):
        if barrier:
            dist.barrier()
        _synchronize(device)
        t0 = time.perf_counter()
        fn()
        _synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def training_step(model: torch.nn.Module, device: torch.device, batch: int, sync: Callable):
    """A step of ``model`` (the transformer, or DDP of it) with AdamW, its forward and backward
    under ``sync()`` (DDP's ``no_sync``, or nothing)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=device.type == "cuda")
    ids = torch.randint(0, VOCAB, (batch, SEQ), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with sync():
            F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        opt.step()

    return step


def in_group(width: int, timing: Timing, device: torch.device) -> dict[str, float]:
    """In the default process group: DDP's step, its ``no_sync`` twin and the all-reduce of its
    gradients alone, medians over the rounds, ms; and the gradients' MB."""
    torch.manual_seed(0)
    plain = Transformer(width).to(device)
    grads = torch.zeros(sum(p.numel() for p in plain.parameters()), device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(plain)
    calls = {
        "ddp_ms": training_step(ddp, device, timing.batch, contextlib.nullcontext),
        "no_sync_ms": training_step(ddp, device, timing.batch, ddp.no_sync),
        "all_reduce_ms": lambda: dist.all_reduce(grads),
    }
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(timing.rounds):
        for name, fn in calls.items():
            rounds[name].append(median_ms(fn, timing.steps, device, barrier=True))
    out = {name: statistics.median(v) for name, v in rounds.items()}
    out["grads_mb"] = grads.numel() * grads.element_size() / 2**20
    return out


def _rank(rank: int, store: str, out: str, widths: tuple[int, ...], timing: Timing) -> None:
    torch.set_num_threads(1)  # a rank's, as the suite's runs have it
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    try:
        figures = [in_group(w, timing, torch.device("cpu")) for w in widths]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(figures))


def measure(widths: tuple[int, ...] = WIDTHS, timing: Timing = Timing()) -> StepComm:
    """The factor measured now, in two spawned processes on gloo over a file store."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        mp.start_processes(
            _rank,
            args=(str(Path(tmp) / "store"), str(out), widths, timing),
            nprocs=2,
            start_method="spawn",
        )
        figures = json.loads(out.read_text())
    in_step = tuple(max(0.0, f["ddp_ms"] - f["no_sync_ms"]) for f in figures)
    alone = tuple(f["all_reduce_ms"] for f in figures)
    factor = max(1.0, sum(in_step) / sum(alone))
    return StepComm(factor, in_step, alone, widths, f"measured on {socket.gethostname()}")


def cache_path() -> Path:
    """One file per host name and torch version."""
    return CACHE_DIR / cache_file_name(f"{socket.gethostname()}_{torch.__version__}")


def host_step_comm() -> StepComm:
    """This host's factor: read from the cache, or measured (saying so) and cached."""
    path = cache_path()
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        raw = json.loads(path.read_text())
        return StepComm(
            float(raw["factor"]),
            tuple(raw["in_step_ms"]),
            tuple(raw["alone_ms"]),
            tuple(raw["widths"]),
            str(path),
        )
    print(
        "step comm: measuring what a 2-rank DDP step pays for its all-reduce here (~20 s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        got = measure()
    except (
        mp.ProcessRaisedException,
        mp.ProcessExitedException,
        OSError,
        RuntimeError,
        ValueError,
    ) as e:
        # a plan goes on, its collectives as measured alone
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"step comm: cannot measure it ({why}); collectives as alone", file=sys.stderr)
        return StepComm(1.0, (), (), (), f"not measured: {why}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps(asdict(got), indent=1) + "\n")
    except (OSError, atomic.OutputError) as e:
        print(f"step comm: cannot cache the factor: {e}", file=sys.stderr)
    return got
