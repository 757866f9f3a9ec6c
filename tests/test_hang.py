"""``bench.hang`` on dumps with known answers, written here in torch's dump format: each
diagnosis names the rank, the call, its sequence number and the line; torch's analyser names the
same call where it finds one; bad folders get one line and exit 2."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hang import diagnose, load
from bench.hang.__main__ import main
from bench.hang.dumps import DumpError
from bench.hang.torch_view import first_problem

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def call(
    seq: int,
    op: str = "all_reduce",
    shape=(1000,),
    line: int = 10,
    group: str = "0",
    t: int | None = None,
    done: bool = True,
) -> dict:
    desc = "default_pg" if group == "0" else "undefined"
    return {
        "record_id": seq,
        "pg_id": int(group),
        "process_group": (group, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"gloo:{op}",
        "time_created_ns": t if t is not None else seq * 1000,
        "input_sizes": [list(shape)],
        "input_dtypes": ["Float"],
        "output_sizes": [list(shape)],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "retired": done,
        "is_p2p": False,
        "timeout_ms": 5000,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "frames": [
            {
                "name": "all_reduce",
                "filename": "/x/site-packages/torch/distributed/c.py",
                "line": 1,
            },
            {"name": "step", "filename": "/job/train.py", "line": line},
        ],
    }


def write(
    folder: Path,
    rank: int,
    entries: list[dict],
    world: int = 2,
    job: str | None = "job-1",
    stacks: dict | None = None,
) -> None:
    """Rank ``rank``'s dump as the suite writes it; ``job=None``: as torch writes it (no
    ``job``), and without ``stacks`` no stacks file beside it."""
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    for e in entries:
        name = e["process_group"][0]
        groups.setdefault(
            name, {"name": name, "desc": "undefined", "ranks": str(list(range(world)))}
        )
    rec = {"version": "2.10", "pg_config": groups, "pg_status": {}, "entries": entries}
    if job is not None:
        rec["job"] = job
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"fr_rank{rank}").write_bytes(pickle.dumps(rec))
    if stacks is not None:
        (folder / f"stacks_rank{rank}.json").write_text(json.dumps({"rank": rank, **stacks}))


def steps(n: int, **kw) -> list[dict]:
    return [call(s, **kw) for s in range(1, n + 1)]


def hang(argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.hang", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_sizes_that_differ_are_a_disagreement_torch_finds_too(tmp_path):
    write(tmp_path, 0, [*steps(2), call(3, line=42)])
    write(tmp_path, 1, [*steps(2), call(3, shape=(999,), line=42)])
    d = load(tmp_path)
    diag = diagnose(d)
    assert diag.kind == "disagree"
    assert diag.line == (
        "ranks disagree at collective #3 (group default): rank 0 all_reduce "
        "[1000] float32 at train.py:42; rank 1 all_reduce [999] float32 at "
        "train.py:42"
    )
    torch_says = first_problem(d)
    assert (torch_says.group, torch_says.seq) == ("0", diag.seq)


def test_a_skipped_call_of_equal_size_is_seen_by_its_line(tmp_path):
    """``if rank == 0: all_reduce(x)`` where x has the gradients' size: the ops agree call by
    call, shifted by one; only the lines tell."""
    write(tmp_path, 0, [call(1), call(2, line=42), call(3), call(4, done=False)])
    write(tmp_path, 1, [call(1), call(2), call(3)])
    diag = diagnose(load(tmp_path))
    assert diag.kind == "skipped"
    assert diag.line.startswith(
        "rank 1 never issued all_reduce #2 (group default, 1,000 "
        "float32) that rank 0 issued at train.py:42"
    )
    assert (diag.ranks, diag.seq, diag.where) == ((1,), 2, "train.py:42")


def test_the_rank_that_never_arrived_is_named_with_its_own_code(tmp_path):
    sleeping = {
        "reason": "watchdog",
        "error": "dumped by the watchdog: rank 0 failed",
        "threads": [
            {
                "thread": "MainThread",
                "main": True,
                "frames": [
                    {"file": "/job/model.py", "line": 88, "name": "forward"},
                    {"file": "/job/train.py", "line": 30, "name": "main"},
                ],
            }
        ],
    }
    write(tmp_path, 0, steps(5, line=42))
    write(tmp_path, 1, steps(4, line=42), stacks=sleeping)
    diag = diagnose(load(tmp_path))
    assert diag.kind == "own_code"
    assert diag.line.startswith(
        "rank 1 is in its own code at model.py:88, while rank 0 waits "
        "in all_reduce #5 (group default, 1,000 float32) at train.py:42"
    )


def test_a_partial_set_of_ranks_is_analysed_and_the_missing_named(tmp_path):
    for r in (0, 1, 3):
        write(tmp_path, r, steps(7), world=4)
    d = load(tmp_path)
    assert d.missing == [2]
    diag = diagnose(d)
    assert diag.kind == "gone"
    assert diag.line.startswith("rank 2 left no dump, while ranks 0, 1, 3 wait in all_reduce #7")
    assert "dumps of 3 of 4 ranks" in hang([tmp_path]).stdout


def test_ranks_that_agree_and_wait_for_nobody_are_no_hang(tmp_path):
    write(tmp_path, 0, steps(3))
    write(tmp_path, 1, steps(3))
    assert diagnose(load(tmp_path)).kind == "none"


def test_the_command_prints_the_diagnosis_and_each_rank(tmp_path):
    write(tmp_path, 0, [*steps(2), call(3, op="broadcast", line=50)])
    write(tmp_path, 1, [*steps(2), call(3, line=51)])
    proc = hang([tmp_path, "--torch"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ranks disagree at collective #3 (group default): rank 0 broadcast")
    assert "rank 1: last calls all_reduce #3 (group 0) at train.py:51" in proc.stdout
    assert "torch's analyser: broadcast #3 of group 0 fails its checks" in proc.stdout


@pytest.mark.parametrize("case", ["empty", "truncated", "mixed", "two_of_a_rank", "missing"])
def test_bad_folders_get_one_line_naming_the_file(tmp_path, case):
    folder = tmp_path / "dumps"
    folder.mkdir()
    if case == "truncated":
        write(folder, 0, steps(2))
        write(folder, 1, steps(2))
        data = (folder / "fr_rank1").read_bytes()
        (folder / "fr_rank1").write_bytes(data[: len(data) // 2])
        named = "fr_rank1: truncated or not a flight-recorder dump"
    elif case == "mixed":
        write(folder, 0, steps(2), job="job-1")
        write(folder, 1, steps(2), job="job-2")
        named = "dumps of different jobs mixed: fr_rank0 (job job-1) and fr_rank1 (job job-2)"
    elif case == "two_of_a_rank":
        write(folder, 0, steps(2))
        (folder / "other_0").write_bytes((folder / "fr_rank0").read_bytes())
        named = "two dumps of rank 0 (fr_rank0, other_0)"
    elif case == "missing":
        folder = tmp_path / "nowhere"
        named = "nowhere: no such folder"
    else:
        (folder / "notes.txt").write_text("no dumps here")
        named = "dumps: no flight-recorder dumps"
    proc = hang([folder])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert named in proc.stderr
    with pytest.raises(DumpError):
        load(folder)


def test_a_call_skipped_across_groups_is_named_by_the_steps_before_not_by_time(tmp_path):
    """Each step: an aux-group all-reduce in forward (line 51), then the gradients' in backward
    (line 85). Rank 1 skips the aux one in step 3 and waits in the gradients' all-reduce, which
    it issued before rank 0 reached the aux one (ranks drift): the history, not the clock,
    says who skipped."""

    def step(k: int, aux: bool = True, t0: int = 0) -> list[dict]:
        out = [call(k, group="1", line=51, t=t0 + 10)] if aux else []
        return [*out, call(k, shape=(289,), line=85, t=t0 + 20)]

    history = [e for k in (1, 2) for e in step(k, t0=100 * k)]
    write(tmp_path, 0, [*history, call(3, group="1", line=51, t=390, done=False)])
    write(tmp_path, 1, [*history, call(3, shape=(289,), line=85, t=310, done=False)])
    for rank in (0, 1):  # record order, as the recorder numbers each process's calls
        path = tmp_path / f"fr_rank{rank}"
        rec = pickle.loads(path.read_bytes())
        for i, e in enumerate(rec["entries"]):
            e["record_id"] = i
        path.write_bytes(pickle.dumps(rec))
    diag = diagnose(load(tmp_path))
    assert diag.kind == "skipped", diag.line
    assert diag.line.startswith(
        "rank 1 skipped all_reduce #3 (group 1, 1,000 float32); rank 0 "
        "waits in it at train.py:51; rank 1 went on to all_reduce #3 "
        "(group default, 289 float32) at train.py:85"
    )


def test_two_groups_issued_in_a_different_order_are_a_cycle(tmp_path):
    """Rank 0: the default group's all-reduce, then group 1's; rank 1 the reverse. Group 1 had
    no call before: rank 0 has none in it at all, and is still behind in it."""
    write(tmp_path, 0, [*steps(2), call(3, line=70, t=400)])
    write(tmp_path, 1, [*steps(2), call(1, group="1", line=73, t=410)])
    diag = diagnose(load(tmp_path))
    assert diag.kind == "cycle", diag.line
    assert "a deadlock across group 1 and group default" in diag.line
    assert "train.py:70" in diag.line and "train.py:73" in diag.line


# Every kind of diagnosis, on the suite's dumps (its ``job``, a stacks file per rank) and on
# torch's plain ones (neither). Where the stacks are what tells (a rank that raised, one in its
# own code), the plain dumps name that rank's last call instead. Each case: the ranks' entries,
# their stacks, the world; then the kind and the line with stacks, and without.
TORCH = "/x/site-packages/torch/distributed/distributed_c10d.py"


def in_collective(line: int, error: str = "dumped by the watchdog: another rank failed") -> dict:
    """The stacks of a rank waiting in a collective issued at ``train.py:<line>``."""
    return {
        "reason": "watchdog",
        "error": error,
        "threads": [
            {
                "thread": "MainThread",
                "main": True,
                "frames": [
                    {"file": TORCH, "line": 1, "name": "all_reduce"},
                    {"file": "/job/train.py", "line": line, "name": "step"},
                ],
            }
        ],
    }


def records_in_order(entries: list[dict]) -> list[dict]:
    for i, e in enumerate(entries):
        e["record_id"] = i  # record order, as the recorder numbers each process's calls
    return entries


def across_groups() -> list[list[dict]]:
    def step(k: int, aux: bool = True, t0: int = 0) -> list[dict]:
        out = [call(k, group="1", line=51, t=t0 + 10)] if aux else []
        return [*out, call(k, shape=(289,), line=85, t=t0 + 20)]

    history = [e for k in (1, 2) for e in step(k, t0=100 * k)]
    r0 = [*history, call(3, group="1", line=51, t=390, done=False)]
    r1 = [*history, call(3, shape=(289,), line=85, t=310, done=False)]
    return [records_in_order(r0), records_in_order(r1)]


RAISED = {
    "reason": "error",
    "error": "RuntimeError: bad batch on rank 1",
    "raised_at": [
        {"file": "/job/data.py", "line": 7, "name": "load"},
        {"file": "/job/train.py", "line": 30, "name": "main"},
    ],
    "threads": [
        {
            "thread": "MainThread",
            "main": True,
            "frames": [{"file": "/job/train.py", "line": 30, "name": "main"}],
        }
    ],
}
SLEEPING = {
    "reason": "watchdog",
    "error": "dumped by the watchdog: rank 0 failed",
    "threads": [
        {
            "thread": "MainThread",
            "main": True,
            "frames": [
                {"file": "/job/model.py", "line": 88, "name": "forward"},
                {"file": "/job/train.py", "line": 30, "name": "main"},
            ],
        }
    ],
}
CLOSED = in_collective(42, "RuntimeError: Connection closed by peer [127.0.0.1]:1234")
LAST_CALL = (
    "rank 1 never issued all_reduce #3 (group default, 1,000 float32); rank 0 waits in "
    "it at train.py:42; rank 1's last call was all_reduce #2 (group default, 1,000 "
    "float32) at train.py:42"
)
GONE = (
    "rank 2 left no dump, while ranks 0, 1, 3 wait in all_reduce #7 (group default, 1,000 "
    "float32) at train.py:10, as in the step before: its process ended"
)

KINDS = {
    "disagree": (
        [[*steps(2), call(3, line=42)], [*steps(2), call(3, shape=(999,), line=42)]],
        [in_collective(42), in_collective(42)],
        2,
        (
            "disagree",
            "ranks disagree at collective #3 (group default): rank 0 all_reduce [1000] "
            "float32 at train.py:42; rank 1 all_reduce [999] float32 at train.py:42",
        ),
        None,
        ((1,), "0", 3, "all_reduce"),
    ),
    "skipped": (
        [[call(1), call(2, line=42), call(3), call(4, done=False)], [call(1), call(2), call(3)]],
        [in_collective(10), in_collective(10)],
        2,
        (
            "skipped",
            "rank 1 never issued all_reduce #2 (group default, 1,000 float32) that rank 0 "
            "issued at train.py:42: rank 1's calls from #2 on are the others' from #3 on",
        ),
        None,
        ((1,), "0", 2, "all_reduce"),
    ),
    "skipped_across_groups": (
        across_groups(),
        [in_collective(51), in_collective(85)],
        2,
        (
            "skipped",
            "rank 1 skipped all_reduce #3 (group 1, 1,000 float32); rank 0 waits in it "
            "at train.py:51; rank 1 went on to all_reduce #3 (group default, 289 "
            "float32) at train.py:85, which in every earlier step came right after the "
            "call at train.py:51",
        ),
        None,
        ((1,), "1", 3, "all_reduce"),
    ),
    "extra": (
        [steps(3), steps(3), [call(1), call(2, line=42), call(3), call(4)]],
        [in_collective(10), in_collective(10), in_collective(10)],
        3,
        (
            "extra",
            "rank 2 issued all_reduce #2 (group default, 1,000 float32) at train.py:42 that "
            "the others never did: their calls from #2 on are rank 2's from #3 on",
        ),
        None,
        ((2,), "0", 2, "all_reduce"),
    ),
    "uneven": (
        [steps(3, line=42), [*steps(2, line=42), call(3, op="barrier", shape=(), line=60)]],
        [in_collective(42), in_collective(60)],
        2,
        (
            "uneven",
            "rank 0 began another step (all_reduce #3 (group default, 1,000 float32) at "
            "train.py:42, as in the step before) that rank 1 never began (rank 1 is at "
            "barrier #3 at train.py:60)",
        ),
        None,
        ((1,), "0", 3, "all_reduce"),
    ),
    "raised": (
        [steps(3, line=42), steps(2, line=42)],
        [CLOSED, RAISED],
        2,
        (
            "raised",
            "rank 1 raised RuntimeError: bad batch on rank 1 at data.py:7, while rank 0 "
            "waited in all_reduce #3 (group default, 1,000 float32) at train.py:42",
        ),
        ("waits", LAST_CALL),
        ((1,), "0", 3, "all_reduce"),
    ),
    "own_code": (
        [steps(3, line=42), steps(2, line=42)],
        [CLOSED, SLEEPING],
        2,
        (
            "own_code",
            "rank 1 is in its own code at model.py:88, while rank 0 waits in all_reduce "
            "#3 (group default, 1,000 float32) at train.py:42",
        ),
        ("waits", LAST_CALL),
        ((1,), "0", 3, "all_reduce"),
    ),
    "waits": (
        [[*steps(3), call(4, shape=(1,), line=97, done=False)], steps(3)],
        [CLOSED, in_collective(10)],
        2,
        (
            "waits",
            "rank 1 never issued all_reduce #4 (group default, 1 float32); rank 0 waits in "
            "it at train.py:97; rank 1's last call was all_reduce #3 (group default, 1,000 "
            "float32) at train.py:10",
        ),
        None,
        ((1,), "0", 4, "all_reduce"),
    ),
    "waits_for_a_rank_without_calls": (
        [steps(1), []],
        [CLOSED, in_collective(10)],
        2,
        (
            "waits",
            "rank 1 never issued all_reduce #1 (group default, 1,000 float32); rank 0 waits "
            "in it at train.py:10; rank 1 issued no collective",
        ),
        None,
        ((1,), "0", 1, "all_reduce"),
    ),
    "cycle": (
        [[*steps(2), call(3, line=70, t=400)], [*steps(2), call(1, group="1", line=73, t=410)]],
        [in_collective(70), in_collective(73)],
        2,
        (
            "cycle",
            "rank 1 never issued all_reduce #3 (group default, 1,000 float32); rank 0 "
            "waits in it at train.py:70; rank 1 waits in all_reduce #1 (group 1, 1,000 "
            "float32) at train.py:73, which rank 0 never issued: a deadlock across group 1 "
            "and group default",
        ),
        None,
        ((1,), "0", 3, "all_reduce"),
    ),
    "gone": (
        [steps(7), steps(7), None, steps(7)],
        [CLOSED, CLOSED, None, CLOSED],
        4,
        ("gone", GONE),
        None,
        ((2,), "0", 7, "all_reduce"),
    ),
    "none": (
        [steps(3), steps(3)],
        [in_collective(10), in_collective(10)],
        2,
        ("none", "no hang in the dumps: every group's calls agree and no rank waits for another"),
        None,
        ((), None, None, None),
    ),
}


@pytest.mark.parametrize("stacks", [True, False], ids=["suite_dumps", "torch_dumps"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_diagnosis_with_and_without_stacks(tmp_path, capsys, kind, stacks):
    entries, rank_stacks, world, with_stacks, without, fields = KINDS[kind]
    for rank, (mine, st) in enumerate(zip(entries, rank_stacks, strict=True)):
        if mine is not None:
            write(
                tmp_path,
                rank,
                mine,
                world=world,
                job="job-1" if stacks else None,
                stacks=st if stacks else None,
            )
    d = load(tmp_path)
    assert all((r.stacks is not None) == stacks for r in d.ranks.values())
    diag = diagnose(d)
    want_kind, want_line = with_stacks if stacks or without is None else without
    assert diag.kind == want_kind, diag.line
    assert diag.line.startswith(want_line), diag.line
    assert (diag.ranks, diag.group, diag.seq, diag.op) == fields
    assert main([str(tmp_path)]) == 0  # the command, in this process (a launch each: seconds)
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == diag.line
    assert out.err == ""


def test_a_scatter_whose_input_only_the_root_holds_is_no_disagreement(tmp_path):
    """dist.scatter: the root passes the list, the others none; every rank's output alike."""
    root = call(2, op="scatter", shape=(1000,))
    root["input_sizes"] = [[2, 1000]]
    other = call(2, op="scatter", shape=(1000,))
    other["input_sizes"], other["input_dtypes"] = [], []
    write(tmp_path, 0, [call(1), root, call(3)])
    write(tmp_path, 1, [call(1), other, call(3)])
    assert diagnose(load(tmp_path)).kind == "none"
    # the same calls with outputs that differ do disagree
    other["output_sizes"] = [[999]]
    write(tmp_path, 1, [call(1), other, call(3)])
    assert diagnose(load(tmp_path)).kind == "disagree"


@pytest.mark.unit
def test_a_pipeline_stage_whose_send_has_no_receive_is_named_with_its_peer():
    """The suite's dumps of a pipeline whose rank 1 ran one micro-batch fewer
    (tests/data/hang/README.md): the recorder keeps no gloo send, so rank 0's stacks say it
    stood in one; rank 1 waits in the all-reduce after its schedule."""
    from bench.hang.diagnose import diagnose_folder

    diag = diagnose_folder(Path(__file__).parent / "data" / "hang" / "pipeline")
    assert diag.kind == "p2p" and diag.ranks == (0,)
    assert diag.line.startswith(
        "rank 0 (stage 0) sends to rank 1, which never receives it (at pipeline.py:202, "
        "torch's schedules.py:1105; its schedule: 4 micro-batches, 4 forwards and 2 backwards "
        "done)"
    ), diag.line
    assert "rank 1 left its sends and receives and waits in all_reduce #1 (group point" in (
        diag.line
    )


def test_a_schedule_position_is_said_from_the_state_its_frame_kept():
    """Each schedule's locals (bench/runner/faults/flight.py keeps them) in words; what a
    dump could hold that is not a number or a string says nothing."""
    from bench.hang.calls import schedule_position

    assert schedule_position({"i": 2, "microbatches": 8}) == "8 micro-batches, at micro-batch 2"
    assert schedule_position({"action": "1B3", "i": 0}) == "at action 1B3"
    assert schedule_position({"fwd_mb_index": 3, "bwd_mb_index": 1}) == (
        "3 forwards and 1 backward done"
    )
    assert schedule_position({"microbatches": True, "i": [1]}) is None
    assert schedule_position(None) is None
