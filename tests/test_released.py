"""A CPU memory build's collectives let go of their tensors when the program does
(bench/runner/measure/released.py)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading
import time

import pytest
import torch

from bench.runner.measure import released

pytestmark = pytest.mark.unit


def _uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _DoneWork:
    def wait(self):
        return True

    def is_completed(self):
        return True


def _late_backend(hold_s: float):
    """A collective whose work is done at once but whose 'worker' keeps a view of the output
    for ``hold_s`` more, as gloo's thread keeps its call until it next takes its lock."""

    def call(output, input, async_op=False):
        view = output.view(-1)
        threading.Thread(target=lambda v=view: time.sleep(hold_s), daemon=True).start()
        output.copy_(input)
        del view  # the thread's argument alone holds it now
        return _DoneWork() if async_op else None

    return call


@pytest.mark.parametrize("async_op", [True, False])
def test_a_wait_returns_once_the_backend_has_let_go(async_op):
    out, inp = torch.zeros(1000), torch.ones(1000)
    before = _uses(out)
    # as the backend is: the view is still held after the wait
    work = _late_backend(0.2)(out, inp, async_op=async_op)
    if work is not None:
        work.wait()
    assert _uses(out) > before
    time.sleep(0.3)
    # wrapped: the wait lasts until it is let go
    work = released._released(_late_backend(0.02))(out, inp, async_op=async_op)
    if work is not None:
        assert work.is_completed()  # the work's own methods pass through
        assert work.wait() is True
        assert work.wait() is True  # a second wait is a no-op
    assert _uses(out) == before
    torch.testing.assert_close(out, inp)


def test_a_view_the_caller_keeps_costs_the_bound_not_a_hang(monkeypatch):
    monkeypatch.setattr(released, "LIMIT_S", 0.01)
    out, inp = torch.zeros(10), torch.ones(10)
    start = time.perf_counter()
    work = released._released(_late_backend(5.0))(out, inp, async_op=True)
    work.wait()
    assert time.perf_counter() - start < 1.0


def _on_gloo(path: str) -> list:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        original = dist.all_gather_into_tensor
        seen = []
        with released.released_collectives(torch.device("cpu")):
            seen.append(dist.all_gather_into_tensor is not original)
            out, inp = torch.zeros(4), torch.arange(4.0)
            before = _uses(out)
            work = dist.all_gather_into_tensor(out, inp, async_op=True)
            work.wait()
            seen.append(out.tolist() == inp.tolist() and _uses(out) == before)
            t = torch.ones(3)
            seen.append(dist.all_reduce(t) is None and t.tolist() == [1.0] * 3)
        seen.append(dist.all_gather_into_tensor is original)
        with released.released_collectives(torch.device("meta")):  # not the CPU: untouched
            seen.append(dist.all_gather_into_tensor is original)
        return seen
    finally:
        dist.destroy_process_group()


def test_gloo_calls_wrapped_inside_and_restored_after(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        seen = pool.submit(_on_gloo, str(tmp_path / "store")).result(timeout=120)
    assert seen == [True] * 5


@pytest.mark.skipif(not released.Path("/proc/self/task").is_dir(), reason="Linux's /proc only")
def test_workers_idle_returns_once_the_other_threads_sleep_and_waits_its_bound_for_a_busy_one():
    """A thread waiting on a lock is asleep, the caller is not; a worker still running (as
    gloo's, finishing a call) holds the wait until its bound."""
    me = released.Path(f"/proc/self/task/{threading.get_native_id()}")
    assert not released._asleep(me)
    waiting, done = threading.Event(), threading.Event()
    sleeper = threading.Thread(target=done.wait, daemon=True)
    sleeper.start()
    t0 = time.perf_counter()
    released.workers_idle(limit_s=5.0)
    assert time.perf_counter() - t0 < 2.0  # asleep at once, not the 5 s bound
    assert released._asleep(released.Path(f"/proc/self/task/{sleeper.native_id}"))

    def busy():  # in native code, without the interpreter's lock, as gloo's worker is
        a = torch.ones(600, 600)
        while not waiting.is_set():
            a @ a

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    t0 = time.perf_counter()
    released.workers_idle(limit_s=0.3)
    waited = time.perf_counter() - t0
    waiting.set()
    done.set()
    worker.join()
    assert waited >= 0.3
