"""The run folder stands on its own: the reading side needs nothing of the side that ran it.

``tests/data/runs/`` holds a small real run made with this layout's first version (a 2-rank
bucket sweep of the seed MLP, its traces gzipped, and a message_size run of the same machine).
Every later version must keep reading it.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.report.__main__ import main as report_main
from bench.runfolder import columns
from bench.runfolder.points import POINTS_FILE, RunFolderError, read_points
from bench.runfolder.schema import SCHEMA_VERSION, read_run

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "runs"
BUCKET, COLLECTIVES = RUNS / "bucket2", RUNS / "collectives2"
# What the running side is: with these unimportable, the reading side must still work.
RUNNING_SIDE = (
    "bench.runner",
    "parallel_kernels.strategies",
    "parallel_kernels.knobs",
    "parallel_kernels.models",
    "parallel_kernels.collectives",
)

READ_EVERYTHING = """
import io, json, re, sys, contextlib
from pathlib import Path
blocked = {blocked!r}
for name in blocked:
    sys.modules[name] = None  # ``import name`` (and its submodules) now raises ImportError
from bench.report.page import write_report
from bench.analysis.__main__ import main as analyse
from bench.model.__main__ import main as model
out = {{}}
report, cmp = write_report(Path({run!r}), Path({tmp!r}) / "reports", baseline=Path({run!r}),
                           collectives=[Path({coll!r})])
html = report.read_text()
out["images"] = html.count("data:image/png;base64,")
out["report"] = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "IMG", html)
out["comparison"] = cmp.to_dict(orient="records")
for name, argv in (("analysis", [str(Path({run!r}) / "traces" / "mlp-bucket_cap_mb=25-native"),
                                 "--json"]),
                   ("validate", ["validate", "--collectives", {coll!r}, {run!r}, "--json"])):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = (analyse if name == "analysis" else model)(argv)
    out[name] = [code, json.loads(buf.getvalue())]
out["running_side_loaded"] = sorted(n for n in sys.modules if n in blocked and sys.modules[n])
print(json.dumps(out, default=str))
"""


def read_everything(
    tmp: Path, blocked: tuple[str, ...], run: Path = BUCKET, coll: Path = COLLECTIVES
) -> dict:
    code = READ_EVERYTHING.format(blocked=list(blocked), run=str(run), coll=str(coll), tmp=str(tmp))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_report_baseline_analysis_and_model_read_the_folder_without_the_running_side(tmp_path):
    normal = read_everything(tmp_path / "a", ())
    alone = read_everything(tmp_path / "b", RUNNING_SIDE)
    assert alone["running_side_loaded"] == []
    for key in ("report", "images", "comparison", "analysis", "validate"):
        assert alone[key] == normal[key], key
    # and what was read is the real thing: four points, each predicted, traces analysed
    assert normal["images"] >= 4 and "mlp-bucket_cap_mb=25-native" in normal["report"]
    assert len(normal["comparison"]) == 4
    code, validate = normal["validate"]
    assert code == 0 and len(validate["points"]) == 4
    assert all(p["predicted_step_ms"] > 0 for p in validate["points"])
    assert normal["analysis"][0] == 0 and len(normal["analysis"][1]["ranks"]) == 2


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_a_run_made_now_reads_the_same_without_the_running_side(tmp_path, model_runs):
    """Today's code writes a run folder (and a collectives run of this machine: the session's
    ``model_runs``, copied); read with the running side unimportable, it gives what it gives
    with it."""
    run, coll = tmp_path / "bucket", tmp_path / "coll"
    shutil.copytree(model_runs / "train", run)
    shutil.copytree(model_runs / "coll", coll)
    results, samples = pd.read_csv(coll / "results.csv"), pd.read_csv(coll / "samples.csv")
    dropped = set(results.loc[results["collective"] == "reduce_scatter", "point"])
    assert dropped  # a collectives run without reduce-scatter, as if it had timed none
    results[~results["point"].isin(dropped)].to_csv(coll / "results.csv", index=False)
    samples[~samples["point"].isin(dropped)].to_csv(coll / "samples.csv", index=False)
    normal = read_everything(tmp_path / "a", (), run, coll)
    alone = read_everything(tmp_path / "b", RUNNING_SIDE, run, coll)
    for key in ("report", "images", "comparison", "analysis", "validate"):
        assert alone[key] == normal[key], key
    assert len(normal["validate"][1]["points"]) == 4
    # a collectives run without reduce-scatter: the what-if says so instead of failing
    assert "No what-if (fitted gloo collectives" in normal["report"]
    assert "has no native reduce_scatter" in normal["report"]


@pytest.mark.unit
def test_the_committed_run_is_read_with_its_points_records():
    run = read_run(BUCKET)
    assert run.meta["schema_version"].split(".")[0] == SCHEMA_VERSION.split(".")[0]
    assert set(run.points) == set(run.results["point"])
    rec = run.points["mlp-bucket_cap_mb=1-reference"]
    assert rec.knobs["bucket_cap_mb"] == 1.0 and rec.defaults["bucket_cap_mb"] == 25.0
    assert rec.impl_facts["buckets"] == "reference" and rec.impl_facts["native"] is False
    assert rec.figures["params"] == 235146 and rec.world_size == 2
    # schema 2.0: today's columns less those 2.1 added; read as one round
    written = columns.written(columns.TRAINING)
    assert set(run.results.columns) < set(written) and (run.results["round"] == 1).all()
    assert (run.samples["round"] == 1).all() and run.noise.empty


@pytest.mark.unit
def test_docs_list_the_column_table():
    text = (REPO / "docs" / "outputs.md").read_text()
    block = re.search(r"<!-- columns:start -->\n(.*)\n<!-- columns:end -->", text, re.S)
    assert block and block.group(1) == columns.docs_block()


@pytest.mark.unit
def test_each_table_gives_its_report_and_console_columns_one_place_each():
    for table in (columns.TRAINING, columns.COLLECTIVE, columns.REPLAY):
        for where in ("report", "console"):
            places = [getattr(c, where) for c in table if getattr(c, where)]
            assert sorted(places) == list(range(1, len(places) + 1)), (where, places)
        names = [c.name for c in table]
        assert len(names) == len(set(names))
    # the console's closing table is the column table's, in its order
    assert columns.console_columns(columns.TRAINING)[:3] == ["model", "value", "value2"]


@pytest.mark.unit
def test_the_console_leaves_out_a_knob_every_row_holds_at_its_default():
    df = pd.DataFrame(
        {
            "activation_checkpointing": ["off", "selective:op"],
            "recompute_flops_per_step": [0.0, 0.0],
            "compile": ["off", "off"],
            "peak_mem_mb": [1.0, 1.0],  # no quiet value: a figure is always said
        }
    )
    assert columns.quiet_columns(columns.TRAINING, df) == ["recompute_flops_per_step", "compile"]


@pytest.mark.unit
def test_the_writer_refuses_a_column_it_does_not_know(tmp_path):
    from bench.runfolder.folder import ResultsWriter

    writer = ResultsWriter(tmp_path / "results.csv", columns.written(columns.TRAINING))
    with pytest.raises(KeyError, match="no column step_time"):
        writer.append({"sweep": "x", "step_time": 1.0})


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(BUCKET, out)
    return out


def _report(run: Path, capsys) -> tuple[int, str]:
    code = report_main([str(run), "--reports-dir", str(run.parent / "reports")])
    return code, capsys.readouterr().err


@pytest.mark.unit
def test_bad_run_folders_are_one_line_and_exit_2(tmp_path, capsys):
    run = _copy(tmp_path)
    (run / POINTS_FILE).unlink()
    code, err = _report(run, capsys)
    assert code == 2 and err.count("\n") == 1 and "no points record" in err

    run = _copy(tmp_path / "corrupt")
    (run / POINTS_FILE).write_text('{"id": "x", "sweep"\n')
    code, err = _report(run, capsys)
    assert code == 2 and err.count("\n") == 1 and "points.jsonl:1 is not JSON" in err

    run = _copy(tmp_path / "incomplete")
    (run / POINTS_FILE).write_text('{"id": "x"}\n')
    code, err = _report(run, capsys)
    assert code == 2 and "point record is incomplete" in err

    for version, says in (
        ("3.0", "newer than this parallel-bench reads"),
        ("1", "parallel-bench 0.1 reads it"),
    ):
        run = _copy(tmp_path / version)
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps({**meta, "schema_version": version}))
        code, err = _report(run, capsys)
        assert code == 2 and err.count("\n") == 1 and says in err, err

    code, err = _report(tmp_path / "nothing", capsys)
    assert code == 2 and "is not a run folder (no meta.json)" in err


@pytest.mark.unit
def test_a_minor_version_is_read(tmp_path):
    run = _copy(tmp_path)
    meta = json.loads((run / "meta.json").read_text())
    major = SCHEMA_VERSION.split(".")[0]
    (run / "meta.json").write_text(json.dumps({**meta, "schema_version": f"{major}.9"}))
    # a newer minor version may add fields: they are left aside
    lines = (run / POINTS_FILE).read_text().splitlines()
    added = [json.dumps({**json.loads(line), "added_later": 1}) for line in lines]
    (run / POINTS_FILE).write_text("\n".join(added) + "\n")
    assert read_points(run) == read_run(BUCKET).points
    with pytest.raises(RunFolderError, match="incomplete"):
        (run / POINTS_FILE).write_text(json.dumps({"id": "x", "added_later": 1}) + "\n")
        read_points(run)
