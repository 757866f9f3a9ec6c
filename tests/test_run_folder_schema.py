"""Every reading command reads a run folder through one validating reader
(``bench/runfolder/schema.py``): a folder the schema does not allow is one line naming the file
and the field, and exit 2, in the report, ``--baseline``, ``bench.model validate`` and
``whatif`` alike, never a traceback.

The crafted folders are copies of the committed runs (``tests/data/runs``) with one thing
wrong each: the cases an attack on the suite found.
"""

import contextlib
import io
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from bench.model.__main__ import main as model_main
from bench.report.__main__ import main as report_main
from bench.runfolder.points import RunFolderError
from bench.runfolder.schema import read_run, read_verdicts

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "runs"
BUCKET, COLLECTIVES = RUNS / "bucket2", RUNS / "collectives2"


def _meta(key: str, value) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps({**meta, key: value}))

    return edit


def _table(name: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        change(pd.read_csv(run / name)).to_csv(run / name, index=False)

    return edit


def _cell(column: str, value) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(df: pd.DataFrame) -> pd.DataFrame:
        df[column] = df[column].astype(object)
        df.loc[0, column] = value
        return df

    return change


def _drop(column: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda df: df.drop(columns=[column])


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


def _directory(name: str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        (run / name).unlink()
        (run / name).mkdir()

    return edit


# case -> (edit of a copy of the training run, the file and field the one line must name)
TRAINING = {
    "meta.config a list": (_meta("config", [1, 2]), "meta.json", "'config'"),
    "meta.sweep a number": (_meta("sweep", 7), "meta.json", "'sweep'"),
    "meta.kind a number": (_meta("kind", 3), "meta.json", "'kind'"),
    "meta.world_size text": (_meta("world_size", "two"), "meta.json", "'world_size'"),
    "meta.argv text": (_meta("argv", "x"), "meta.json", "'argv'"),
    "results without status": (_table("results.csv", _drop("status")), "results.csv", "status"),
    "results without point": (_table("results.csv", _drop("point")), "results.csv", "point"),
    "results without model": (_table("results.csv", _drop("model")), "results.csv", "model"),
    "results without value": (_table("results.csv", _drop("value")), "results.csv", "value"),
    "results a directory": (_directory("results.csv"), "results.csv", "not a file"),
    "results binary": (_write("results.csv", "\x00\x01garbage\n\x7f"), "results.csv", "column"),
    "step time text": (
        _table("results.csv", _cell("step_ms_median", "fast")),
        "results.csv",
        "step_ms_median",
    ),
    "peak memory text": (
        _table("results.csv", _cell("peak_mem_mb", "lots")),
        "results.csv",
        "peak_mem_mb",
    ),
    "status neither ok nor error": (
        _table("results.csv", _cell("status", "maybe")),
        "results.csv",
        "status",
    ),
    "point id climbing out": (
        _table("results.csv", _cell("point", "x/../../..")),
        "results.csv",
        "point",
    ),
    "noise garbage": (_write("noise.csv", "a,b\n1,2\nx\n"), "noise.csv", "column"),
    "noise text": (
        _write("noise.csv", "gap,round,after,ms,ms_min,ms_max,n\nx,1,,2,1,3,5\n"),
        "noise.csv",
        "gap",
    ),
    "samples text": (_table("samples.csv", _cell("ms", "slow")), "samples.csv", "ms"),
    "samples without point": (_table("samples.csv", _drop("point")), "samples.csv", "point"),
    "samples index text": (_table("samples.csv", _cell("index", "first")), "samples.csv", "index"),
    "point record a number id": (_write("points.jsonl", '{"id": 3}\n'), "points.jsonl", "'id'"),
}
COLLECTIVE = {
    "collective time text": (
        _table("results.csv", _cell("time_us", "x")),
        "results.csv",
        "time_us",
    ),
    "collective without size": (
        _table("results.csv", _drop("size_bytes")),
        "results.csv",
        "size_bytes",
    ),
    "collective without collective": (
        _table("results.csv", _drop("collective")),
        "results.csv",
        "collective",
    ),
    "impl_native a list": (_meta("impl_native", [1]), "meta.json", "'impl_native'"),
    "limits text": (_meta("limits", "x"), "meta.json", "'limits'"),
}


def _crafted(tmp_path: Path, base: Path, name: str, edit: Callable[[Path], None]) -> Path:
    run = tmp_path / re.sub(r"\W+", "_", name)
    shutil.copytree(base, run)
    edit(run)
    return run


def _call(main, argv: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


def _commands(run: Path, reports: Path, collective: bool) -> dict[str, tuple]:
    if collective:
        return {
            "report": (report_main, [str(run), "--reports-dir", str(reports)]),
            "validate": (model_main, ["validate", "--collectives", str(run), str(BUCKET)]),
            "whatif": (
                model_main,
                [
                    "whatif",
                    "--collectives",
                    str(run),
                    "--compute",
                    str(BUCKET),
                    "--world-size",
                    "8",
                ],
            ),
        }
    report = [str(run), "--reports-dir", str(reports), "--timelines", "none"]
    return {
        "report": (report_main, report),
        "baseline": (report_main, [str(BUCKET), *report[1:], "--baseline", str(run)]),
        "validate": (model_main, ["validate", "--collectives", str(COLLECTIVES), str(run)]),
        "whatif": (
            model_main,
            [
                "whatif",
                "--collectives",
                str(COLLECTIVES),
                "--compute",
                str(run),
                "--world-size",
                "8",
            ],
        ),
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    "name", [*TRAINING, *COLLECTIVE], ids=lambda n: re.sub(r"\W+", "-", n).strip("-")
)
def test_a_folder_the_schema_does_not_allow_is_one_line_and_exit_2(tmp_path, name):
    collective = name in COLLECTIVE
    edit, file, field = (COLLECTIVE if collective else TRAINING)[name]
    run = _crafted(tmp_path, COLLECTIVES if collective else BUCKET, name, edit)
    for command, (main, argv) in _commands(run, tmp_path / "reports", collective).items():
        code, lines = _call(main, argv)
        assert code == 2 and len(lines) == 1, (command, code, lines)
        assert file in lines[0] and field in lines[0], (command, lines)
        assert "Traceback" not in lines[0]


@pytest.mark.unit
def test_the_committed_runs_pass_the_schema_with_their_figures_as_numbers():
    """What the schema allows is what the suite writes: the committed runs of the first
    version read as before, numbers as numbers."""
    run = read_run(BUCKET)
    assert run.visits["step_ms_median"].dtype.kind == "f"
    assert run.samples["ms"].dtype.kind == "f"
    assert set(run.visits["status"]) == {"ok"}
    assert read_run(COLLECTIVES).visits["time_us"].dtype.kind == "f"


@pytest.mark.unit
def test_bad_verdicts_are_one_line_naming_the_file(tmp_path):
    run = _crafted(tmp_path, BUCKET, "verdicts", _write("verdicts.csv", 'zz\n"unclosed\n'))
    with pytest.raises(RunFolderError, match=r"verdicts.csv is not a CSV table"):
        read_verdicts(run)
    (run / "verdicts.csv").write_text("model,impl\nmlp,native\n")
    with pytest.raises(RunFolderError, match=r"verdicts.csv: no column 'value2'"):
        read_verdicts(run)


@pytest.mark.unit
def test_no_reading_command_opens_a_run_table_but_through_the_schema():
    """The one reader: outside ``bench/runfolder`` (and the self-timing scripts, which read
    their own scratch folders), no module opens results.csv, samples.csv, noise.csv or
    verdicts.csv with pandas or meta.json with json."""
    opened = re.compile(
        r"read_csv\([^)]*(results|samples|noise|verdicts)|"
        r"(results|samples|noise|verdicts)\.csv\"?\)?\s*,?\s*\)?\s*$|"
        r"json\.loads\([^)]*meta\.json"
    )
    offenders = []
    for path in sorted((REPO / "bench").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("bench/runfolder/", "bench/selftime/")):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            pandas = "read_csv(" in line and opened.search(line)
            if pandas or ("json.loads(" in line and "meta.json" in line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, offenders
