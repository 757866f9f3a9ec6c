"""This device's roofline, measured in a short run, and this host's, cached.

Three figures, each the best of a few repeats of a batch of calls (the batch long enough for the
clock, the device synchronised around it on a GPU), so that a neighbour's burst costs a repeat,
not the figure:

- ``launch_us``: one tiny op (an add of one element), dispatch included: what any op costs;
- matmuls of growing size, square and two skinny shapes of the same FLOPs (a small inner
  dimension, as attention's scores against a head's; a small output one, as its values), until
  the rate stops growing: ``peak_tflops`` is the best rate reached, a curve point the geometric
  mean of its shapes' rates over that peak, for fp32 and bf16 (where the device runs it);
- an elementwise add over sizes from KBs to well past the caches: ``memory_GBps`` is the best
  bandwidth reached (bytes read and written), the curve its rate at each size over that best;
  on a CPU the same add allocating its output on operands out of the caches (a pool of them
  twice the last-level cache, taken in turn), its rate over that best (``memory_cold``), as a
  training step's elementwise ops run;
- on a CPU, the elementwise functions (``MATH_OPS``: tanh, exp, GELU, softmax ...) over
  operands in cache, each one's elements a second (``math_Gelems``): the CPU computes them at a
  rate far below its bandwidth; and what an op costs inside a training step beyond all that,
  unprofiled and in a profiled trace (``step_cost.py``).

Rates are taken on a call's time less one launch (at least a twentieth of it), so that a
profile prices each measured op as it ran: its FLOPs or bytes at the curve's rate, plus the
launch (``Roofline.op_us``). The ceilings come from calls at least twice a launch: below, the
rate is mostly the launch's noise (those sizes' efficiencies are capped at 1).

``host_profile()`` measures once per host, device model, torch version and thread count, and
reads the file (the profile format, docs/roofline.md) under ``CACHE_DIR`` after.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import itertools
import json
import math
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from bench.roofline.profile import Curve, Roofline, from_json, write
from bench.roofline.step_cost import step_cost, traced_op_us
from bench.runfolder import atomic

CACHE_DIR = Path.home() / ".cache" / "parallel-bench" / "roofline"
MIN_NET = 0.05  # a call's time less one launch is at least this fraction of it
PLATEAU = 1.05  # a size whose rate beats the best so far by less has not grown it
LONG_CALL_S = 0.05  # a call this long is timed twice, not 1 + repeats times
FLAT_SIZES = 2  # this many sizes in a row without growth end the matmul sweep


@dataclass(frozen=True)
class Sizes:
    """What one measurement runs: the sizes, and how long and how often each is timed."""

    square: tuple[int, ...]  # n of the n x n x n matmuls, growing
    memory_bytes: tuple[int, ...]  # bytes of each of the add's three tensors, growing
    repeats: int  # timed batches per figure; the fastest counts
    batch_s: float  # a batch repeats its call until it lasts this long
    call_budget_s: float  # the sweep ends before a size whose calls would take longer (8x)
    sweep_s: float  # a precision's matmul sweep that has run this long ends


KIB = 1024
SIZES = {
    "cpu": Sizes(
        square=(32, 64, 128, 256, 512, 1024, 2048),
        memory_bytes=tuple(4 * KIB * 4**i for i in range(8)),  # 4 KiB .. 64 MiB
        repeats=5,
        batch_s=0.005,
        call_budget_s=0.1,
        sweep_s=2.0,
    ),
    "cuda": Sizes(
        square=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
        memory_bytes=tuple(4 * KIB * 4**i for i in range(10)),  # 4 KiB .. 1 GiB
        repeats=5,
        batch_s=0.005,
        call_budget_s=0.2,
        sweep_s=5.0,
    ),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Bench:
    """Where the calls run: the device, its synchronisation, the sizes, one launch's seconds."""

    device: torch.device
    sizes: Sizes
    launch_s: float = 0.0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def per_call_s(self, call: Callable[[], object]) -> float:
        """The fastest of ``sizes.repeats`` batches, per call (after one warm-up call)."""
        call()
        self.sync()
        t0 = time.perf_counter()
        call()
        self.sync()
        one = max(time.perf_counter() - t0, 1e-7)
        count = max(1, min(100_000, math.ceil(self.sizes.batch_s / one)))
        best = one
        for _ in range(self.sizes.repeats if one < LONG_CALL_S else 1):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(count):
                call()
            self.sync()
            best = min(best, (time.perf_counter() - t0) / count)
        return best

    def net_s(self, seconds: float) -> float:
        """A call's time less one launch: what its FLOPs or bytes took."""
        return max(seconds - self.launch_s, MIN_NET * seconds)


@dataclass(frozen=True)
class Timed:
    """A size's work (FLOPs, bytes moved) and the seconds each of its calls took."""

    work: float
    seconds: tuple[float, ...]


def launch_s(bench: Bench) -> float:
    """Seconds of a one-element add: the dispatch and launch every op pays."""
    x, y, out = (torch.ones(1, device=bench.device) for _ in range(3))
    return bench.per_call_s(lambda: torch.add(x, y, out=out))


def shapes(n: int) -> tuple[tuple[int, int, int], ...]:
    """(m, k, n) of the matmuls one size times, each of 2 n^3 FLOPs: square, a small inner
    dimension (attention's scores), a small output one (attention's values)."""
    return ((n, n, n), (2 * n, n // 4, 2 * n), (2 * n, 2 * n, n // 4))


def matmul_s(bench: Bench, shape: tuple[int, int, int], dtype: torch.dtype) -> float:
    """Seconds of one (m, k) @ (k, n) matmul."""
    m, k, n = shape
    a = torch.randn(m, k, device=bench.device).to(dtype)
    b = torch.randn(k, n, device=bench.device).to(dtype)
    out = torch.empty(m, n, device=bench.device, dtype=dtype)
    return bench.per_call_s(lambda: torch.mm(a, b, out=out))


def matmul_times(bench: Bench, dtype: torch.dtype) -> list[Timed]:
    """Each size's shapes timed, growing until the rate stops growing, the next size's calls
    (8x the FLOPs) or the sweep would exceed their budget, or the device's memory runs out."""
    points: list[Timed] = []
    start = time.perf_counter()
    best, flat = 0.0, 0
    for n in bench.sizes.square:
        try:
            point = Timed(2.0 * n**3, tuple(matmul_s(bench, s, dtype) for s in shapes(n)))
        except torch.OutOfMemoryError:
            break
        points.append(point)
        rate = point.work / min(map(bench.net_s, point.seconds))
        flat = flat + 1 if rate < PLATEAU * best else 0
        best = max(best, rate)
        too_long = 8 * max(point.seconds) > bench.sizes.call_budget_s
        if flat >= FLAT_SIZES or too_long or time.perf_counter() - start > bench.sizes.sweep_s:
            break
    return points


def curve(bench: Bench, points: list[Timed]) -> tuple[float, Curve]:
    """(ceiling per second, efficiency curve): the best rate (of the calls at least twice a
    launch: below, the launch's noise is the rate's), and per size its calls' rates over it,
    their geometric mean where a size has several shapes."""
    rates = [[p.work / bench.net_s(t) for t in p.seconds] for p in points]
    pairs = [
        (t, r)
        for p, rs in zip(points, rates, strict=True)
        for t, r in zip(p.seconds, rs, strict=True)
    ]
    long = [r for t, r in pairs if t >= 2 * bench.launch_s]
    top = max(long or [r for rs in rates for r in rs])
    eff = [float(np.exp(np.mean(np.log(np.minimum(np.array(rs) / top, 1.0))))) for rs in rates]
    return top, Curve(tuple(p.work for p in points), tuple(eff))


def memory_times(bench: Bench) -> list[Timed]:
    """``out = a + b`` in fp32 timed at each size: a call reads two tensors and writes one."""
    points = []
    for nbytes in bench.sizes.memory_bytes:
        a, b, out = (torch.ones(nbytes // 4, device=bench.device) for _ in range(3))
        seconds = bench.per_call_s(lambda a=a, b=b, out=out: torch.add(a, b, out=out))
        points.append(Timed(3.0 * nbytes, (seconds,)))
        del a, b, out
    return points


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (sysfs), or 64 MiB where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        m = re.fullmatch(r"(\d+)([KMG]?)", f.read_text().strip())
        if m:
            sizes.append(int(m.group(1)) * {"": 1, "K": KIB, "M": KIB**2, "G": KIB**3}[m.group(2)])
    return max(sizes, default=64 * KIB**2)


def cold_memory_times(bench: Bench) -> list[Timed]:
    """``a + b`` in fp32, its output allocated, timed at each size on operands out of the
    caches: each call takes the next pair of a pool spanning twice the last-level cache."""
    pool_bytes = 2 * last_level_cache_bytes()
    points = []
    for nbytes in bench.sizes.memory_bytes:
        pairs = [
            (
                torch.ones(nbytes // 4, device=bench.device),
                torch.ones(nbytes // 4, device=bench.device),
            )
            for _ in range(max(2, math.ceil(pool_bytes / (2 * nbytes))))
        ]
        turn = itertools.cycle(pairs)
        seconds = bench.per_call_s(lambda turn=turn: torch.add(*next(turn)))
        points.append(Timed(3.0 * nbytes, (seconds,)))
        del pairs, turn
    return points


def cold_curve(bench: Bench, points: list[Timed], bandwidth: float) -> Curve:
    """Each size's rate over ``bandwidth`` (bytes a second), capped at 1."""
    eff = [min(1.0, p.work / bench.net_s(p.seconds[0]) / bandwidth) for p in points]
    return Curve(tuple(p.work for p in points), tuple(eff))


MATH_ELEMENTS = 64 * KIB  # 256 KiB of fp32 an operand: in cache, so the arithmetic bounds
_F = torch.nn.functional
_A = torch.ops.aten
# Per elementwise function, as a trace names the op that computes it, one call of it over
# x (positive, MATH_ELEMENTS long), a gradient g and an output y of x's shape, and r, x as
# rows of 256 (softmax's). The innermost ops only: a trace's outer op holds one of these.
MATH_OPS: dict[str, Callable] = {
    "aten::tanh": lambda x, g, y, r: torch.tanh(x, out=y),
    "aten::exp": lambda x, g, y, r: torch.exp(x, out=y),
    "aten::log": lambda x, g, y, r: torch.log(x, out=y),
    "aten::sqrt": lambda x, g, y, r: torch.sqrt(x, out=y),
    "aten::rsqrt": lambda x, g, y, r: torch.rsqrt(x, out=y),
    "aten::sigmoid": lambda x, g, y, r: torch.sigmoid(x, out=y),
    "aten::erf": lambda x, g, y, r: torch.erf(x, out=y),
    "aten::silu": lambda x, g, y, r: _F.silu(x),
    "aten::gelu": lambda x, g, y, r: _F.gelu(x),
    "aten::gelu_backward": lambda x, g, y, r: _A.gelu_backward(g, x),
    "aten::silu_backward": lambda x, g, y, r: _A.silu_backward(g, x),
    "aten::_softmax": lambda x, g, y, r: _A._softmax(r, -1, False),
    "aten::_log_softmax": lambda x, g, y, r: _A._log_softmax(r, -1, False),
    "aten::_log_softmax_backward_data": lambda x, g, y, r: _A._log_softmax_backward_data(
        r, r, -1, torch.float32
    ),
    "aten::tanh_backward": lambda x, g, y, r: _A.tanh_backward(g, x),
    "aten::pow": lambda x, g, y, r: torch.pow(x, 2),
    "aten::native_layer_norm": lambda x, g, y, r: _A.native_layer_norm(r, [256], None, None, 1e-5),
    "aten::native_layer_norm_backward": lambda x, g, y, r: _A.native_layer_norm_backward(
        r, r, [256], r[:, :1], r[:, :1], None, None, [True, False, False]
    ),
}


def math_rates(bench: Bench) -> dict[str, float]:
    """Each of ``MATH_OPS``' billions of elements a second (fp32), its call less a launch."""
    x = torch.rand(MATH_ELEMENTS, device=bench.device) + 0.5
    g, y = torch.rand_like(x), torch.empty_like(x)
    r = x.view(-1, 256)
    with torch.no_grad():
        return {
            op: MATH_ELEMENTS / bench.net_s(bench.per_call_s(lambda c=call: c(x, g, y, r))) / 1e9
            for op, call in MATH_OPS.items()
        }


def precisions(device: torch.device) -> tuple[str, ...]:
    """The precisions measured: fp32, and bf16 where the device runs it."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return ("fp32",)
    return ("fp32", "bf16")


def device_name(device: torch.device) -> str:
    """What the device calls itself: the GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return model.group(1).strip() if model else platform.processor() or platform.machine()


def measure(device: torch.device | str = "cpu", sizes: Sizes | None = None) -> Roofline:
    """This device's profile, measured now (a few seconds: ``SIZES``)."""
    device = torch.device(device)
    sizes = sizes or SIZES[device.type]
    bench = Bench(device, sizes)
    bench = Bench(device, sizes, launch_s(bench))
    peaks, curves = {}, {}
    for p in precisions(device):
        peak, curves[p] = curve(bench, matmul_times(bench, DTYPES[p]))
        peaks[p] = peak / 1e12
    bandwidth, memory = curve(bench, memory_times(bench))
    threads = f", threads: {torch.get_num_threads()}" if device.type == "cpu" else ""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    alone = Roofline(
        device=device_name(device),
        source=f"measured on {socket.gethostname()}, torch {torch.__version__}{threads}, {when}",
        peak_tflops=peaks,
        memory_GBps=bandwidth / 1e9,
        matmul=curves,
        memory=memory,
        launch_us=bench.launch_s * 1e6,
    )
    if device.type != "cpu":
        return alone  # a GPU's steps overlap the host's costs with the kernels: not fitted here
    cold = cold_curve(bench, cold_memory_times(bench), bandwidth)
    alone = replace(alone, math_Gelems=math_rates(bench), memory_cold=cold)
    return replace(
        alone,
        step=step_cost(alone, device, bench.sync),
        traced_op_us=traced_op_us(device),
    )


def cache_path(device: torch.device | str = "cpu") -> Path:
    """Where this host's profile of ``device`` is kept: one file per host name, device model,
    torch version and (on a CPU) thread count, any of which changes the figures."""
    device = torch.device(device)
    threads = f"{torch.get_num_threads()}t" if device.type == "cpu" else device.type
    key = "_".join((socket.gethostname(), device_name(device), torch.__version__, threads))
    return CACHE_DIR / cache_file_name(key)


def cache_file_name(key: str) -> str:
    """``key`` as a cache file's name: letters, digits and ``.+-``, a run of others one ``-``."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", key).strip("-") + ".json"


def this_device() -> torch.device:
    """The device a profile of this host is of: the GPU where CUDA is, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def remeasure(device: torch.device | str | None = None, sizes: Sizes | None = None) -> Roofline:
    """``device``'s profile measured now, replacing the cached one."""
    device = torch.device(device) if device is not None else this_device()
    profile = measure(device, sizes)
    try:
        write(profile, cache_path(device))
    except atomic.OutputError as e:
        print(f"roofline: cannot cache the profile: {e}", file=sys.stderr)
    return profile


def host_profile(device: torch.device | str | None = None, sizes: Sizes | None = None) -> Roofline:
    """This host's profile of ``device`` (None: ``this_device()``): read from the cache, or
    measured and cached where it has none or cannot be read (saying so). The ranks of a run
    that ask at once on a new host take turns on a lock beside the file: the first measures
    (on a quiet machine, its neighbours waiting), the others read what it wrote."""
    device = torch.device(device) if device is not None else this_device()
    path = cache_path(device)
    with _turn(path.with_name(path.name + ".lock")):
        return _cached(path, device) or remeasure(device, sizes)


@contextlib.contextmanager
def _turn(lock: Path) -> Iterator[None]:
    """``lock`` held (a blocking ``flock``) while inside; nothing held where it cannot be made
    (an unwritable cache: each process then measures for itself)."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _cached(path: Path, device: torch.device) -> Roofline | None:
    """The cached profile, or None (saying why where one is there but will not do)."""
    if not path.exists():
        return None
    try:
        cached = from_json(json.loads(path.read_text()), where=str(path))
    except (OSError, ValueError) as e:  # RooflineError and JSONDecodeError among them
        why = (str(e).splitlines() or [type(e).__name__])[0]
        print(f"roofline: cached profile unreadable ({why}); measuring again", file=sys.stderr)
        return None
    if device.type == "cpu" and (
        cached.step is None
        or not cached.math_Gelems
        or cached.memory_cold is None
        or cached.traced_op_us is None
        or not set(MATH_OPS) <= set(cached.math_Gelems)
    ):
        print(
            "roofline: cached profile without step costs, math rates, a cold memory curve or "
            "a traced op's cost; measuring again",
            file=sys.stderr,
        )
        return None
    return cached
