"""A device profile: the roofline of one device, as data, and its file format.

An op takes at least its FLOPs over the device's peak at its precision and its bytes over the
memory bandwidth (the roofline model); real ops reach a fraction of either, which depends on
their size: a small matmul does not fill the device, a small copy pays its launch. A profile
holds the ceilings and those fractions as curves measured on the device (or stated for a
datasheet GPU until a measured profile replaces it), and prices an op as

    max(FLOPs / (peak x matmul efficiency at its FLOPs), bytes / (bandwidth x memory
    efficiency at its bytes)) + the fixed cost of one op's launch.

The file is JSON (docs/roofline.md)::

    {"format": "parallel-bench roofline 1", "device": "...", "source": "...",
     "peak_tflops": {"fp32": ..., "bf16": ...}, "memory_GBps": ...,
     "matmul": {"fp32": {"sizes": [FLOPs, ...], "efficiency": [0..1, ...]}, ...},
     "memory": {"sizes": [bytes, ...], "efficiency": [...]}, "launch_us": ...,
     "step": {"op_us": ..., "efficiency": ...}, "math_Gelems": {"aten::tanh": ..., ...},
     "memory_cold": {"sizes": [bytes, ...], "efficiency": [...]}, "traced_op_us": ...}

``step`` (optional) is what an op costs inside a training step, where it is not called alone
in a loop (``step_cost.py``): ``op_us`` its fixed cost there (the modules' Python and
autograd's bookkeeping beside the dispatch; on a CPU, where nothing overlaps them, several
times a bare launch), ``efficiency`` the factor on the curves' efficiencies its FLOPs and bytes
reach there (below 1 on this CPU: a model's matmuls and elementwise ops run on operands just
written elsewhere, in layouts backward transposes). A profile without it prices a step's op as
it prices an op alone.

``math_Gelems`` (optional) is, per elementwise op that computes a function per element (a
tanh, an exponential, a square root: ``aten::tanh``), the billions of elements a second it
reaches where its operands are in cache: on a CPU such an op is bound by that arithmetic, not
by its bytes, and is priced at the longer of the two (``math_us``). An op it does not name is
priced by its bytes alone.

``memory_cold`` (optional) is the memory curve of an elementwise op that allocates its output
and finds its operands out of the caches (a fraction of ``memory_GBps``, as ``memory``), as a
training step's ops do: ``memory`` is an ``out=`` op on operands the loop keeps hot.
``traced_op_us`` (optional) is what one operator costs in a trace recorded with
``record_shapes`` inside a step (the profiler's record, the dispatch), per operator an op
dispatches: ``launch_us`` is a bare call's, unprofiled. The prediction of a trace's ops
(``bench.analysis.op_accuracy``) prices with both; a profile without them (an older file) has
it price on ``memory`` and ``launch_us``. The planner, which predicts unprofiled steps, uses
``step`` instead.

A malformed file, or one naming a precision the suite does not know, is refused with one line
(``RooflineError``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.runfolder import atomic
from bench.runfolder.peaks import PRECISIONS

FORMAT = "parallel-bench roofline 1"


class RooflineError(ValueError):
    """A device profile that cannot be used; its message is one line naming the file and why."""


@dataclass(frozen=True)
class Curve:
    """An efficiency in (0, 1] against a size (FLOPs of a matmul, bytes of a memory-bound op),
    read between its points on a log scale and flat beyond its ends."""

    sizes: tuple[float, ...]
    efficiency: tuple[float, ...]

    def at(self, size: float) -> float:
        if size <= 0:
            return self.efficiency[0]
        return float(np.interp(math.log(size), np.log(self.sizes), self.efficiency))

    def as_json(self) -> dict:
        return {"sizes": list(self.sizes), "efficiency": list(self.efficiency)}


@dataclass(frozen=True)
class StepCost:
    """An op inside a training step: its fixed cost, and the factor on the profile's
    efficiencies its FLOPs and bytes reach (both fitted to measured steps, ``step_cost.py``)."""

    op_us: float
    efficiency: float

    def as_json(self) -> dict:
        return {"op_us": self.op_us, "efficiency": self.efficiency}


@dataclass(frozen=True)
class Roofline:
    """One device's roofline: ceilings, the efficiencies ops reach, a launch's fixed cost."""

    device: str  # what the device calls itself (torch.cuda.get_device_name, the CPU's model)
    source: str  # measured where and when, or the datasheet it states
    peak_tflops: Mapping[str, float]  # dense peak per precision (peaks.PRECISIONS)
    memory_GBps: float  # memory bandwidth, GB = 1e9 bytes
    matmul: Mapping[str, Curve]  # per precision: efficiency against a matmul's FLOPs
    memory: Curve  # efficiency of memory-bound ops against their bytes moved
    launch_us: float  # fixed cost of one op (host dispatch on a CPU, a kernel's launch on a GPU)
    step: StepCost | None = None  # an op inside a training step; None: as an op alone
    # per elementwise function op (its trace name): 1e9 elements a second, operands in cache
    math_Gelems: Mapping[str, float] = field(default_factory=dict)
    memory_cold: Curve | None = None  # allocating elementwise ops on operands out of cache
    traced_op_us: float | None = None  # an operator's cost in a profiled step's trace

    def in_step(self) -> StepCost:
        """What an op costs inside a training step: ``step``, or an op alone's."""
        return self.step or StepCost(self.launch_us, 1.0)

    def precision(self, precision: str) -> str:
        """The precision this profile has figures for: tf32 falls back to fp32 where the
        device has none, as on a datasheet GPU without TF32."""
        if precision in self.peak_tflops:
            return precision
        if precision == "tf32" and "fp32" in self.peak_tflops:
            return "fp32"
        raise RooflineError(f"{self.device}: no peak for {precision}")

    @property
    def traced_launch_us(self) -> float:
        """What one operator costs in a profiled step's trace: ``traced_op_us``, or a launch."""
        return self.launch_us if self.traced_op_us is None else self.traced_op_us

    def compute_us(self, flops: float, precision: str, size: float | None = None) -> float:
        """Microseconds ``flops`` take at the efficiency a matmul of ``size`` FLOPs reaches
        (None: of ``flops``; an attention runs its FLOPs as many head-sized matmuls)."""
        p = self.precision(precision)
        eff = self.matmul[p].at(size or flops) if p in self.matmul else 1.0
        return flops / (self.peak_tflops[p] * 1e6 * eff)

    def memory_us(self, nbytes: float, cold: bool = False) -> float:
        """Microseconds ``nbytes`` take at the bandwidth an op moving that many reaches: on
        ``memory_cold`` where ``cold`` and the profile has it, else on ``memory``."""
        curve = self.memory_cold if cold and self.memory_cold is not None else self.memory
        return nbytes / (self.memory_GBps * 1e3 * curve.at(nbytes))

    def body_us(self, flops: float, nbytes: float, precision: str) -> tuple[float, str]:
        """(microseconds, "compute" or "memory"): an op's FLOPs or bytes on the curves,
        whichever is longer, its launch left out; its bound."""
        c = self.compute_us(flops, precision) if flops > 0 else 0.0
        m = self.memory_us(nbytes) if nbytes > 0 else 0.0
        return max(c, m), "compute" if c >= m else "memory"

    def math_us(self, op: str, elements: float) -> float:
        """Microseconds op ``op`` computes its function over ``elements`` (0: an op this
        profile has no rate for, or an unknown count)."""
        rate = self.math_Gelems.get(op)
        return elements / (rate * 1e3) if rate and elements > 0 else 0.0

    def op_us(self, flops: float, nbytes: float, precision: str) -> tuple[float, str]:
        """(microseconds, "compute" or "memory"): an op's time on the roofline, its bound."""
        body, bound = self.body_us(flops, nbytes, precision)
        return body + self.launch_us, bound

    def as_json(self) -> dict:
        return (
            {
                "format": FORMAT,
                "device": self.device,
                "source": self.source,
                "peak_tflops": dict(self.peak_tflops),
                "memory_GBps": self.memory_GBps,
                "matmul": {p: c.as_json() for p, c in self.matmul.items()},
                "memory": self.memory.as_json(),
                "launch_us": self.launch_us,
            }
            | ({"step": self.step.as_json()} if self.step else {})
            | ({"math_Gelems": dict(self.math_Gelems)} if self.math_Gelems else {})
            | ({"memory_cold": self.memory_cold.as_json()} if self.memory_cold else {})
            | ({"traced_op_us": self.traced_op_us} if self.traced_op_us is not None else {})
        )


def _positive(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise RooflineError(f"{where} must be a positive number, not {value!r}")
    if not math.isfinite(value):
        raise RooflineError(f"{where} must be finite, not {value!r}")
    return float(value)


def _curve(where: str, data) -> Curve:
    if not isinstance(data, dict) or set(data) != {"sizes", "efficiency"}:
        raise RooflineError(f'{where} must be {{"sizes": [...], "efficiency": [...]}}')
    sizes, eff = data["sizes"], data["efficiency"]
    if not isinstance(sizes, list) or not isinstance(eff, list) or len(sizes) != len(eff):
        raise RooflineError(f"{where}: sizes and efficiency must be lists of one length")
    if not sizes:
        raise RooflineError(f"{where}: no points")
    s = tuple(_positive(f"{where}.sizes[{i}]", v) for i, v in enumerate(sizes))
    e = tuple(_positive(f"{where}.efficiency[{i}]", v) for i, v in enumerate(eff))
    if any(b <= a for a, b in itertools.pairwise(s)):
        raise RooflineError(f"{where}.sizes must increase")
    if any(v > 1.0 for v in e):
        raise RooflineError(f"{where}.efficiency must lie in (0, 1]")
    return Curve(s, e)


def _precisions(where: str, data, parse) -> dict:
    if not isinstance(data, dict) or not data:
        raise RooflineError(f"{where} must be an object keyed by precision")
    unknown = [k for k in data if k not in PRECISIONS]
    if unknown:
        raise RooflineError(
            f"{where} names an unknown precision {unknown[0]!r} (known: {', '.join(PRECISIONS)})"
        )
    return {k: parse(f"{where}.{k}", v) for k, v in data.items()}


KEYS = ("format", "device", "source", "peak_tflops", "memory_GBps", "matmul", "memory", "launch_us")
OPTIONAL = ("step", "math_Gelems", "memory_cold", "traced_op_us")


def from_json(data, where: str = "profile") -> Roofline:
    """The profile ``data`` holds, checked field by field."""
    if not isinstance(data, dict):
        raise RooflineError(f"{where}: not a JSON object")
    missing = [k for k in KEYS if k not in data]
    extra = [k for k in data if k not in KEYS + OPTIONAL]
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has an unknown field {extra[0]!r}"
        raise RooflineError(f"{where} {what} (fields: {', '.join(KEYS)})")
    if data["format"] != FORMAT:
        raise RooflineError(f"{where}: format {data['format']!r}, expected {FORMAT!r}")
    for k in ("device", "source"):
        if not isinstance(data[k], str):
            raise RooflineError(f"{where}.{k} must be a string")
    peaks = _precisions(f"{where}.peak_tflops", data["peak_tflops"], _positive)
    matmul = _precisions(f"{where}.matmul", data["matmul"], _curve)
    no_peak = [p for p in matmul if p not in peaks]
    if no_peak:
        raise RooflineError(f"{where}.matmul.{no_peak[0]} has no peak_tflops.{no_peak[0]}")
    return Roofline(
        device=data["device"],
        source=data["source"],
        peak_tflops=peaks,
        memory_GBps=_positive(f"{where}.memory_GBps", data["memory_GBps"]),
        matmul=matmul,
        memory=_curve(f"{where}.memory", data["memory"]),
        launch_us=_nonnegative(f"{where}.launch_us", data["launch_us"]),
        step=_step(f"{where}.step", data["step"]) if "step" in data else None,
        math_Gelems=_rates(f"{where}.math_Gelems", data.get("math_Gelems", {})),
        memory_cold=_curve(f"{where}.memory_cold", data["memory_cold"])
        if "memory_cold" in data
        else None,
        traced_op_us=_nonnegative(f"{where}.traced_op_us", data["traced_op_us"])
        if "traced_op_us" in data
        else None,
    )


def _rates(where: str, data) -> dict[str, float]:
    if not isinstance(data, dict):
        raise RooflineError(f"{where} must be an object keyed by op name")
    return {str(k): _positive(f"{where}.{k}", v) for k, v in data.items()}


def _step(where: str, data) -> StepCost:
    if not isinstance(data, dict) or set(data) != {"op_us", "efficiency"}:
        raise RooflineError(f'{where} must be {{"op_us": ..., "efficiency": ...}}')
    eff = _positive(f"{where}.efficiency", data["efficiency"])
    return StepCost(_nonnegative(f"{where}.op_us", data["op_us"]), eff)


def _nonnegative(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise RooflineError(f"{where} must be a number >= 0, not {value!r}")
    if not math.isfinite(value):
        raise RooflineError(f"{where} must be finite, not {value!r}")
    return float(value)


def read(path: Path) -> Roofline:
    """The profile in ``path``, or a one-line ``RooflineError`` naming it and why."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise RooflineError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RooflineError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return from_json(data, where=str(path))


def write(profile: Roofline, path: Path) -> Path:
    """``profile`` written to ``path`` whole or not at all (``atomic.OutputError``: one line)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise atomic.OutputError(atomic.describe(path, e)) from None
    return atomic.write_text(path, json.dumps(profile.as_json(), indent=1) + "\n")
