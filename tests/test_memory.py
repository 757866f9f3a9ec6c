"""peak_mem_mb on known answers (CPU: the C heap plus the profiler's allocation counter)."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
from pathlib import Path

import pytest
import torch

from bench.runner.measure.kept import OwnState
from bench.runner.measure.profiling import MemoryBaseline, own_memory, step_memory
from bench.runner.train.data import Batches
from parallel_kernels.workload import Workload, tensor_bytes

pytestmark = pytest.mark.unit

MB = 2**20
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def fresh():
    """A process of its own for the heap's figures: in a test worker that ran other tests
    first, their threads free memory while a measurement reads the C heap (a clean-clone CI run
    read these tests' known answers 0.2 to 1.4 MiB low; alone, to the KiB)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        yield lambda fn, *args: pool.submit(fn, *args).result(timeout=120)


def _profiler_set_up() -> None:
    """The profiler's first session in a process grows the heap by some 23 MiB that stay: done
    before any baseline here, as a point's traced steps do before its memory is measured."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        torch.ones(1).add_(1)


def _measure(tmp: str, extra_mb: int, release: bool, leftover_mb: int = 0) -> tuple:
    """A training-like step on a model-free state: parameters P held throughout, gradients G
    freed at the step's start (zero_grad) and made again, and ``extra_mb`` more held during the
    step (activations), ``leftover_mb`` held from before the point. Returns the peak and P, G
    in bytes."""
    _profiler_set_up()
    leftover = torch.ones(leftover_mb * MB // 4)
    baseline = MemoryBaseline.now(CPU)
    params = torch.ones(8 * MB // 4)
    state = {"grad": torch.ones(16 * MB // 4)}  # the previous step's gradients

    def step() -> None:
        state["grad"] = None
        activations = torch.ones(extra_mb * MB // 4) if extra_mb else None
        state["grad"] = torch.full((16 * MB // 4,), 2.0)  # the new gradients
        del activations

    def zero_grad() -> None:
        state["grad"] = None

    got = step_memory(
        step,
        baseline=baseline,
        release=zero_grad if release else lambda: None,
        scratch_dir=Path(tmp),
    )
    del leftover
    return got.peak_bytes, params.nbytes, 16 * MB


def test_a_step_that_allocates_x_more_peaks_x_higher(fresh, tmp_path):
    base, p, g = fresh(_measure, str(tmp_path), 0, True)
    for x in (4, 32):
        more, _, _ = fresh(_measure, str(tmp_path), x, True)
        assert more - base == pytest.approx(x * MB, rel=0.05), (x, (more - base) / MB)
    # The step's own low point is P; its peak holds the new gradients on top: P + G, not the
    # previous step's gradients a second time (the profiler's counter cannot subtract a free of
    # memory allocated before profiling began: measuring without freeing first gave P + 2G in
    # a fresh process, and wide_mlp's peak_mem_mb 38 MB, its gradients, too high).
    assert base == pytest.approx(p + g, rel=0.05), base / MB


def test_the_baseline_is_the_points_own(fresh, tmp_path):
    """Memory held before the point (an earlier point's leftovers) is not in its peak."""
    base, p, g = fresh(_measure, str(tmp_path), 0, True, 24)
    assert base == pytest.approx(p + g, rel=0.05), base / MB


def _freed_elsewhere(tmp: str) -> tuple[float, int]:
    """A step whose first 16 MiB of activations are dropped on another thread, as gloo's
    workers drop what a call kept, before 16 MiB more are made: its peak and its parameters."""
    import threading

    _profiler_set_up()
    baseline = MemoryBaseline.now(CPU)
    params = torch.ones(8 * MB // 4)

    def step() -> None:
        held = [torch.ones(16 * MB // 4)]
        worker = threading.Thread(target=held.clear)  # the last hold, on a thread not profiled
        worker.start()
        worker.join()
        activations = torch.ones(16 * MB // 4)
        del activations

    got = step_memory(step, baseline=baseline, release=lambda: None, scratch_dir=Path(tmp))
    return got.peak_bytes, params.nbytes


def test_what_another_thread_frees_is_freed(fresh, tmp_path):
    """The profiler's counter takes a free off only on a profiled thread unless told to count
    every thread (``every_thread_counted``): without it this step read P + 32 MiB, and an FSDP
    step on gloo up to 2.9 MiB high, a step in three."""
    peak, p = fresh(_freed_elsewhere, str(tmp_path))
    assert peak == pytest.approx(p + 16 * MB, rel=0.05), peak / MB


def _kept_through_release(tmp: str) -> tuple[float, int]:
    """A step that frees the previous step's 16 MiB of gradients itself, which ``release``
    leaves (FSDP1's flat gradients through ``zero_grad``), before making new ones."""
    _profiler_set_up()
    baseline = MemoryBaseline.now(CPU)
    params = torch.ones(8 * MB // 4)
    state = {"grads": torch.ones(16 * MB // 4)}  # made before the memory steps, uncounted

    def step() -> None:
        state["grads"] = None
        state["grads"] = torch.ones(16 * MB // 4)

    got = step_memory(step, baseline=baseline, release=lambda: None, scratch_dir=Path(tmp))
    return got.peak_bytes, params.nbytes


def test_what_a_step_frees_of_the_state_it_starts_from_is_freed(fresh, tmp_path):
    """The counter takes off only a free of what it counted: measured from the first step,
    the old gradients' free was missed and this read P + 32 MiB."""
    peak, p = fresh(_kept_through_release, str(tmp_path))
    assert peak == pytest.approx(p + 16 * MB, rel=0.05), peak / MB


def _allocating_nothing(tmp: str) -> tuple[float, int]:
    """A step that allocates nothing through c10 (its profile holds no memory event), with 8
    MiB of parameters: the peak and P."""
    _profiler_set_up()
    baseline = MemoryBaseline.now(CPU)
    params = torch.ones(8 * MB // 4)
    got = step_memory(lambda: None, baseline=baseline, release=lambda: None, scratch_dir=Path(tmp))
    return got.peak_bytes, params.nbytes


def test_a_step_that_allocates_nothing_reads_what_it_holds(fresh, tmp_path):
    """Its counter's rise has no event to be taken from (NaN), which read the peak NaN."""
    peak, p = fresh(_allocating_nothing, str(tmp_path))
    assert peak == pytest.approx(p, rel=0.05), peak / MB


def test_a_memory_step_whose_trace_cannot_be_read_is_measured_once_more(monkeypatch, tmp_path):
    """torch's export once wrote a trace that was not UTF-8 (a native DDP step on gloo): the
    step measured again gives the figure; a second unreadable trace is the point's error."""
    from bench.analysis.reader import TraceError
    from bench.runner.measure import profiling

    real, calls = profiling.load_trace, []

    def unreadable(times: int):
        def load(path):
            calls.append(path)
            if len(calls) <= times:
                raise TraceError(f"{path}: not a readable trace (UnicodeDecodeError)")
            return real(path)

        return load

    baseline = MemoryBaseline.now(CPU)
    kept = torch.ones(MB // 4)

    def step() -> None:
        torch.ones(MB // 4).add_(1)

    monkeypatch.setattr(profiling, "load_trace", unreadable(1))
    got = step_memory(step, baseline=baseline, release=lambda: None, scratch_dir=tmp_path, steps=1)
    assert len(calls) == 2 and got.peak_bytes >= kept.nbytes
    calls.clear()
    monkeypatch.setattr(profiling, "load_trace", unreadable(2))
    with pytest.raises(TraceError):
        step_memory(step, baseline=baseline, release=lambda: None, scratch_dir=tmp_path, steps=1)


def _peak_mb(step, baseline, tmp: str) -> dict:
    got = step_memory(step, baseline=baseline, release=lambda: None, scratch_dir=Path(tmp))
    return {"peak_mem_mb": got.peak_bytes / MB, "peak_reserved_mb": got.reserved_bytes / MB}


def _left_and_data(tmp: str) -> tuple[dict, dict]:
    """A point whose first step fills a 4 MiB cache, with 8 MiB of parameters, a 2 MiB data
    set and 16 MiB of activations: its figures before and after ``own_memory``."""
    _profiler_set_up()
    cache: list = []
    baseline = MemoryBaseline.now(CPU)
    state = {"params": torch.ones(8 * MB // 4), "data": torch.ones(2 * MB // 4)}

    def step() -> None:
        if not cache:
            cache.append(torch.ones(4 * MB // 4))
        activations = torch.ones(16 * MB // 4)
        del activations

    metrics = _peak_mb(step, baseline, tmp)
    measured = dict(metrics)
    own = OwnState([state["params"]])
    state.clear()  # the point released
    own_memory(metrics, baseline, data_bytes=2 * MB, own=own)
    return measured, metrics


def test_what_a_point_leaves_in_the_process_and_its_data_set_are_not_its_own(fresh, tmp_path):
    """A cache the point fills (oneDNN's kernels) stays after its release, and the harness's
    synthetic data set is not the configuration's: its peak is the step's highest use over
    what its release gives back, less the data set."""
    measured, metrics = fresh(_left_and_data, str(tmp_path))
    assert measured["peak_mem_mb"] == pytest.approx(8 + 2 + 4 + 16, abs=0.5)
    assert metrics["peak_mem_mb"] == pytest.approx(8 + 16, abs=0.5), metrics
    assert metrics["mem_left_mb"] == pytest.approx(4, abs=0.5)  # said: a leak would show
    assert metrics["mem_kept_mb"] == 0  # none of its own state outlived it
    assert math.isnan(metrics["peak_reserved_mb"])  # the CPU has no reserved figure


def _cached_step(cache: list, activation_mb: int) -> None:
    """A step whose first run fills a 2 MiB cache (the process's), with its activations."""
    if not cache:
        cache.append(torch.ones(2 * MB // 4))
    activations = torch.ones(activation_mb * MB // 4)
    del activations


def _cohort(tmp: str) -> tuple[dict, dict, float]:
    """Candidates A (8 MiB) then B (4 MiB) built, B measured (16 MiB of activations, a 2 MiB
    cache filled by the first step) and released, then A (12 MiB of activations): their
    figures after ``own_memory``, and A's before it."""
    _profiler_set_up()
    cache: list = []
    cands = {}
    base_a = MemoryBaseline.now(CPU)
    cands["a"] = torch.ones(8 * MB // 4)
    base_b = MemoryBaseline.now(CPU)
    cands["b"] = torch.ones(4 * MB // 4)

    b = _peak_mb(lambda: _cached_step(cache, 16), base_b, tmp)
    own = OwnState([cands["b"]])
    del cands["b"]
    own_memory(b, base_b, data_bytes=0, own=own)
    a = _peak_mb(lambda: _cached_step(cache, 12), base_a, tmp)
    a_measured = a["peak_mem_mb"]
    own = OwnState([cands["a"]])
    del cands["a"]
    own_memory(a, base_a, data_bytes=0, own=own)
    return a, b, a_measured


def test_a_cohorts_candidate_is_not_charged_what_those_measured_before_it_left(fresh, tmp_path):
    """Candidates built A then B, measured newest first: B's release leaves a cache on the
    heap, which A's baseline (taken before B existed) does not hold; A's figure is still its
    own parameters and activations."""
    a, b, a_measured = fresh(_cohort, str(tmp_path))
    assert a_measured == pytest.approx(8 + 2 + 12, abs=0.5)  # B's cache counted here
    assert b["peak_mem_mb"] == pytest.approx(4 + 16, abs=0.5), b
    assert a["peak_mem_mb"] == pytest.approx(8 + 12, abs=0.5), a


_HELD_ELSEWHERE: list = []  # stands for native code that keeps a released point's tensors


def _kept(tmp: str) -> tuple[dict, dict]:
    """Candidates A (8 MiB of parameters, views of them made its parameters, 2 MiB of
    optimiser state) then B (4 MiB) built; B measured and released whole, then A (16 MiB of
    activations, a 2 MiB cache filled by the first step), whose state is kept alive past its
    release by a holder of its own: A's and B's figures after ``own_memory``."""
    _profiler_set_up()
    cache: list = []
    base_a = MemoryBaseline.now(CPU)
    flat = torch.ones(8 * MB // 4)
    a_state = [flat[: 4 * MB // 4], flat[4 * MB // 4 :], torch.ones(2 * MB // 4)]
    del flat  # alive through its views, as FSDP's flat parameter through the original ones
    base_b = MemoryBaseline.now(CPU)
    b_state = [torch.ones(4 * MB // 4)]

    b = _peak_mb(lambda: _cached_step(cache, 16), base_b, tmp)
    own = OwnState(b_state)
    b_state.clear()
    own_memory(b, base_b, data_bytes=0, own=own)
    a = _peak_mb(lambda: _cached_step(cache, 16), base_a, tmp)
    own = OwnState(a_state)
    _HELD_ELSEWHERE.extend([a_state[1], a_state[2]])  # one view and the state: 10 MiB
    a_state.clear()
    own_memory(a, base_a, data_bytes=0, own=own)
    return a, b


def test_a_points_own_state_kept_alive_past_its_release_stays_in_its_peak(fresh, tmp_path):
    """FSDP1's NO_SHARD keeps its flat parameters and AdamW's state alive after its module
    and optimiser are gone: what a point leaves is taken off its peak as the process's
    caches are, but that was its own memory during the step. Without the watch A read 16
    MiB, its activations alone."""
    a, b = fresh(_kept, str(tmp_path))
    assert b["peak_mem_mb"] == pytest.approx(4 + 16, abs=0.5), b
    assert b["mem_kept_mb"] == 0
    assert a["peak_mem_mb"] == pytest.approx(8 + 2 + 16, abs=0.5), a
    assert a["mem_kept_mb"] == pytest.approx(10, abs=0.01)  # the view's whole storage, 8 MiB
    assert a["mem_left_mb"] == pytest.approx(10 + 2, abs=0.5)  # and B's cache


def test_a_data_sets_bytes_count_each_storage_once_on_the_device_asked():
    x = torch.ones(1000)
    data = {"a": x, "b": (x[:10], torch.zeros(5, dtype=torch.int64)), "c": [None, "text"]}
    assert tensor_bytes(data) == 4000 + 40
    assert tensor_bytes(data, torch.device("cpu")) == 4040
    assert tensor_bytes(data, torch.device("cuda")) == 0  # the data lies on the host
    tokens = Workload(
        name="t",
        build=lambda: torch.nn.Linear(2, 2),
        batch=lambda n, seed: ({"ids": torch.zeros(n, 3, dtype=torch.int64)}, None),
        loss=None,
    )
    images = Workload(
        name="i",
        build=lambda: torch.nn.Linear(2, 2),
        batch=lambda n, seed: (torch.ones(n, 2), torch.zeros(n, dtype=torch.int64)),
    )
    for wl, each in ((tokens, 3 * 8), (images, 2 * 4 + 8)):
        batches = Batches(wl.dataset(16, 0), batch_size=4, rank=0, world_size=1, device=CPU)
        assert batches.held_bytes(CPU) == 16 * each, wl.name
