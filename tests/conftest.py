import os

import pytest

from bench.runner.session.distenv import TORCHRUN_VARS
from tests.rank_pool import RankPool
from tests.shared_runs import make_ddp_sweep, make_model_runs, shared

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The tiers (pyproject.toml's markers): what a test costs and needs, visible in its file.
TIERS = ("unit", "ranks", "e2e", "browser", "slurm", "bench")
SERIAL = "pytest.mark.serial"  # what the Makefile's serial pass finds a serial test's file by


# The order files run in, in one process (TEST_WORKERS=0): files that launch jobs first, the unit
# tier's short files last. Under pytest-xdist's ``--dist loadfile`` the files start with the
# most tests first, xdist's own order: this one kept there (``--no-loadscope-reorder``) measured
# no faster (docs/benchmarks.md, "make test's time").
START_ORDER = {"e2e": 0, "slurm": 0, "ranks": 1, "browser": 1, "bench": 1, "unit": 2}


def pytest_collection_modifyitems(config, items):
    """Every test in exactly one tier, so that ``-m unit`` (make test-fast) is the unit tier
    and every other tier is in ``make test`` by name; files ordered by ``START_ORDER``."""
    wrong = []
    for item in items:
        tiers = {m.name for m in item.iter_markers() if m.name in TIERS}
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(sorted(tiers)) or 'no tier'}")
    if wrong:
        raise pytest.UsageError(
            f"every test needs exactly one tier marker of {', '.join(TIERS)}: " + "; ".join(wrong)
        )
    serial_files = {i.path for i in items if i.get_closest_marker("serial")}
    unsaid = sorted(str(path) for path in serial_files if SERIAL not in path.read_text())
    if unsaid:
        raise pytest.UsageError(
            f"a serial test's file must say {SERIAL} (the Makefile's serial pass collects the "
            f"files that do, no other): {', '.join(unsaid)}"
        )
    first = {}  # a file's earliest START_ORDER over its tests
    for item in items:
        tier = next(m.name for m in item.iter_markers() if m.name in TIERS)
        first[item.path] = min(first.get(item.path, 2), START_ORDER[tier])
    items.sort(key=lambda item: first[item.path])  # stable: a file's tests keep their order


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "ci_needs(what): the test needs WHAT from the system, which `make test` installs where "
        'it can; it may skip, saying so, except under CI="true", where that skip is a failure',
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip of a ``ci_needs`` test is a failure: CI installs what it needs (the
    Makefile's `system` target, the test extra), so a skip there means something broke."""
    report = yield
    needs = item.get_closest_marker("ci_needs")
    if (
        needs is not None
        and report.skipped
        and not hasattr(report, "wasxfail")
        and os.environ.get("CI") == "true"
    ):
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"CI=true, so {needs.args[0]} must be here, but the test skipped: {why}"
    return report


@pytest.fixture
def no_torchrun(monkeypatch):
    """As outside torchrun: a test run under a launcher must not make a command think it is a
    rank."""
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def pool():
    """``pool(n)``: a live gloo process group of n ranks, shared by the whole session."""
    pools: dict[int, RankPool] = {}

    def get(world_size: int) -> RankPool:
        p = pools.get(world_size)
        if p is None or p.broken:
            p = pools[world_size] = RankPool(world_size)
        return p

    yield get
    for p in pools.values():
        p.close()


@pytest.fixture(scope="session")
def model_runs(tmp_path_factory, worker_id):
    """A collectives run and a bucket sweep predicted with it (tests/shared_runs.py), made once
    for every file that reads them."""
    return shared(tmp_path_factory, worker_id, "model-runs", make_model_runs)


@pytest.fixture(scope="session")
def ddp_sweep(tmp_path_factory, worker_id):
    """The profiled wide_mlp bucket sweep (tests/shared_runs.py), made once for
    test_sequence.py and test_timeline.py; its folder is ``run``."""
    return shared(tmp_path_factory, worker_id, "ddp-sweep", make_ddp_sweep) / "run"
