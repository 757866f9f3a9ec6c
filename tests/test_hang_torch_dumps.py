"""``bench.hang`` on torch's own dumps of a user's script (no ``record_hangs()``: no ``job``, no
stacks files), kept in ``tests/data/hang/`` (``make_dumps.py`` writes them; one is made here
live); on dumps of older torch; when torch's analyser cannot read them; and on dumps that are
not what they claim: a pickle that would run code is refused unread, a field handed to torch's
analyser that is not the data it must be (a group's ranks that it would evaluate) is refused
before it sees it, every bad input is one line and exit 2, never a traceback."""

import importlib
import importlib.util
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hang import DumpError, diagnose, load
from bench.hang.__main__ import main
from bench.hang.torch_view import first_problem, summary
from tests.test_hang import call, hang, steps, write

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "hang"
SCRIPT = DATA / "user_script.py"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if (p / "pickle").is_dir())


def make_dumps():
    """``tests/data/hang/make_dumps.py``, the generator, as a module."""
    spec = importlib.util.spec_from_file_location("make_dumps", DATA / "make_dumps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line_of(marker: str) -> str:
    """``user_script.py:N`` of the line carrying ``# MARKER``."""
    for n, text in enumerate(SCRIPT.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return f"user_script.py:{n}"
    raise AssertionError(marker)


def expected(scenario: str) -> str:
    """The diagnosis of the scenario's pickles (what it names: rank, op, number, line)."""
    grad, after = line_of("GRAD"), line_of("AFTER-LOOP")
    waits = (
        "rank 1 never issued all_reduce #{n} (group default, {size} float32); rank 0 waits "
        "in it at {at}; rank 1's last call was all_reduce #{m} (group {g}, 289 float32) at "
        "{last}"
    )
    return {
        "after_loop": waits.format(n=4, size=1, at=after, m=3, g="default", last=grad),
        "p2p": waits.format(n=4, size=1, at=after, m=3, g="default", last=grad),
        "raises": waits.format(n=3, size=289, at=grad, m=2, g="default", last=grad),
        "groups": waits.format(
            n=3, size=289, at=line_of("GROUPS-0"), m=1, g=1, last=line_of("GROUPS-1")
        ),
        "in_loop": f"rank 1 never issued all_reduce #3 (group default, 289 float32) that rank 0 "
        f"issued at {line_of('IN-LOOP')}: rank 1's calls from #3 on are the others' "
        f"from #4 on",
        "sizes": f"ranks disagree at collective #2 (group default): rank 0 broadcast [999] "
        f"float32 at {line_of('SIZES')}; rank 1 broadcast [1000] float32 at "
        f"{line_of('SIZES')}",
        "order": f"ranks disagree at collective #3 (group default): rank 0 all_reduce [289] "
        f"float32 at {line_of('ORDER-0')}; rank 1 broadcast [289] float32 at "
        f"{line_of('ORDER-1')}",
        "aborted": f"rank 1 left no dump, while rank 0 waits in all_reduce #3 (group default, "
        f"1,000 float32) at {line_of('ABORTED')}: its process ended, in that call or "
        f"before it",
        "gone": f"rank 1 left no dump, while rank 0 waits in all_reduce #3 (group default, 289 "
        f"float32) at {grad}, as in the step before: its process ended",
        "uneven": f"rank 0 began another step (all_reduce #3 (group default, 289 float32) at "
        f"{grad}, as in the step before) that rank 1 never began (rank 1 is at barrier "
        f"#3 at {line_of('BARRIER')})",
        "none": "no hang in the dumps: every group's calls agree and no rank waits for another",
    }[scenario]


@pytest.mark.unit
def test_the_data_holds_every_scenario():
    assert set(SCENARIOS) == {
        "after_loop",
        "in_loop",
        "sizes",
        "aborted",
        "order",
        "gone",
        "raises",
        "uneven",
        "groups",
        "p2p",
        "none",
    }
    for s in SCENARIOS:
        for form in ("pickle", "json"):
            assert not list((DATA / s / form).glob("stacks_rank*")), (s, form)


@pytest.mark.unit
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_torch_dumps_of_a_users_script_are_diagnosed(scenario, capsys):
    d = load(DATA / scenario / "pickle")
    assert all(r.stacks is None and "job" not in r.record for r in d.ranks.values())
    assert d.world == [0, 1]  # gloo's dumps list the world only under a nameless group
    diag = diagnose(d)
    assert diag.line.startswith(expected(scenario)), diag.line
    assert main([str(DATA / scenario / "pickle"), "--torch"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert lines[0] == diag.line
    # torch's analyser finds no group of theirs in gloo's pg_config; ours stands
    assert lines[-1] == "torch's analyser could not read these dumps: KeyError: ('0', 0)"


@pytest.mark.unit
def test_the_collective_behind_if_rank_0_was_a_traceback_and_is_the_diagnosis():
    """The issue's case: ``if rank == 0: all_reduce(loss)`` after the loop, torch's own dumps;
    ``_call`` was handed a pandas row, whose ``.dtypes`` is the row's own dtype."""
    proc = hang([DATA / "after_loop" / "pickle"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[0] == expected("after_loop")


# Where the stacks (the pickles' frames) decide nothing, the JSON form reads the same.
SAME_IN_JSON = ["after_loop", "p2p", "raises", "groups", "sizes", "order", "aborted", "none"]


def _no_lines(text: str) -> str:
    return re.sub(r"user_script\.py:\d+", "?", text)


@pytest.mark.unit
@pytest.mark.parametrize("scenario", SAME_IN_JSON)
def test_the_json_dumps_give_the_same_diagnosis(scenario):
    pk, js = (diagnose(load(DATA / scenario / form)) for form in ("pickle", "json"))
    assert (js.kind, js.ranks, js.group, js.seq, js.op) == (
        pk.kind,
        pk.ranks,
        pk.group,
        pk.seq,
        pk.op,
    )
    assert js.line == _no_lines(pk.line)  # torch's JSON holds no frames: no source line


@pytest.mark.unit
def test_json_dumps_without_lines_say_no_more_than_the_calls_do(capsys):
    """A skipped call of equal size, or a further step, is told by its line: the JSON form,
    without lines, says what the calls alone say."""
    in_loop = diagnose(load(DATA / "in_loop" / "json"))
    assert in_loop.line.startswith(
        "rank 1 never issued all_reduce #4 (group default, 289 float32); rank 0 waits in it at ?"
    )
    uneven = diagnose(load(DATA / "uneven" / "json"))
    assert uneven.line == (
        "ranks disagree at collective #3 (group default): rank 0 all_reduce "
        "[289] float32 at ?; rank 1 barrier [] at ?"
    )
    assert main([str(DATA / "uneven" / "json")]) == 0
    listing = capsys.readouterr().out.splitlines()[1]
    assert listing.endswith(
        "(no stacks in their entries, as in torch's JSON dumps: no source lines):"
    )


@pytest.mark.unit
def test_torch_dumps_name_no_function():
    """What the safe reader relies on: torch's pickles hold dicts, lists, tuples, strings,
    numbers, nothing a reader would call."""
    calls = {
        "GLOBAL",
        "STACK_GLOBAL",
        "REDUCE",
        "INST",
        "OBJ",
        "NEWOBJ",
        "NEWOBJ_EX",
        "BUILD",
        "EXT1",
        "EXT2",
        "EXT4",
        "PERSID",
        "BINPERSID",
    }
    for path in sorted(DATA.glob("*/pickle/fr_rank*")):
        ops = {op.name for op, _, _ in pickletools.genops(path.read_bytes())}
        assert not ops & calls, (path, ops & calls)


def evil_dump(folder: Path, func, arg: str) -> Path:
    """A dump whose unpickling would call ``func(arg)``."""

    class Payload:
        def __reduce__(self):
            return func, (arg,)

    folder.mkdir(parents=True, exist_ok=True)
    write(folder, 0, steps(2))
    rec = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [Payload()]}
    path = folder / "fr_rank1"
    path.write_bytes(pickle.dumps(rec))
    return path


@pytest.mark.unit
@pytest.mark.parametrize("how", ["os.system", "builtins.exec"])
def test_a_crafted_dump_is_refused_and_runs_nothing(tmp_path, how):
    marker = tmp_path / "ran"
    if how == "os.system":
        path = evil_dump(tmp_path / "dumps", os.system, f"touch {marker}")
        asks = f"{os.system.__module__}.system"  # posix.system on Linux
    else:
        path = evil_dump(tmp_path / "dumps", exec, f"open({str(marker)!r}, 'w').close()")
        asks = "builtins.exec"
    ops = {op.name for op, _, _ in pickletools.genops(path.read_bytes())}
    assert "REDUCE" in ops and ops & {"STACK_GLOBAL", "GLOBAL"}  # a plain load would call it
    proc = hang([tmp_path / "dumps"])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {path}: refused: the pickle asks for {asks}, which a flight-recorder dump "
        "never holds (it could run code)"
    ]
    with pytest.raises(DumpError, match="refused"):
        load(tmp_path / "dumps")
    assert not marker.exists()


@pytest.mark.unit
def test_typed_lists_of_torchs_pickler_are_read_as_lists(tmp_path):
    """torch's TorchScript pickler writes typed lists through ``torch.jit._pickle``'s
    ``build_intlist``: admitted, read as the list (torch not asked)."""
    import torch.jit._pickle as jp

    class IntList(list):
        def __reduce__(self):
            return jp.build_intlist, (list(self),)

    entries = steps(2)
    entries[1]["input_sizes"] = [IntList([1000])]
    rec = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}
    data = pickle.dumps(rec)
    assert b"build_intlist" in data
    (tmp_path / "fr_rank0").write_bytes(data)
    write(tmp_path, 1, steps(2), job=None)
    d = load(tmp_path)
    assert d.ranks[0].record["entries"][1]["input_sizes"] == [[1000]]
    assert diagnose(d).kind == "none"


def old_torch(entry: dict) -> dict:
    """The entry as the recorder's format 1.x (torch before 2.4) wrote it: ``seq_id``, no
    ``collective_seq_id``, ``p2p_seq_id``, ``is_p2p``, no dtypes."""
    e = {
        k: v
        for k, v in entry.items()
        if k not in ("collective_seq_id", "p2p_seq_id", "is_p2p", "input_dtypes", "output_dtypes")
    }
    return {**e, "seq_id": entry["collective_seq_id"]}


@pytest.mark.unit
def test_dumps_of_older_torch_that_name_seq_id_are_read(tmp_path):
    send = {**call(3), "profiling_name": "nccl:send 0->1"}
    recv = {**call(3), "profiling_name": "nccl:recv 1<-0"}
    r0 = [*steps(2), send, call(4, line=42)]
    r1 = [*steps(2), recv, call(4, shape=(999,), line=42)]
    for rank, entries in ((0, r0), (1, r1)):
        write(tmp_path, rank, [old_torch(e) for e in entries], job=None)
        rec = pickle.loads((tmp_path / f"fr_rank{rank}").read_bytes())
        (tmp_path / f"fr_rank{rank}").write_bytes(pickle.dumps({**rec, "version": "1.5"}))
    diag = diagnose(load(tmp_path))
    assert diag.kind == "disagree"
    assert diag.line == (
        "ranks disagree at collective #4 (group default): rank 0 "
        "all_reduce [1000] at train.py:42; rank 1 all_reduce [999] at "
        "train.py:42"
    )
    proc = hang([tmp_path, "--torch"])  # torch's analyser of today reads no 1.x entry
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == diag.line
    assert "torch's analyser could not read these dumps: " in proc.stdout.splitlines()[-1]


def p2p(seq: int, op: str) -> dict:
    """A point-to-point entry as gloo would name it: no peer in its name."""
    return {
        **call(seq),
        "is_p2p": True,
        "p2p_seq_id": seq,
        "collective_seq_id": 0,
        "profiling_name": f"gloo:{op}",
    }


@pytest.mark.unit
@pytest.mark.parametrize("case", ["empty_pg_config", "p2p"])
def test_torch_analyser_failing_is_a_line_and_the_diagnosis_stands(tmp_path, case):
    if case == "p2p":
        write(tmp_path, 0, [*steps(2), p2p(1, "send"), call(3)])
        write(tmp_path, 1, [*steps(2), p2p(1, "recv")])
        says = "torch's analyser could not read these dumps: AssertionError"
    else:
        for rank, n in ((0, 3), (1, 2)):
            write(tmp_path, rank, steps(n), job=None)
            rec = pickle.loads((tmp_path / f"fr_rank{rank}").read_bytes())
            (tmp_path / f"fr_rank{rank}").write_bytes(pickle.dumps({**rec, "pg_config": {}}))
        says = "torch's analyser could not read these dumps: KeyError: ('0', 0)"
    d = load(tmp_path)
    assert summary(d) == says
    proc = hang([tmp_path, "--torch"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "rank 1 never issued all_reduce #3 (group default, 1,000 "
        "float32); rank 0 waits in it at train.py:10"
    )
    assert lines[-1] == says


def _rewrite(path: Path, **changes) -> None:
    path.write_bytes(pickle.dumps({**pickle.loads(path.read_bytes()), **changes}))


@pytest.mark.unit
@pytest.mark.parametrize(
    "case",
    [
        "no_seq",
        "no_group",
        "entries_no_list",
        "entry_no_table",
        "pg_config",
        "stacks",
        "stacks_unreadable",
        "json_truncated",
        "worlds",
    ],
)
def test_bad_dumps_are_one_line_naming_the_file(tmp_path, case):
    write(tmp_path, 0, steps(2), job=None)
    write(tmp_path, 1, steps(2), job=None, world=3 if case == "worlds" else 2)
    path = tmp_path / "fr_rank1"
    if case == "worlds":
        said = (
            f"{tmp_path}: dumps of different jobs mixed: fr_rank0 (world 2) and fr_rank1 (world 3)"
        )
    elif case == "no_group":
        _rewrite(
            path, entries=[{k: v for k, v in e.items() if k != "process_group"} for e in steps(2)]
        )
        said = (
            f"{path}: entry 0 is not a flight-recorder entry (no process_group (name, description))"
        )
    elif case == "stacks_unreadable":
        path = tmp_path / "stacks_rank1.json"
        path.write_text('{"rank": 1, ')
        said = f"{path}: unreadable stacks file (JSONDecodeError)"
    elif case == "no_seq":
        _rewrite(
            path,
            entries=[{k: v for k, v in e.items() if k != "collective_seq_id"} for e in steps(2)],
        )
        said = (
            f"{path}: entry 0 is not a flight-recorder entry (no sequence number: neither "
            "collective_seq_id nor seq_id)"
        )
    elif case == "entries_no_list":
        _rewrite(path, entries={"a": 1})
        said = f"{path}: not a flight-recorder dump (no entries)"
    elif case == "entry_no_table":
        _rewrite(path, entries=[*steps(1), "all_reduce"])
        said = f"{path}: entry 1 is not a flight-recorder entry (not a table)"
    elif case == "pg_config":
        _rewrite(path, pg_config=["0"])
        said = f"{path}: not a flight-recorder dump (pg_config is no table)"
    elif case == "stacks":
        path = tmp_path / "stacks_rank1.json"
        path.write_text("[1, 2]")
        said = f"{path}: unreadable stacks file (not a table)"
    else:
        path.write_text(json.dumps(pickle.loads(path.read_bytes()))[:-20])
        said = f"{path}: truncated or not a flight-recorder dump (JSONDecodeError)"
    proc = hang([tmp_path])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: {said}"]


@pytest.mark.unit
def test_a_diagnosis_that_fails_is_one_line_naming_where(tmp_path, capsys, monkeypatch):
    """A bug of the diagnosis (here made on purpose) is one line on stderr naming the error and
    the suite's line it came from; each rank's calls still listed; exit 2."""
    dg = importlib.import_module("bench.hang.diagnose")  # the package's name is the function's

    def broken(*_):
        raise TypeError("'numpy.dtypes.ObjectDType' object is not iterable")

    write(tmp_path, 0, steps(3), job=None)
    write(tmp_path, 1, steps(2), job=None)
    monkeypatch.setattr(dg, "_disagreement", broken)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert len(out.err.splitlines()) == 1, out.err
    assert re.fullmatch(
        rf"error: could not diagnose {re.escape(str(tmp_path))}: TypeError: 'numpy.dtypes."
        r"ObjectDType' object is not iterable \(at diagnose\.py:\d+: a bug of bench.hang; please "
        r"report it with the dumps\)\n",
        out.err,
    ), out.err
    assert "rank 0: last calls all_reduce #3 (group 0) at train.py:10" in out.out


@pytest.mark.e2e
@pytest.mark.timeout(90)
def test_a_users_script_run_now_is_diagnosed(tmp_path, capsys):
    """The scenario of the issue, made here: two ranks of ``user_script.py``, torch's dumps
    (each rank bounded by ``make_dumps.RANK_TIMEOUT_S``, killed past it)."""
    ranks = make_dumps().launch("after_loop", tmp_path)
    assert [p.returncode for p in ranks] == [1, 0], [p.stdout for p in ranks]
    want = expected("after_loop")
    for form, line in (("pickle", want), ("json", _no_lines(want))):
        assert main([str(tmp_path / form)]) == 0
        out = capsys.readouterr()
        assert (out.out.splitlines()[0], out.err) == (line, "")


@pytest.mark.e2e
@pytest.mark.timeout(30)
def test_the_generator_kills_what_outlives_its_bound(tmp_path, monkeypatch):
    """``launch`` bounds each rank and ends it: a rank that would hang forever is killed."""
    gen = make_dumps()
    started = []
    real = subprocess.Popen

    def sleeper(cmd, **kw):
        p = real([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
        started.append(p)
        return p

    monkeypatch.setattr(gen, "RANK_TIMEOUT_S", 0.5)
    monkeypatch.setattr(gen.subprocess, "Popen", sleeper)
    with pytest.raises(subprocess.TimeoutExpired):
        gen.launch("none", tmp_path)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


@pytest.mark.unit
def test_dumps_without_collectives_say_so(tmp_path):
    write(tmp_path, 0, [p2p(1, "send")], world=3, job=None)
    write(tmp_path, 1, [p2p(1, "recv")], world=3, job=None)
    diag = diagnose(load(tmp_path))
    assert (diag.kind, diag.line) == (
        "none",
        "no collective in the dumps: nothing to compare (no dump from rank 2)",
    )


@pytest.mark.unit
def test_a_rank_without_dump_is_named_after_the_cause(tmp_path):
    write(tmp_path, 0, [*steps(2), call(3, line=42)], world=3, job=None)
    write(tmp_path, 1, [*steps(2), call(3, shape=(999,), line=42)], world=3, job=None)
    diag = diagnose(load(tmp_path))
    assert diag.kind == "disagree"
    assert diag.line.endswith(
        "rank 1 all_reduce [999] float32 at train.py:42 (no dump from rank 2)"
    )


@pytest.mark.unit
def test_without_frames_a_skip_across_groups_reads_as_the_deadlock_the_calls_show(tmp_path):
    """The skip is told by the lines of the steps before (``tests/test_hang.py``): without them
    (torch's JSON form) each rank waits in a group where the other is behind."""
    from tests.test_hang import across_groups

    for rank, entries in enumerate(across_groups()):
        write(tmp_path, rank, [{**e, "frames": []} for e in entries], job=None)
    diag = diagnose(load(tmp_path))
    assert diag.kind == "cycle", diag.line
    assert "a deadlock across group 1 and group default" in diag.line
    assert "at ?" in diag.line


def _plain_dumps(folder: Path, form: str, change) -> Path:
    """Two ranks' dumps of plain data (no function named: the unpickler admits them), as torch
    writes them in ``form``; ``change(record)`` edits rank 1's. Returns rank 1's path."""
    for rank in (0, 1):
        write(folder, rank, steps(2), job=None)
    path = folder / "fr_rank1"
    rec = pickle.loads(path.read_bytes())
    change(rec)
    if form == "json":
        path.write_text(json.dumps(rec))
    else:
        path.write_bytes(pickle.dumps(rec))
    return path


def _one_line_exit_2(folder: Path, capsys) -> list[str]:
    """``--torch`` on ``folder``, in this process: exit 2, nothing on stdout; stderr's lines."""
    with pytest.raises(SystemExit) as e:
        main([str(folder), "--torch"])
    out = capsys.readouterr()
    assert e.value.code == 2
    assert out.out == ""
    return out.err.splitlines()


@pytest.mark.unit
@pytest.mark.parametrize("form", ["json", "pickle"])
@pytest.mark.parametrize("quoted", [True, False], ids=["quoted", "bare"])
def test_a_group_whose_ranks_are_code_is_refused_and_runs_nothing(tmp_path, capsys, form, quoted):
    """torch's analyser evaluates a group's ``ranks`` that it cannot read as a literal list (a
    quoted expression reads as a string, which it then runs): the loader refuses any ``ranks``
    that is not a list of integers, before torch's analyser sees it."""
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    ranks = repr(code) if quoted else code

    def change(rec):
        rec["pg_config"]["0"]["ranks"] = ranks

    path = _plain_dumps(tmp_path / "dumps", form, change)
    lines = _one_line_exit_2(tmp_path / "dumps", capsys)
    assert not marker.exists()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: refused: pg_config group '0': ranks is ")
    assert lines[0].endswith(", not a list of integers (torch's analyser would run it as code)"), (
        lines[0]
    )
    with pytest.raises(DumpError, match="refused: pg_config group '0': ranks"):
        load(tmp_path / "dumps")
    assert not marker.exists()


def _set_group(**fields):
    return lambda rec: rec["pg_config"]["0"].update(fields)


def _set_entry(**fields):
    return lambda rec: rec["entries"][0].update(fields)


def _set_record(**fields):
    return lambda rec: rec.update(fields)


BAD_FIELDS = {
    "ranks_of_strings": (
        _set_group(ranks=["0", "1"]),
        "not a flight-recorder dump (pg_config group '0': ranks is not a list of integers)",
    ),
    "ranks_a_number": (
        _set_group(ranks=2),
        "not a flight-recorder dump (pg_config group '0': ranks is not a list of integers)",
    ),
    "ranks_text_of_strings": (
        _set_group(ranks="['0', '1']"),
        "not a flight-recorder dump (pg_config group '0': ranks is not a list of integers)",
    ),
    "ranks_text_of_code": (
        _set_group(ranks="[0, 1] + __import__('os').getpid()"),
        "refused: pg_config group '0': ranks is \"[0, 1] + __import__('os').getpid()\", not a "
        "list of integers (torch's analyser would run it as code)",
    ),
    "ranks_text_long": (
        _set_group(ranks="'" + "x" * 100 + "'"),
        # the value shown in 48 characters at most: one short line
        "refused: pg_config group '0': ranks is \"'" + "x" * 43 + "..., not a list of integers "
        "(torch's analyser would run it as code)",
    ),
    "desc": (
        _set_group(desc=["default_pg"]),
        "not a flight-recorder dump (pg_config group '0': desc is no string)",
    ),
    "group_no_table": (
        lambda rec: rec["pg_config"].update({"0": "[0, 1]"}),
        "not a flight-recorder dump (pg_config group '0' is no table)",
    ),
    "group_name": (
        lambda rec: rec.update(pg_config={0: rec["pg_config"]["0"]}),
        "not a flight-recorder dump (pg_config group 0: its name is no string)",
    ),
    "version": (
        _set_record(version=2.1),
        "not a flight-recorder dump (version is not a string)",
    ),
    "sizes": (
        _set_entry(input_sizes="[[1000]]"),
        "entry 0 is not a flight-recorder entry (input_sizes is not a list of shapes (lists "
        "of integers))",
    ),
    "dtypes": (
        _set_entry(output_dtypes=[7]),
        "entry 0 is not a flight-recorder entry (output_dtypes is not a list of strings)",
    ),
    "profiling_name": (
        _set_entry(profiling_name=["gloo:all_reduce"]),
        "entry 0 is not a flight-recorder entry (profiling_name is not a string)",
    ),
    "state": (
        _set_entry(state=None),
        "entry 0 is not a flight-recorder entry (state is not a string)",
    ),
    "seq": (
        _set_entry(collective_seq_id="1"),
        "entry 0 is not a flight-recorder entry (collective_seq_id is not an integer)",
    ),
    "record_id": (
        _set_entry(record_id=1.5),
        "entry 0 is not a flight-recorder entry (record_id is not an integer)",
    ),
    "is_p2p": (
        _set_entry(is_p2p="no"),
        "entry 0 is not a flight-recorder entry (is_p2p is not true or false)",
    ),
    "group_of_entry": (
        _set_entry(process_group=[0, "default_pg"]),
        "entry 0 is not a flight-recorder entry (process_group is not a (name, description) "
        "pair of strings)",
    ),
    "frames": (
        _set_entry(frames=[{"name": "step", "filename": "/job/train.py", "line": "10"}]),
        "entry 0 is not a flight-recorder entry (frames is not a list of frames (name, "
        "filename: strings; line: an integer))",
    ),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_a_field_torchs_analyser_reads_must_be_its_type(tmp_path, capsys, case):
    """Every field handed to torch's analyser is checked by the loader to be the data it must
    be: anything else is one line naming the file and the field, exit 2, torch never asked."""
    change, said = BAD_FIELDS[case]
    form = "pickle" if case == "group_name" else "json"  # JSON names its keys by strings
    path = _plain_dumps(tmp_path, form, change)
    assert _one_line_exit_2(tmp_path, capsys) == [f"error: {path}: {said}"]


@pytest.mark.unit
@pytest.mark.parametrize("ranks", [[0, 1], (0, 1), "[0,1]", "(0, 1)"], ids=repr)
def test_ranks_as_a_list_or_its_literal_text_are_read_and_handed_to_torch_as_text(tmp_path, ranks):
    """A group's ranks may be a list of integers or its plain literal text: torch's analyser is
    handed the text its own dumps hold (``"[0, 1]"``), which it reads as a literal."""
    for rank, last in ((0, call(3, line=42)), (1, call(3, shape=(999,), line=42))):
        write(tmp_path, rank, [*steps(2), last], job=None)
        path = tmp_path / f"fr_rank{rank}"
        rec = pickle.loads(path.read_bytes())
        rec["pg_config"]["0"]["ranks"] = ranks
        path.write_bytes(pickle.dumps(rec))
    d = load(tmp_path)
    assert d.world == [0, 1]
    assert all(r.record["pg_config"]["0"]["ranks"] == [0, 1] for r in d.ranks.values())
    found = first_problem(d)
    assert (found.group, found.seq, found.name) == ("0", 3, "all_reduce")
