"""Deadlocks injected into real 2-rank runs (tests/data/models/deadlocks.py, examples/
uneven_data.py): each point's diagnosis names the right rank, call, sequence number and source
line, within the point's timeout plus 30 s; finished rows survive; the next point runs, or the
run ends with the diagnosis (a rank that gloo aborts). torch's own analyser, where it finds a
problem in the same dumps, names the same call."""

import contextlib
import html
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.hang import load
from bench.hang.torch_view import first_problem

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "tests" / "data" / "models" / "deadlocks.py"
TIMEOUT_S = 6
CASES = ("skip", "order", "order_groups", "sleep", "raises")


def line_of(marker: str) -> str:
    """``deadlocks.py:N`` of the line carrying ``# MARKER``."""
    for n, text in enumerate(MODELS.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return f"deadlocks.py:{n}"
    raise AssertionError(marker)


def sweep(out: Path, models: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [
        sys.executable,
        "bench/run.py",
        "--sweep",
        "bucket_cap_mb",
        "--values",
        "25",
        "--impl",
        "native",
        "--model",
        ",".join(f"{MODELS}:{m}" for m in models),
        "--steps",
        "3",
        "--max-steps",
        "3",
        "--rounds",
        "1",
        "--interleave",  # the points in their order, each one's outcome its own
        "off",
        "--warmup-steps",
        "1",
        "--profile-steps",
        "1",
        "--point-timeout",
        str(TIMEOUT_S),
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--no-report",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def injected(tmp_path_factory):
    """One launch: the five deadlocks that leave the job able to go on, then a healthy point."""
    out = tmp_path_factory.mktemp("hangs") / "run"
    proc, seconds = sweep(out, [*CASES, "none"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    rows = {m: df[df["model"].str.endswith(f":{m}")].iloc[0] for m in [*CASES, "none"]}
    return rows, proc, seconds


@pytest.mark.timeout(420)
def test_each_deadlock_is_named_and_the_sweep_goes_on(injected):
    rows, proc, seconds = injected
    # every failing point within its timeout plus 30 s (start-up and the healthy point included)
    assert seconds < len(CASES) * (TIMEOUT_S + 30), seconds
    assert rows["none"]["status"] == "ok"  # the next point ran, in a fresh group
    for case in CASES:
        assert rows[case]["status"] == "error", case
        assert Path(rows[case]["hang_dir"], "fr_rank0").exists()
        assert Path(rows[case]["hang_dir"], "stacks_rank1.json").exists()
    diag = {case: rows[case]["diagnosis"] for case in CASES}
    # 1. a collective behind `if rank != 1`: rank 1 never issued the aux all-reduce
    assert re.search(
        r"^rank 1 skipped all_reduce #3 \(group aux, 1,000 float32\); rank 0 "
        rf"waits in it at {line_of('SKIP')}",
        diag["skip"],
    ), diag["skip"]
    # 2. two collectives in a different order in one group: the first sequence number they differ
    m = re.search(
        r"ranks disagree at collective #(\d+) \(group point\): rank 0 all_reduce "
        rf"\[1000\] float32 at {line_of('ORDER-0')}; rank 1 broadcast \[1000\] "
        rf"float32 at {line_of('ORDER-1')}",
        diag["order"],
    )
    assert m, diag["order"]
    # ... and across two groups: each waits in a call the other never issued
    assert "deadlock across group aux and group point" in diag["order_groups"]
    assert line_of("GROUPS-0") in diag["order_groups"]
    assert line_of("GROUPS-1") in diag["order_groups"]
    # 4. one rank sleeping in its own code past the deadline
    assert re.search(
        rf"^rank 1 is in its own code at {line_of('SLEEP')} \(time.sleep.*while "
        r"rank 0 waits in all_reduce #\d+ \(group point",
        diag["sleep"],
    ), diag["sleep"]
    # 5. an exception on one rank: the other stops waiting at once, with its message
    assert re.search(
        rf"^rank 1 raised RuntimeError: injected failure on rank 1 at "
        rf"{line_of('RAISES')}",
        diag["raises"],
    ), diag["raises"]
    assert rows["raises"]["error"] == "rank 1: RuntimeError: injected failure on rank 1"
    assert f"{rows['raises']['point']}: diagnosis: rank 1 raised" in proc.stdout


@pytest.mark.timeout(120)
def test_torch_analyser_agrees_where_it_finds_a_problem(injected):
    rows, _, _ = injected
    found = 0
    for case in CASES:
        d = load(Path(rows[case]["hang_dir"]))
        torch_says = first_problem(d)
        if torch_says is None:  # it checks calls group by group; a rank missing one it skips
            continue
        found += 1
        name = torch_says.group
        desc = d.groups[name][0]
        assert f"#{torch_says.seq} (group {desc})" in rows[case]["diagnosis"], (case, torch_says)
    assert found >= 1  # the disagreement in one group at least


@pytest.mark.timeout(200)
def test_a_rank_aborted_by_gloo_ends_the_run_with_the_diagnosis(tmp_path):
    """3. sizes that differ: gloo aborts the rank that receives more than its tensor holds; the
    survivor dumps (the launcher's SIGTERM waits for it), writes the row with the diagnosis, and
    the run ends with every finished row kept (``--resume`` runs the rest)."""
    # the third point is never reached: the run ends with the second (a model named twice would
    # be refused: its points would share one id)
    proc, _ = sweep(tmp_path / "run", ["none", "sizes", "raises"])
    assert proc.returncode != 0
    df = pd.read_csv(tmp_path / "run" / "results.csv", keep_default_na=False)
    assert df["status"].tolist() == ["ok", "error"]
    diagnosis = df["diagnosis"].iloc[1]
    assert re.search(
        rf"^rank (0|1) left no dump, while rank (0|1) waits in all_reduce #\d+ "
        rf"\(group point, (1,000|999) float32\) at {line_of('SIZES')}",
        diagnosis,
    )
    assert "diagnosis: rank" in proc.stderr


def uneven(tmp_path: Path, fix: str) -> subprocess.CompletedProcess:
    """``torchrun examples/uneven_data.py --fix FIX`` at 2 ranks, the recorder dumping under
    ``tmp_path/FIX``."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / fix / "fr_rank"),
    }
    cmd = [
        str(Path(sys.executable).with_name("torchrun")),
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/uneven_data.py",
        "--fix",
        fix,
        "--timeout-s",
        "5",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def uneven_fixed(fix: str) -> tuple[int, str]:
    """examples/uneven_data.py's training loop with ``--fix FIX`` on the pool's ranks (what its
    ``main`` runs once its group is up, less the launch): this rank's steps and what it
    printed."""
    import torch.distributed as dist

    from examples.uneven_data import train

    with contextlib.redirect_stdout(io.StringIO()) as said:
        steps = train(fix, dist.get_rank(), dist.get_world_size())
    return steps, said.getvalue()


@pytest.mark.timeout(300)
def test_uneven_data_is_diagnosed_and_its_fixes_remove_the_hang(pool, tmp_path):
    """6. a strided shard without padding or dropping: rank 0 runs a third step; the user's own
    script, launched with the recorder's two variables and ``record_hangs()``, is diagnosed by
    ``python -m bench.hang``; DistributedSampler(drop_last=True) and DDP's Join remove it (the
    script's loop on the 2-rank pool: every rank past the barrier after its loop)."""
    assert uneven(tmp_path, "none").returncode != 0
    proc = subprocess.run(
        [sys.executable, "-m", "bench.hang", str(tmp_path / "none"), "--torch"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert re.search(
        r"^rank 0 began another step \(all_reduce #(\d+) \(group default, 9 "
        r"float32\) at uneven_data.py:\d+, as in the step before\) that rank 1 never "
        r"began \(rank 1 is at barrier #\1 at uneven_data.py:\d+\)",
        first,
    ), first
    seq = re.search(r"#(\d+)", first).group(1)
    assert f"torch's analyser: all_reduce #{seq} of group 0" in proc.stdout
    # rank 0 has 5 samples, rank 1 4: drop_last gives each 4 (2 steps), Join lets rank 0 run
    # its third step while rank 1's collectives are shadowed
    for fix, steps in (("drop_last", [2, 2]), ("join", [3, 2])):
        done = pool(2).run(uneven_fixed, fix, timeout=60)
        assert [n for n, _ in done] == steps, (fix, done)
        assert all(said.count("done") == 1 for _, said in done), (fix, done)


@pytest.mark.timeout(120)
def test_the_report_shows_each_diagnosis_whole(injected, tmp_path):
    from bench.report.page import write_report

    rows, _, _ = injected
    run_dir = Path(rows["raises"]["hang_dir"]).parents[1]
    path, _ = write_report(run_dir, tmp_path)
    page = path.read_text()
    for case in CASES:
        assert html.escape(rows[case]["diagnosis"]) in page, case
    assert f"python -m bench.hang {rows['raises']['hang_dir']}" in page


@pytest.mark.timeout(200)
def test_a_pipeline_whose_stages_disagree_on_the_micro_batch_count_is_named(tmp_path):
    """7. torch's 1F1B over two stages, rank 1's schedule one micro-batch short
    (deadlocks.py:microbatches): rank 0's last send has no receive. A sweep of its own (a
    pipeline point: the DDP launch above cannot hold it); the recorder keeps no gloo send or
    receive, so the diagnosis reads rank 0's stacks."""
    cmd = [
        sys.executable, "bench/run.py", "--sweep", "pp_microbatches", "--values", "4",
        "--impl", "native", "--model", f"{MODELS}:microbatches", "--steps", "3",
        "--max-steps", "3", "--rounds", "1", "--interleave", "off", "--warmup-steps", "1",
        "--profile-steps", "1", "--point-timeout", str(TIMEOUT_S), "--nproc-per-node", "2",
        "--out", str(tmp_path / "run"), "--no-report",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    row = pd.read_csv(tmp_path / "run" / "results.csv", keep_default_na=False).iloc[0]
    assert row["status"] == "error"
    # rank 0 waits on a batch of a send and a receive (1F1B's fwd_send_bwd_recv): gloo's
    # timeout message says which one it timed out in, but under load the point's watchdog can
    # dump rank 0 before gloo's own timeout fires, and the stacks alone say "a send or receive"
    assert re.search(
        r"^rank 0 \(stage 0\) (sends to rank 1, which never receives it|is blocked in a send "
        r"or receive with rank 1) \(at pipeline\.py:\d+, "
        r"torch's schedules\.py:\d+; its schedule: 4 micro-batches, 4 forwards and 2 "
        r"backwards done\): rank 1 left its sends and receives and waits in "
        r"all_reduce #\d+ \(group point",
        row["diagnosis"],
    ), row["diagnosis"]
