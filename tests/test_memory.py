"""peak_mem_mb on known answers (CPU: c10's count of the bytes it has handed out)."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
from types import SimpleNamespace

import pytest
import torch

from bench.runner.measure.peak_memory import MemoryBaseline, c10_counting, point_memory, step_memory
from bench.runner.train.data import Batches
from parallel_kernels.workload import Workload, tensor_bytes

pytestmark = pytest.mark.unit

MB = 2**20
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def fresh():
    """A process of its own for the counter's figures: in a test worker that ran other tests
    first, their threads could allocate while a measurement counts every thread."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        yield lambda fn, *args: pool.submit(fn, *args).result(timeout=120)


def _measure(extra_mb: int, release: bool, leftover_mb: int = 0) -> tuple:
    """A training-like step on a model-free state: parameters P held throughout, gradients G
    freed at the step's start (zero_grad) and made again, and ``extra_mb`` more held during the
    step (activations), ``leftover_mb`` held from before the point. Returns the peak and P, G
    in bytes."""
    with c10_counting(CPU):
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
        )
        del leftover
    return got.peak_bytes, params.nbytes, 16 * MB


def test_a_step_that_allocates_x_more_peaks_x_higher(fresh):
    base, p, g = fresh(_measure, 0, True)
    for x in (4, 32):
        more, _, _ = fresh(_measure, x, True)
        assert more - base == pytest.approx(x * MB, rel=0.05), (x, (more - base) / MB)
    # The step's own low point is P; its peak holds the new gradients on top: P + G, not the
    # previous step's gradients a second time (a step measured holding them read P + 2G, and
    # wide_mlp's peak_mem_mb 38 MB, its gradients, too high).
    assert base == pytest.approx(p + g, rel=0.05), base / MB


def test_the_baseline_is_the_points_own(fresh):
    """Memory held before the point (an earlier point's leftovers) is not in its peak."""
    base, p, g = fresh(_measure, 0, True, 24)
    assert base == pytest.approx(p + g, rel=0.05), base / MB


def _freed_elsewhere() -> tuple[float, int]:
    """A step whose first 16 MiB of activations are dropped on another thread, as gloo's
    workers drop what a call kept, before 16 MiB more are made: its peak and its parameters."""
    import threading

    with c10_counting(CPU):
        baseline = MemoryBaseline.now(CPU)
        params = torch.ones(8 * MB // 4)

        def step() -> None:
            held = [torch.ones(16 * MB // 4)]
            worker = threading.Thread(target=held.clear)  # the last hold, on a thread not profiled
            worker.start()
            worker.join()
            activations = torch.ones(16 * MB // 4)
            del activations

        got = step_memory(step, baseline=baseline, release=lambda: None)
    return got.peak_bytes, params.nbytes


def test_what_another_thread_frees_is_freed(fresh):
    """The profiler's counter takes a free off only on a profiled thread unless told to count
    every thread (``c10_counting``): without it this step read P + 32 MiB, and an FSDP step on
    gloo up to 2.9 MiB high, a step in three."""
    peak, p = fresh(_freed_elsewhere)
    assert peak == pytest.approx(p + 16 * MB, rel=0.05), peak / MB


def _kept_through_release() -> tuple[float, int]:
    """A step that frees the previous step's 16 MiB of gradients itself, which ``release``
    leaves (FSDP1's flat gradients through ``zero_grad``), before making new ones."""
    with c10_counting(CPU):
        baseline = MemoryBaseline.now(CPU)
        params = torch.ones(8 * MB // 4)
        state = {"grads": torch.ones(16 * MB // 4)}  # made before the memory steps

        def step() -> None:
            state["grads"] = None
            state["grads"] = torch.ones(16 * MB // 4)

        got = step_memory(step, baseline=baseline, release=lambda: None)
    return got.peak_bytes, params.nbytes


def test_what_a_step_frees_of_the_state_it_starts_from_is_freed(fresh):
    """The counter takes off only a free of what it counted: counted from the baseline on, the
    old gradients' free is seen (counted from the measured steps on, it read P + 32 MiB)."""
    peak, p = fresh(_kept_through_release)
    assert peak == pytest.approx(p + 16 * MB, rel=0.05), peak / MB


def _allocating_nothing() -> tuple[float, int]:
    """A step that allocates nothing through c10 (its profile holds no memory event), with 8
    MiB of parameters: the peak and P."""
    with c10_counting(CPU):
        baseline = MemoryBaseline.now(CPU)
        params = torch.ones(8 * MB // 4)
        got = step_memory(lambda: None, baseline=baseline, release=lambda: None)
    return got.peak_bytes, params.nbytes


def test_a_step_that_allocates_nothing_reads_what_it_holds(fresh):
    """Its profile has no memory event to read the counter from (NaN), which read the peak
    NaN."""
    peak, p = fresh(_allocating_nothing)
    assert peak == pytest.approx(p, rel=0.05), peak / MB


class _Trainer:
    """A trainer as ``point_memory`` sees one: ``params_mb`` of parameters (two views of one
    flat tensor, as FSDP's original parameters are), each step ``activation_mb`` held while it
    makes the gradients, and SGD with momentum (its buffers made by the first step): a step's
    peak is P + momentum P + activations + gradients P. ``cache``, a list the process keeps,
    is filled with 2 MiB by the first step; ``data_mb`` is the harness's data set; ``held``,
    native code that keeps the second view and the first's momentum alive past the release."""

    def __init__(self, *, params_mb=8, activation_mb=16, data_mb=0, cache=None, held=None):
        flat = torch.ones(params_mb * MB // 4)
        half = flat.numel() // 2
        self.wrapped = torch.nn.ParameterList(
            [torch.nn.Parameter(flat[:half]), torch.nn.Parameter(flat[half:])]
        )
        self.opt = torch.optim.SGD(self.wrapped.parameters(), lr=0.0, momentum=0.9, foreach=False)
        self.data = torch.ones(data_mb * MB // 4)
        self.batches = SimpleNamespace(held_bytes=lambda device: self.data.nbytes)
        self.activation_mb, self.cache, self.held = activation_mb, cache, held

    def step(self) -> None:
        if self.cache is not None and not self.cache:
            self.cache.append(torch.ones(2 * MB // 4))
        activations = torch.ones(self.activation_mb * MB // 4)
        for p in self.wrapped:
            p.grad = torch.ones_like(p)
        del activations
        self.opt.step()
        if self.held is not None:
            self.held[:] = [self.wrapped[1], self.opt.state[self.wrapped[0]]["momentum_buffer"]]


def _point(**trainer) -> dict:
    """``point_memory`` of a ``_Trainer``."""
    return point_memory(lambda: _Trainer(**trainer), lambda t: t.step(), device=CPU)


def _left_and_data() -> dict:
    """A point whose first step fills the process's cache, with 8 MiB of parameters, 16 MiB
    of activations and a 2 MiB data set: its figures."""
    return _point(cache=[], data_mb=2)


def test_what_a_point_leaves_in_the_process_and_its_data_set_are_not_its_own(fresh):
    """A cache the point fills (oneDNN's kernels) stays after its release, and the harness's
    synthetic data set is not the configuration's: its peak is the step's highest use over
    what its release gives back, less the data set."""
    metrics = fresh(_left_and_data)
    assert metrics["peak_mem_mb"] == pytest.approx(3 * 8 + 16, abs=0.5), metrics
    assert metrics["mem_left_mb"] == pytest.approx(2, abs=0.5)  # said: a leak would show
    assert metrics["mem_kept_mb"] == 0  # none of its own state outlived it
    assert math.isnan(metrics["peak_reserved_mb"])  # the CPU has no reserved figure


def _in_turn() -> tuple[dict, dict, dict]:
    """Points measured one after another in a process, as a cohort's candidates are after
    their cycles: an earlier candidate's 8 MiB still alive throughout, the first point filling
    the process's cache, the second finding it filled; and the first measured again alone."""
    cache: list = []
    earlier = torch.ones(8 * MB // 4)
    first = _point(params_mb=4, activation_mb=16, cache=cache)
    second = _point(params_mb=8, activation_mb=12, cache=cache)
    del earlier
    alone = _point(params_mb=4, activation_mb=16, cache=[])
    return first, second, alone


def test_points_measured_in_turn_read_as_each_alone(fresh):
    """Neither a candidate still alive nor what a point measured before left is in a point's
    figure: the heap's figure moved with the points before it (FSDP2's NO_SHARD llama:tiny
    13.5 MiB first in a launch, 18.4 after others)."""
    first, second, alone = fresh(_in_turn)
    assert first["peak_mem_mb"] == pytest.approx(3 * 4 + 16, abs=0.5), first
    assert first["peak_mem_mb"] == pytest.approx(alone["peak_mem_mb"], abs=0.01)
    assert second["peak_mem_mb"] == pytest.approx(3 * 8 + 12, abs=0.5), second
    assert second["mem_left_mb"] == pytest.approx(0, abs=0.5)


_HELD_ELSEWHERE: list = []  # stands for native code that keeps a released point's tensors


def _kept() -> dict:
    return _point(held=_HELD_ELSEWHERE)


def test_a_points_own_state_kept_alive_past_its_release_stays_in_its_peak(fresh):
    """FSDP1's NO_SHARD keeps its flat parameters and AdamW's state alive after its module
    and optimiser are gone: what a point leaves is taken off its peak as the process's
    caches are, but that was its own memory during the step. Without the watch this read 24
    MiB, 16 short."""
    metrics = fresh(_kept)
    assert metrics["peak_mem_mb"] == pytest.approx(3 * 8 + 16, abs=0.5), metrics
    # the view's whole storage, the gradient it holds, the other view's momentum
    assert metrics["mem_kept_mb"] == pytest.approx(8 + 4 + 4, abs=0.01)
    assert metrics["mem_left_mb"] == pytest.approx(8 + 4 + 4, abs=0.5)


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
