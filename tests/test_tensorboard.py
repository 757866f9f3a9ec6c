"""TensorBoard with torch-tb-profiler on a small generated run: every point a run, every rank a
worker, the overview and the distributed view filled, and the sweep's scalars browsable. One
TensorBoard serves both tests: the plugin's HTTP API, then the pages as headless Chromium loads
them. The profiler plugin's page loads Google Charts from www.gstatic.com and waits for it
before it draws any view, so on a machine without internet its views spin forever: the browser
test says so with a warning and checks the rest (docs/tensorboard.md)."""

import contextlib
import json
import os
import select
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pandas as pd
import pytest

# Both are declared dependencies (tensorboard, and torch-tb-profiler in the test extra): a
# missing one fails here rather than skipping.
import tensorboard  # noqa: F401
import torch_tb_profiler  # noqa: F401

from bench.report.tb_scalars import write_sweep_scalars
from tests.rank_pool import free_port
from tests.test_harness import FAST, point, run_points
from tests.test_report_browser import CHROMIUM, FLAGS, needs_chromium

pytestmark = pytest.mark.browser

GSTATIC = "www.gstatic.com"


def get(base: str, path: str, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=20) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def served(pool, tmp_path_factory):
    """Two points of two ranks each and the sweep's scalars, served by one TensorBoard for the
    module's tests; yields (port, rows, the plugin's run list once loaded)."""
    tmp_path = tmp_path_factory.mktemp("tensorboard")
    traces = tmp_path / "run" / "traces"
    rows = pool(2).run(
        run_points, [point("mlp", "native", 1.0), point("mlp", "reference", 1.0)], str(traces), FAST
    )[0]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    write_sweep_scalars(tmp_path / "run", "bucket_cap_mb", pd.DataFrame(rows))

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(traces),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    base = f"http://127.0.0.1:{port}/data/plugin"
    try:
        deadline, runs = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            try:
                runs = get(base, "/pytorch_profiler/runs")
                if not runs.get("loading") and len(runs.get("runs", [])) == 2:
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(1)
        yield port, rows, runs
    finally:
        server.terminate()
        server.wait(timeout=20)


@pytest.mark.timeout(240)
def test_profiler_plugin_shows_points_ranks_and_distributed_view(served):
    port, rows, runs = served
    base = f"http://127.0.0.1:{port}/data/plugin"
    expected = sorted(r["point"] for r in rows)
    assert sorted(runs["runs"]) == expected, runs
    for run in expected:
        views = get(base, "/pytorch_profiler/views", run=run)
        assert "Overview" in views and "Distributed" in views, views
        assert get(base, "/pytorch_profiler/workers", run=run, view="Overview") == [
            "rank0",
            "rank1",
        ]
        span = get(base, "/pytorch_profiler/spans", run=run, worker="rank0")[0]
        overview = get(base, "/pytorch_profiler/overview", run=run, worker="rank0", span=span)
        assert overview["steps"]["rows"], overview
        overlap = get(
            base, "/pytorch_profiler/distributed/overlap", run=run, worker="All", span=span
        )
        assert set(overlap["data"]["all"]) == {"rank0", "rank1"}
        ops = get(base, "/pytorch_profiler/distributed/commops", run=run, worker="All", span=span)
        assert ops["data"]["rank0"]["rows"], ops
    tags = get(base, "/scalars/tags")
    assert "step_ms_median/mlp/native" in tags["sweep_scalars"], tags


# Runs argv[3:] with the pipe ends argv[1] and argv[2] on fds 3 and 4: moved above 9 first, so
# that neither is overwritten on the way (a shell's `3<&N` takes one digit only in dash).
ONTO_FDS_3_AND_4 = """import fcntl, os, sys
high = [fcntl.fcntl(int(fd), fcntl.F_DUPFD_CLOEXEC, 10) for fd in sys.argv[1:3]]
os.dup2(high[0], 3)
os.dup2(high[1], 4)
os.execv(sys.argv[3], sys.argv[3:])"""


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
    it reads NUL-terminated JSON messages on fd 3 and writes its own on fd 4), so a test can
    read the page's JavaScript state with the standard library alone."""

    def __init__(self, profile: Path):
        self.log = profile.with_name("chromium.log")
        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()
        # poll, not select: select refuses a descriptor numbered past 1023, and a worker that
        # has run many launches before this test may hand out one
        self._waiter = select.poll()
        self._waiter.register(self._r, select.POLLIN)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    ONTO_FDS_3_AND_4,
                    str(to_chrome),
                    str(from_chrome),
                    CHROMIUM,
                    *FLAGS,
                    f"--user-data-dir={profile}",
                    "--remote-debugging-pipe",
                    "--window-size=1280,900",
                    "about:blank",
                ],
                pass_fds=(to_chrome, from_chrome),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        os.close(to_chrome)
        os.close(from_chrome)
        self._buf, self._id, self.events = b"", 0, []
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Network"):
                self.send(f"{domain}.enable", session=self.session)
        except BaseException:
            self.close()
            raise

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._waiter.poll(left * 1e3):
                raise TimeoutError("Chromium did not answer over the DevTools pipe")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise EOFError(f"Chromium exited (status {self.proc.poll()}): {tail}")
            self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") != self._id:
                self.events.append(reply)  # an event, kept for the test to read
            elif "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            else:
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.send(
            "Runtime.evaluate", session=self.session, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("text", "the page threw"))
        return result["result"].get("value")

    def wait_for(self, expression: str, ready, timeout: float) -> dict:
        """Evaluate ``expression`` (a dict) every half second until ``ready(value)``, or until
        ``timeout`` seconds have passed; the last value, {} where the page could not answer
        (between two documents, say)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression) or {}
            except RuntimeError:
                value = {}
            if ready(value) or time.monotonic() >= deadline:
                return value
            time.sleep(0.5)

    def requests(self) -> dict[str, str]:
        """Request id -> URL of every request the page made so far."""
        return {
            e["params"]["requestId"]: e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        }

    def failed(self) -> dict[str, str]:
        """URL -> Chromium's error text, of every request that failed so far."""
        urls = self.requests()
        return {
            urls.get(e["params"]["requestId"], "?"): e["params"]["errorText"]
            for e in self.events
            if e.get("method") == "Network.loadingFailed"
        }

    def exceptions(self) -> list[str]:
        return [
            e["params"]["exceptionDetails"].get("exception", {}).get("description", "")[:300]
            for e in self.events
            if e.get("method") == "Runtime.exceptionThrown"
        ]

    def close(self):
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):
            self.send("Browser.close", timeout=10)  # it may close the pipe before it answers
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self._w)
        os.close(self._r)


# Every text node of the page, shadow roots included (TensorBoard's dashboards are Polymer
# elements), and how many plotted lines it holds (the scalars charts draw each run's series as
# an SVG path of class "line").
DEEP_TEXT = """(() => {
  const texts = []; let lines = 0;
  const walk = (root) => {
    const w = document.createTreeWalker(root, NodeFilter.SHOW_ELEMENT | NodeFilter.SHOW_TEXT);
    for (let n = w.currentNode; n; n = w.nextNode()) {
      if (n.nodeType === Node.TEXT_NODE) texts.push(n.nodeValue);
      else if (n.tagName === 'path' && n.classList.contains('line') && n.getAttribute('d')) lines++;
      if (n.shadowRoot) walk(n.shadowRoot);
    }
  };
  walk(document);
  return {text: texts.join(' '), lines: lines};
})()"""

# TensorBoard's page with the profiler plugin selected: the plugin runs in a same-origin
# iframe (data/plugin_entry.html, whose script sends it to data/plugin/pytorch_profiler/
# index.html), so the top page can read the frame's document and whether `google` loaded.
PROFILER = """(() => {
  const frame = document.querySelector('iframe[src*="plugin_entry.html?name=pytorch_profiler"]');
  const out = {title: document.title, frame: frame ? frame.src : null};
  const doc = frame && frame.contentDocument;
  if (doc && doc.body) {
    const main = doc.querySelector('main');
    Object.assign(out, {
      location: doc.location.href,
      text: doc.body.innerText,
      google: typeof frame.contentWindow.google,
      charts: typeof (frame.contentWindow.google || {}).visualization,
      spinning: main ? main.querySelectorAll('[role=progressbar]').length > 0 : null,
    });
  }
  return out;
})()"""


@needs_chromium
@pytest.mark.timeout(300)
def test_pages_load_in_chromium_and_say_when_the_profiler_charts_cannot(served, tmp_path):
    port, rows, _ = served
    origin = f"http://127.0.0.1:{port}"
    points = sorted(r["point"] for r in rows)
    browser = Chromium(tmp_path / "profile")
    try:
        # The scalars dashboard: the sweep's plots, drawn from this server alone. It draws the
        # cards in view only, so any of the run's tags will do.
        tags = get(f"{origin}/data/plugin", "/scalars/tags")["sweep_scalars"]

        def drawn(page: dict) -> bool:
            return any(t in page.get("text", "") for t in tags) and page.get("lines", 0) > 0

        browser.send("Page.navigate", session=browser.session, url=f"{origin}/#scalars")
        page = browser.wait_for(DEEP_TEXT, drawn, timeout=60)
        assert drawn(page), (page.get("text", "")[:2000], browser.exceptions())
        outside = sorted(
            url
            for url in browser.requests().values()
            if not url.startswith((origin, "data:", "blob:", "about:"))
        )
        assert outside == [], f"the scalars dashboard asked for more than TensorBoard: {outside}"

        # The profiler plugin: the app, its frame, and the run, view and worker lists.
        browser.send("Page.navigate", session=browser.session, url=f"{origin}/#pytorch_profiler")

        def listed(state: dict) -> bool:
            text = state.get("text", "")
            return any(p in text for p in points) and "Overview" in text and "rank0" in text

        state = browser.wait_for(PROFILER, listed, timeout=60)
        seen = (state, browser.failed(), browser.exceptions())
        assert state.get("title") == "TensorBoard", seen
        assert state.get("frame"), ("no profiler plugin frame in TensorBoard's page", *seen)
        assert state.get("location") == f"{origin}/data/plugin/pytorch_profiler/index.html", seen
        assert all(w in state.get("text", "") for w in ("Runs", "Views", "Workers")), seen
        assert listed(state), seen

        # Google Charts: loaded from www.gstatic.com by the plugin's page, or not at all.
        if state["google"] == "undefined":
            why = ", ".join(f"{u}: {e}" for u, e in browser.failed().items() if GSTATIC in u)
            shown = "a spinner" if state["spinning"] else "nothing"
            warnings.warn(
                f"the profiler plugin's charts need {GSTATIC}, unreachable here "
                f"({why or 'no answer'}): its views show {shown} in place of charts; the run, "
                "view and worker lists and the scalars dashboard work (docs/tensorboard.md)",
                stacklevel=1,
            )
        else:
            # Online: the Overview replaces the spinner with its charts.
            def drawn_overview(state: dict) -> bool:
                return state.get("spinning") is False and "Step Time Breakdown" in state.get(
                    "text", ""
                )

            state = browser.wait_for(PROFILER, drawn_overview, timeout=60)
            assert drawn_overview(state), (state, browser.exceptions())
    finally:
        browser.close()
