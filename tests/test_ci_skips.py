"""Under CI="true" a test that needs something CI installs fails instead of skipping; elsewhere
it skips, saying why; any other skip stays a skip everywhere."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]

TESTS = """
import pytest

@pytest.mark.ci_needs("a tool")
def test_needs_a_tool():
    pytest.skip("no tool here")

@pytest.fixture
def tool():
    pytest.skip("no tool for the fixture")

@pytest.mark.ci_needs("a tool")
def test_needs_a_fixture_that_skips(tool):
    pass

@pytest.mark.ci_needs("a tool")
@pytest.mark.skipif(True, reason="no tool by skipif")
def test_needs_a_tool_by_skipif():
    pass

def test_plain_skip():
    pytest.skip("not about the system")
"""


def outcomes(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_configure, pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_tool.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rfEs",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_tool.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ci", [None, "false", "1"])
def test_outside_ci_they_skip(tmp_path, ci):
    run = outcomes(tmp_path, ci)
    assert run.returncode == 0, run.stdout
    assert "4 skipped" in run.stdout and "failed" not in run.stdout, run.stdout


@pytest.mark.timeout(150)
def test_under_ci_they_fail(tmp_path):
    run = outcomes(tmp_path, "true")
    assert run.returncode == 1, run.stdout
    # a skip in the call is a failure, one in set-up (a fixture, skipif) an error
    assert "1 failed, 1 skipped, 2 errors" in run.stdout, run.stdout
    failed = "FAILED test_tool.py::test_needs_a_tool - CI=true, so a tool must be here"
    assert failed in run.stdout and "test skipped: Skipped: no tool here" in run.stdout
    for name in ("test_needs_a_fixture_that_skips", "test_needs_a_tool_by_skipif"):
        assert f"ERROR test_tool.py::{name}" in run.stdout, run.stdout
    assert "SKIPPED [1] test_tool.py" in run.stdout and "not about the system" in run.stdout
