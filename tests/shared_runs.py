"""Runs that several test files read, made once per ``make test``: with pytest-xdist's workers,
the first to ask makes them under a file lock in the session's shared temporary folder and the
others wait for it and read the same folders (each launch costs 10-20 CPU-s). Readers copy what
they change."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from tests.test_end_to_end import SHORT, TORCHRUN, launch

COLLECTIVES = [
    "--sweep",
    "message_size",
    "-b",
    "4K",
    "-e",
    "1M",
    "-f",
    "4",
    "-n",
    "5",
    "-w",
    "2",
    "--collectives",
    "all_reduce,all_gather,reduce_scatter",
    "--no-report",
]
BUCKETS = [
    "--sweep",
    "bucket_cap_mb",
    "--values",
    "0.25,25",
    "--model",
    "mlp",
    "--steps",
    "4",
    "--max-steps",
    "4",
    "--rounds",
    "1",
    "--warmup-steps",
    "1",
    "--profile-steps",
    "2",
    "--point-timeout",
    "30",
]

# The DDP bucket sweep of wide_mlp that test_sequence.py and test_timeline.py read: its 40 MB
# of gradients make 3, 2 and 1 DDP buckets at 1, 25 and 100 MB.
DDP_SWEEP_MB = (1, 25, 100)
DDP_SWEEP_IMPLS = ("native", "reference", "reference_nooverlap")


def shared(tmp_path_factory, worker_id: str, name: str, make: Callable[[Path], None]) -> Path:
    """``name``'s folder, made by ``make(folder)`` once for the whole session: by this process
    alone without xdist, else by whichever worker asks first (the rest wait on its lock)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / f"shared-{name}"
    with FileLock(f"{root}.lock"):
        if not (root / "made").exists():
            shutil.rmtree(root, ignore_errors=True)  # what a worker that failed left half made
            root.mkdir()
            make(root)
            (root / "made").touch()
    return root


def make_model_runs(root: Path) -> None:
    """A collectives run (``coll``) and a bucket sweep made with ``--predict-with`` it
    (``train``, its report in ``reports``): what the cost model and the run-folder tests read."""
    coll, train, reports = root / "coll", root / "train", root / "reports"
    run = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "bench/run.py"]
    proc = launch([*run, *COLLECTIVES, "--out", str(coll)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = launch(
        [
            *run,
            *BUCKETS,
            "--out",
            str(train),
            "--reports-dir",
            str(reports),
            "--predict-with",
            str(coll),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def sweep(out: Path, values: str, impls: str) -> Path:
    """A profiled 2-rank DDP bucket sweep of wide_mlp into ``out``, one launch: each point
    traced over two steps (a timeline draws one of them)."""
    cmd = [
        sys.executable,
        "bench/run.py",
        "--sweep",
        "bucket_cap_mb",
        "--values",
        values,
        "--model",
        "wide_mlp",
        "--impl",
        impls,
        "--batch-size",  # the gradients, not the batch, make the buckets: 8 computes less
        "8",
        *SHORT,
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--no-report",
    ]
    proc = launch(cmd, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def make_ddp_sweep(root: Path) -> None:
    """The wide_mlp bucket sweep (``run``) at every value and implementation that
    test_sequence.py (its native points' collective calls) and test_timeline.py (timelines,
    the diff, the trace view) read."""
    sweep(root / "run", ",".join(map(str, DDP_SWEEP_MB)), ",".join(DDP_SWEEP_IMPLS))
