"""The planner's families (``bench/plan/families.py``): every row maps onto a strategy the planner
can track and schedule, and docs/extending.md's family, registered as the page writes it, is
planned end to end: its memory tracked, its step predicted, its rows' commands resolved through
``bench/run.py``'s own parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from bench.model.predict import SIMULATORS
from bench.plan import __main__ as plan_cli
from bench.plan.families import FAMILIES, family_of
from bench.plan.step_time import OWN_WORK
from bench.runner.cli import resolve
from bench.runner.configure.flags import parse_config
from parallel_kernels.strategies import STRATEGIES

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
EXAMPLE = re.compile(r"<!-- plan example -->\n```python\n(.*?)```", re.S)


@pytest.fixture
def page_family():
    """The page's family, registered as written; the table as it was afterwards."""
    before = dict(FAMILIES)
    (block,) = EXAMPLE.findall(PAGE.read_text())
    exec(compile(block, str(PAGE), "exec"), {"__name__": "extending_plan_example"})
    try:
        (name,) = set(FAMILIES) - set(before)
        yield FAMILIES[name]
    finally:
        FAMILIES.clear()
        FAMILIES.update(before)


def test_every_family_is_a_strategys_implementation_the_planner_schedules():
    for f in FAMILIES.values():
        strategy = STRATEGIES[f.strategy]
        assert f.impl in strategy.impls, f.name
        # its step: a schedule of bench.model, or a pipeline's simulation over its stages
        assert strategy.schedule in SIMULATORS or f.pipelined, f.name
        assert f.layout_knob in {k.param for k in strategy.knobs}, f.name  # its command's sweep
        assert f.own_work in OWN_WORK, f.name
        assert family_of(f.strategy, f.impl) == f.name  # one family per implementation


@pytest.mark.timeout(120)
def test_the_pages_family_is_planned_and_its_commands_run_its_implementation(page_family, tmp_path):
    out = tmp_path / "plan"
    argv = ["--model", "llama:tiny", "--world-size", "2", "--gpus-per-node", "2"]
    argv += ["--device", "h100", "--global-batch", "16", "--family", page_family.name]
    argv += ["--option", "precision=fp32", "--option", "activation_checkpointing=off"]
    argv += ["--workers", "1", "--out", str(out)]
    assert plan_cli.main(argv) == 0
    rows = pd.read_csv(out / "plan.csv", keep_default_na=False)
    # one layout at 8, 4 x 2, 2 x 4 and 1 x 8 samples per replica
    assert len(rows) == 4 and set(rows["family"]) == {page_family.name}
    assert set(rows["strategy"]) == {"ddp"} and set(rows["impl"]) == {"reference"}
    for _, r in rows.iterrows():
        assert r["error"] == "" and r["time_error"] == "", (r["error"], r["time_error"])
        assert float(r["peak_mem_gib"]) > 0 and float(r["step_ms"]) > 0
        args = shlex.split(r["command"])
        (point,) = resolve(parse_config(args[args.index("bench/run.py") + 1 :]), 2).points
        assert (point.strategy, point.impl) == ("ddp", "reference")
        assert point.knobs["bucket_cap_mb"] == 25.0
        assert point.knobs["grad_accum"] == r["grad_accum"]
        assert point.batch_per_replica == r["micro_batch"]
