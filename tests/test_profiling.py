"""The profiled steps' session (bench/runner/measure/profiling.py): it stops only once the
process's other threads are done, as a collective's profiled range may end on gloo's worker
thread after its waiter has gone on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from bench.runner.measure import profiling

pytestmark = pytest.mark.unit


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's /proc only")
def test_the_session_stops_only_after_a_worker_busy_at_the_last_step_is_done(tmp_path, monkeypatch):
    """The last step returns while a thread it started still runs native code (as gloo's
    worker, finishing a call): the session must not stop before that thread is done. Native
    DDP's profiled ranks crashed while their sessions stopped without this wait."""
    alive_at_stop: list[bool] = []
    workers: list[threading.Thread] = []

    class Watched(profiling.profile):
        def stop_trace(self):
            alive_at_stop.append(any(w.is_alive() for w in workers))
            super().stop_trace()

    monkeypatch.setattr(profiling, "profile", Watched)
    a = torch.ones(300, 300)
    a @ a  # its first call loads the kernels: tens of ms, past the wait's bound

    calls: list[int] = []

    def step():
        calls.append(None)
        a.sum()
        if len(calls) == 3:  # the last one
            # One matmul (a few ms) without the interpreter's lock, as gloo's worker runs.
            workers.append(threading.Thread(target=lambda: a @ a, daemon=True))
            workers[0].start()

    trace, active_ms = profiling.profile_steps(
        step,
        trace_dir=tmp_path,
        worker_name="w",
        device=torch.device("cpu"),
        wait=0,
        warmup=1,
        active=2,
    )
    workers[0].join()
    assert trace.is_file() and len(active_ms) == 2
    assert alive_at_stop == [False]
