"""The report as a person sees it: rendered by headless Chromium, every figure decoded, nothing
logged as an error, and a screenshot kept for a human look."""

import shutil
import subprocess
from pathlib import Path

import pytest

from bench.report.page import write_report
from tests.report_fixtures import make_training_run
from tests.test_report import POINTS

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
SHOTS = Path(__file__).resolve().parents[1] / "reports"


def needs_chromium(test):
    """Marks a test that drives headless Chromium: it skips, saying why, where Chromium is not
    installed, and under CI=true that skip is a failure (tests/conftest.py)."""
    test = pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed and `make "
        "setup` could not install it (Debian package chromium needs "
        "apt-get as root)",
    )(test)
    return pytest.mark.ci_needs("headless Chromium")(test)


@needs_chromium
@pytest.mark.timeout(180)
def test_report_renders_in_chromium_with_every_figure(tmp_path):
    old = make_training_run(tmp_path / "old", POINTS, seed=1)
    new = make_training_run(
        tmp_path / "new", POINTS, seed=2, failed={("mlp", 1.0, "native"): "RuntimeError: boom"}
    )
    page, _ = write_report(new, tmp_path / "reports", baseline=old)
    url = page.resolve().as_uri()
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile1'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-figures="4/4"' in dom.stdout  # four figures, all decoded
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile2'}",
            "--window-size=1280,3000",
            f"--screenshot={shot}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 50_000  # a page of figures and tables, not a blank screen
    SHOTS.mkdir(exist_ok=True)
    shutil.copy(shot, SHOTS / "test-report-screenshot.png")  # for a person to look at
