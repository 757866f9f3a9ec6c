"""What the flight recorder costs a training step, in one launch, with the two sides
interleaved block by block.

    python bench/selftime/recorder_cost.py [--cycles 24] [--block 3] [--model wide_mlp] [--json]

The recorder is read once per process (``TORCH_FR_BUFFER_SIZE`` at the first process group), so
one process cannot time itself with it on and off. Instead this starts two jobs of ``--ranks``
ranks each on this machine, the same DDP training (native DDP, ``--bucket-cap-mb``) in both, the
recorder on in one (``TORCH_FR_BUFFER_SIZE=2000``, what every sweep point runs with) and off in
the other (0). Each cycle runs one block of ``--block`` steps of each job, in a fresh seeded random
order, while the other job's ranks wait idle; the cycle's ratio is the on-job's block over the
off-job's. Load beside the launch (another job, a sweep, thermal drift) falls on both blocks of a
cycle alike and cancels in the ratio; the figure is the paired ratio over the cycles
(Hodges-Lehmann's) with its distribution-free 95 % interval
(``bench.stats.estimates.paired_cycles_ratio``: randomised multiple interleaved trials, duet
benchmarking). Each job checks that its recorder is as claimed (entries recorded, or none) before it
is timed.

``--slow-pct P`` adds a third job, the recorder on and every step P % longer (a sleep of P % of
the step's own time, so that the cost stays P % however loaded the machine is), timed in the
same cycles: the gate's own test, proving that a real cost is found through the same launch.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import queue
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from bench.stats.estimates import paired_cycles_ratio

JOBS = {"on": "2000", "off": "0"}  # TORCH_FR_BUFFER_SIZE of each job
TIMEOUT_S = 120.0  # a job that does not answer a block within this is broken: say so, stop


@dataclass(frozen=True)
class Trial:
    """One measurement: the training every job runs (``model`` at ``batch`` samples a rank,
    native DDP with ``bucket_cap_mb``, None: the knob's default; ``warmup`` steps first), the
    jobs (``sizes``: each one's TORCH_FR_BUFFER_SIZE, of ``ranks`` ranks each; ``slow_pct``: a
    third, the recorder on and every step that much longer), and the design (``cycles`` of a
    ``block`` of steps per job, in orders drawn from ``seed``)."""

    cycles: int = 24
    block: int = 3
    model: str = "wide_mlp"
    ranks: int = 2
    batch: int = 32
    bucket_cap_mb: float | None = None
    warmup: int = 3
    slow_pct: float = 0.0
    seed: int = 0
    sizes: dict[str, str] = field(default_factory=lambda: dict(JOBS))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(job: str, rank: int, port: int, trial: Trial, inbox, outbox) -> None:
    """One rank of one job: build, warm up, check the recorder, then time a block per order."""
    import torch
    import torch.distributed as dist

    from parallel_kernels.ddp import BUCKET_CAP_MB, apply_native_ddp
    from parallel_kernels.models import build_model, workload

    parent = os.getppid()
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    world = trial.ranks
    if len(cores) >= world:  # rank r of both jobs on one core: placement cannot favour a job
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        wl = workload(trial.model)
        model = apply_native_ddp(
            build_model(trial.model),
            group=None,
            device=torch.device("cpu"),
            bucket_cap_mb=trial.bucket_cap_mb or BUCKET_CAP_MB,
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        inputs, targets = wl.batch(trial.batch, rank)
        slow = trial.slow_pct / 100 if job == "slow" else 0.0

        def step() -> None:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            wl.loss(model(inputs), targets).backward()
            opt.step()
            if slow:
                time.sleep(slow * (time.perf_counter() - t0))

        for _ in range(trial.warmup):
            step()
        record = torch._C._distributed_c10d._dump_fr_trace(
            includeCollectives=True, includeStackTraces=False, onlyActive=False
        )
        entries = len(pickle.loads(record)["entries"])
        outbox.put(("ready", job, rank, entries))
        while _next(inbox, parent) is not None:  # "go": one block
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(trial.block):
                step()
            dist.barrier()
            outbox.put(("block", job, rank, (time.perf_counter() - t0) / trial.block))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001  (the conductor says it in one line)
        outbox.put(("error", job, rank, f"{type(e).__name__}: {e}".splitlines()[0][:300]))


def _next(inbox, parent: int):
    """The conductor's next word; None (stop) once it is gone: no worker outlives it."""
    while True:
        try:
            return inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _get(outbox, kind: str):
    try:
        msg = outbox.get(timeout=TIMEOUT_S)
    except queue.Empty:
        raise RuntimeError(f"a rank did not answer within {TIMEOUT_S:.0f} s") from None
    if msg[0] == "error":
        raise RuntimeError(f"job {msg[1]} rank {msg[2]}: {msg[3]}")
    assert msg[0] == kind, msg
    return msg


def _start(ctx, trial: Trial, outbox) -> tuple[dict, list]:
    """Each job's ranks, started with its recorder setting: (inboxes per job, processes)."""
    ranks = trial.ranks
    inboxes: dict[str, list] = {}
    procs = []
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    try:
        for job, size in trial.sizes.items():
            os.environ["TORCH_FR_BUFFER_SIZE"] = size  # a spawned process starts with this env
            port = _free_port()
            inboxes[job] = [ctx.Queue() for _ in range(ranks)]
            for rank, inbox in enumerate(inboxes[job]):
                worker_args = (job, rank, port, trial, inbox, outbox)
                procs.append(ctx.Process(target=_worker, args=worker_args, daemon=True))
                procs[-1].start()
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved
    return inboxes, procs


def _cycles(inboxes: dict, outbox, cycles: int, seed: int) -> dict[str, list[float]]:
    """Per job, the step time of its block in each cycle (the slowest rank's)."""
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {job: [] for job in inboxes}
    for _ in range(cycles):
        for job in rng.permutation(list(inboxes)):  # a fresh order each cycle
            for q in inboxes[job]:
                q.put("go")
            times[job].append(max(_get(outbox, "block")[3] for _ in inboxes[job]))
    return times


def _check_recorders(outbox, workers: int, sizes: dict[str, str]) -> dict[str, int]:
    """Per job, the most entries a rank's recorder holds once ready; raises unless a job with
    the recorder on recorded some and one with it off none."""
    recorded = {job: 0 for job in sizes}
    for _ in range(workers):
        _, job, _, entries = _get(outbox, "ready")
        recorded[job] = max(recorded[job], entries)
    if any((recorded[job] > 0) != (sizes[job] != "0") for job in sizes):
        raise RuntimeError(f"the recorder is not as claimed: entries recorded {recorded}")
    return recorded


def measure(trial: Trial) -> dict:
    """Both jobs started, checked, and timed in ``trial.cycles`` interleaved cycles: the figures.
    ``trial.slow_pct`` adds a third job, the recorder on and each step made that much longer: its
    ratio to the off job (``slow``) is what a real cost looks like through the same launch."""
    if trial.slow_pct:
        trial = replace(trial, sizes={**trial.sizes, "slow": trial.sizes["on"]})
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes, procs = _start(ctx, trial, outbox)
    try:
        recorded = _check_recorders(outbox, len(procs), trial.sizes)
        times = _cycles(inboxes, outbox, trial.cycles, trial.seed)
        for q in (q for qs in inboxes.values() for q in qs):
            q.put(None)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    r = paired_cycles_ratio(times["on"], times["off"])
    return {
        "ratio": r.ratio,
        "low": r.low,
        "high": r.high,
        "p": r.p,
        "cycles": trial.cycles,
        "block": trial.block,
        "model": trial.model,
        "ranks": trial.ranks,
        "slow_pct": trial.slow_pct,
        "on_ms": 1e3 * float(np.median(times["on"])),
        "off_ms": 1e3 * float(np.median(times["off"])),
        "entries_recorded": recorded["on"],
    } | _slow(times)


def _slow(times: dict[str, list[float]]) -> dict:
    if "slow" not in times:
        return {}
    r = paired_cycles_ratio(times["slow"], times["off"])
    return {"slow": {"ratio": r.ratio, "low": r.low, "high": r.high}}


def describe(f: dict) -> str:
    return (
        f"flight recorder on / off, DDP {f['model']} step on {f['ranks']} ranks: "
        f"{f['ratio']:.3f} [{f['low']:.3f}, {f['high']:.3f}] (median of {f['cycles']} paired "
        f"cycles of {f['block']} steps, 95 % distribution-free interval; steps "
        f"{f['on_ms']:.1f} ms on, {f['off_ms']:.1f} ms off)"
    ) + (
        f"; a recorder costing {f['slow_pct']:g} % of a step would read "
        f"{f['slow']['ratio']:.3f} [{f['slow']['low']:.3f}, {f['slow']['high']:.3f}]"
        if "slow" in f
        else ""
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=24)
    p.add_argument("--block", type=int, default=3, help="steps of one job per cycle")
    p.add_argument("--model", default="wide_mlp")
    p.add_argument("--ranks", type=int, default=2, help="ranks of each of the two jobs")
    p.add_argument(
        "--slow-pct",
        type=float,
        default=0.0,
        help="each step of the recorder-on job made this many percent longer (the gate's test)",
    )
    p.add_argument("--json", action="store_true", help="the figures as one JSON line")
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A: the recorder on in both jobs (what two processes differ by alone)",
    )
    args = p.parse_args(argv)
    if args.cycles < 6 or args.block < 1 or args.ranks < 2:
        p.error(
            "--cycles must be 6 or more (a 95 % interval needs 6), --block 1 or more, "
            "--ranks 2 or more"
        )
    try:
        trial = Trial(
            cycles=args.cycles,
            block=args.block,
            model=args.model,
            ranks=args.ranks,
            slow_pct=args.slow_pct,
            sizes={"on": "2000", "off": "2000"} if args.aa else dict(JOBS),
        )
        f = measure(trial)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(f) if args.json else describe(f), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
