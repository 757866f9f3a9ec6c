"""The request: the planner's command line parsed and checked, nothing run. Each bad input is
one line (a ``ValueError``, or argparse's own); a good one is a ``PlanRequest``, the first
stage's hand-off, and the argparse namespace goes no further."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.plan.devices import DEVICES, Device, device
from bench.plan.families import FAMILIES
from bench.plan.topology import DEFAULT_LINKS, link_names
from bench.roofline.profile import Roofline, RooflineError, read
from bench.runfolder.peaks import datasheet_peak
from parallel_kernels.checkpointing import MODES, parse_checkpointing
from parallel_kernels.compiling import MODES as COMPILE_MODES
from parallel_kernels.float8 import FP8, torchao_missing
from parallel_kernels.models import workload

GPU_ALLOWANCE_GIB = 2.0  # CUDA context and NCCL's buffers, about a GiB each
OPTIONS = {  # what --option narrows, and each one's values planned by default
    # "on" is full's other spelling; every selective:layer=N is planned where --option names
    # it, none by default (each N a third of the space again: docs/plan.md, "The space")
    "activation_checkpointing": ("off", "full", "selective:op"),
    "precision": ("fp32", "bf16"),
    "compile": ("off",),
}
# values --option names that are not planned by default (each would grow the space by as much
# again): fp8 where the device has float8 matmuls, compile's modes (docs/plan.md, "The space")
NAMED_ONLY = {"precision": (FP8,), "compile": COMPILE_MODES[1:]}
TP_DEGREES = (1, 2, 4, 8, 16)  # the degrees a batch may split over (within a node)


@dataclass(frozen=True)
class PlanRequest:
    """What is planned and how, as the flags gave it, checked (each field is its flag's)."""

    model: str
    world_size: int
    global_batch: int
    gpus_per_node: int = 8
    device: Device = field(default_factory=lambda: DEVICES["h100"])
    link: str | None = None  # None: the default presets, or on cpu this machine's measured
    collectives: Path | None = None  # a --sweep message_size run whose fit prices both links
    families: tuple[str, ...] = field(default_factory=lambda: tuple(FAMILIES))  # --family
    # --option: every knob the space varies, with the values planned (narrowed where given)
    options: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(OPTIONS))
    mfu: float | None = None  # assumed model FLOPs utilisation, %
    compute: tuple[Path, ...] = ()  # runs the computation's rate is fitted to
    device_profile: Roofline | None = None  # --device-profile FILE: the target's roofline
    calibration_launch: bool = True  # a CPU plan calibrates its roofline by a launch here
    launch_seconds: float | None = None  # a launched point's cycles; None: each launch's own
    allowance_gib: float | None = None  # None: the device's default
    tie_pct: float = 15.0
    verify: int = 0
    workers: int = 1
    top: int = 15
    out: Path | None = None

    @property
    def allowance(self) -> float:
        """Memory per rank the allocator does not see: as given, else the device's default."""
        if self.allowance_gib is not None:
            return self.allowance_gib
        return GPU_ALLOWANCE_GIB if self.device.gpu_name else 0.0

    @property
    def links(self) -> str:
        return self.link or DEFAULT_LINKS

    @property
    def ranks_here(self) -> int:
        """Ranks of one node: what a plan for this machine launches here."""
        return min(self.world_size, self.gpus_per_node)

    def folder(self, stamp: str) -> Path:
        return self.out or Path("results") / f"plan-{stamp}-{self.model.replace(':', '_')}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"bench.plan: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser(description: str = "") -> argparse.ArgumentParser:
    p = _Parser(prog="python -m bench.plan", description=description)
    _what(p)
    _how(p)
    return p


def _what(p: argparse.ArgumentParser) -> None:
    """What is planned: the model, the machines and links, the batch, the space."""
    p.add_argument("--model", required=True, help="a model of the zoo or the registry")
    p.add_argument("--world-size", type=int, required=True, help="ranks the job will run on")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--device", default="h100", help="h100, h200, a100, a100_40g, b200, cpu")
    p.add_argument(
        "--link",
        help="intra-node[,inter-node] link presets (bench.model.links) or alpha=..,bw=.. "
        f"(default {DEFAULT_LINKS}; on --device cpu, this machine's collectives measured)",
    )
    p.add_argument(
        "--collectives",
        type=Path,
        help="a --sweep message_size run of this machine: its fitted collectives for both links",
    )
    p.add_argument("--global-batch", type=int, required=True, help="samples per optimiser step")
    p.add_argument(
        "--family",
        "--strategy",
        dest="family",
        help=f"comma list of {', '.join(FAMILIES)} (default all; --strategy: the same)",
    )
    p.add_argument(
        "--option",
        "--only",
        dest="option",
        action="append",
        default=[],
        metavar="KNOB=VALUES",
        help="narrow a dimension: activation_checkpointing=off,selective:layer=2, "
        "precision=bf16,fp8, compile=off,blocks,model (repeatable; --only: the same)",
    )


def _how(p: argparse.ArgumentParser) -> None:
    """How it is predicted, verified and shown."""
    p.add_argument(
        "--mfu", type=float, help="assumed model FLOPs utilisation, %% (default 40 on GPUs)"
    )
    p.add_argument(
        "--compute",
        type=lambda t: [Path(x) for x in t.split(",") if x],
        help="RUN[,RUN]: --sweep precision runs of the model on one rank (one micro-batch, "
        "and accumulated ones) to fit the computation's rate to (default on cpu: made here)",
    )
    p.add_argument(
        "--device-profile",
        type=Path,
        metavar="FILE",
        help="the target's roofline (docs/roofline.md) to price the ops on, in place of the "
        "datasheet's stated one (a GPU) or this host's measured one (cpu)",
    )
    p.add_argument(
        "--calibration-launch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on cpu, calibrate the roofline by a short launch of the model here (default); "
        "--no-calibration-launch prices the ops on the profile as it is",
    )
    p.add_argument(
        "--launch-seconds",
        type=float,
        metavar="S",
        help="seconds each point of the plan's own launches (the calibration, --verify) is "
        "timed in interleaved cycles (default 4 and 6): fewer are quicker and noisier",
    )
    p.add_argument(
        "--allowance-gib",
        type=float,
        help="memory per rank the allocator does not see (default 2 on GPUs, 0 on cpu)",
    )
    p.add_argument(
        "--tie-pct",
        type=float,
        default=15.0,
        help="predicted steps within this of the best are tied with it (default 15: the "
        "step-time error the planner is held to, docs/plan.md)",
    )
    p.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="run the K best here (a plan for this machine: --device cpu) and compare",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes tracking configurations at once (default: the cores, at most 8)",
    )
    p.add_argument("--top", type=int, default=15, help="rows printed (default 15)")
    p.add_argument("--out", type=Path, help="folder for plan.csv (default results/plan-...)")


def parse_request(argv: list[str] | None, description: str = "") -> PlanRequest:
    """The checked request, or a one-line ValueError (argparse's own errors exit 2)."""
    args = build_parser(description).parse_args(argv)
    if args.verify and (args.device != "cpu" or args.verify < 0):
        raise ValueError(
            "--verify K runs the plan's best here: plan for this machine "
            "(--device cpu, --world-size the ranks to launch here)"
        )
    try:
        workload(args.model)
    except (KeyError, ValueError) as e:
        raise ValueError(str(e).strip("'\"")) from None
    _check_scale(args.world_size, args.gpus_per_node, args.global_batch)
    dev = device(args.device)
    if args.link is not None:
        link_names(args.link)
    if args.collectives is not None and not (args.collectives / "results.csv").is_file():
        raise ValueError(f"--collectives {args.collectives}: not a run folder (no results.csv)")
    families, options = _families(args.family), _options(args.option)
    if FP8 in options.get("precision", ()):
        _check_float8(dev)
    _check_computation(args.mfu, args.compute)
    if args.allowance_gib is not None and not (
        args.allowance_gib >= 0 and math.isfinite(args.allowance_gib)
    ):
        raise ValueError("--allowance-gib must be 0 or more")
    if args.launch_seconds is not None and not args.launch_seconds > 0:
        raise ValueError("--launch-seconds must be more than 0")
    return PlanRequest(
        model=args.model,
        world_size=args.world_size,
        global_batch=args.global_batch,
        gpus_per_node=args.gpus_per_node,
        device=dev,
        link=args.link,
        collectives=args.collectives,
        families=families,
        options={**OPTIONS, **options},
        mfu=args.mfu,
        compute=tuple(args.compute or ()),
        device_profile=_device_profile(args.device_profile, options.get("precision")),
        calibration_launch=args.calibration_launch,
        launch_seconds=args.launch_seconds,
        allowance_gib=args.allowance_gib,
        tie_pct=args.tie_pct,
        verify=args.verify,
        workers=max(1, args.workers),
        top=args.top,
        out=args.out,
    )


def _check_scale(world: int, gpus_per_node: int, global_batch: int) -> None:
    """Whole nodes, and a global batch some layout's data-parallel replicas split."""
    if world < 1 or gpus_per_node < 1:
        raise ValueError("--world-size and --gpus-per-node must be 1 or more")
    if world > gpus_per_node and world % gpus_per_node:
        raise ValueError(
            f"world size {world} is not a whole number of nodes of {gpus_per_node} ranks"
        )
    if global_batch < 1:
        raise ValueError("--global-batch must be 1 or more")
    degrees = [d for d in TP_DEGREES if d <= min(gpus_per_node, world)]
    if not any(global_batch % (world // d) == 0 for d in degrees):
        raise ValueError(
            f"global batch {global_batch} does not split over the {world} ranks' "
            f"data-parallel replicas (nor over those of any TP degree within a node)"
        )


def _families(text: str | None) -> tuple[str, ...]:
    if not text:
        return tuple(FAMILIES)
    names = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in FAMILIES]
    if bad or not names:
        raise ValueError(
            f"unknown family {bad[0] if bad else text!r} (known: {', '.join(FAMILIES)})"
        )
    return names


def _options(items: list[str]) -> dict[str, tuple[str, ...]]:
    out = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or key not in OPTIONS:
            raise ValueError(
                f"--option {item!r}: give KNOB=VALUES with KNOB one of {', '.join(OPTIONS)}"
            )
        chosen = tuple(dict.fromkeys(_spelled(key, v) for v in values.split(",") if v.strip()))
        bad = [v for v in chosen if v is None or v not in _accepted(key, v)]
        if bad or not chosen:
            among = MODES if key == "activation_checkpointing" else ", ".join(_accepted(key, ""))
            raise ValueError(f"--option {key}: {values!r} is not among {among}")
        out[key] = chosen
    return out


def _spelled(key: str, value: str) -> str | None:
    """A value as rows spell it: a checkpointing mode's label (``on``: ``full``), None for one
    that names no mode; any other value as given."""
    value = value.strip().lower()
    if key != "activation_checkpointing":
        return value
    try:
        return parse_checkpointing(value)
    except ValueError:
        return None


def _accepted(key: str, value: str) -> tuple[str, ...]:
    """The values ``--option key`` takes: checkpointing's every mode (a mode spelled as rows
    spell it is its own), another knob's planned values."""
    if key == "activation_checkpointing":
        return (value,)
    return OPTIONS[key] + NAMED_ONLY.get(key, ())


def float8_devices() -> tuple[str, ...]:
    """The devices whose datasheet states float8 matmuls (an fp8 peak)."""
    return tuple(
        name for name, d in DEVICES.items() if d.gpu_name and datasheet_peak(d.gpu_name, FP8)
    )


def _check_float8(dev: Device) -> None:
    """fp8 planned: a device with float8 matmuls, and torchao to convert the blocks as the run
    does, or a one-line ValueError."""
    if dev.name not in float8_devices():
        raise ValueError(
            f"fp8 needs float8 matmuls: {', '.join(float8_devices())} (not {dev.name})"
        )
    missing = torchao_missing()
    if missing is not None:
        raise ValueError(missing)


def _check_computation(mfu: float | None, compute: list[Path] | None) -> None:
    if compute is not None and mfu is not None:
        raise ValueError("give --mfu or --compute, not both")
    if mfu is not None and not 0 < mfu <= 100:
        raise ValueError(f"--mfu {mfu:g}: a percentage above 0, at most 100")
    for run in compute or []:
        if not (run / "results.csv").is_file():
            raise ValueError(f"--compute {run}: not a run folder (no results.csv)")


def _device_profile(path: Path | None, precisions: tuple[str, ...] | None) -> Roofline | None:
    """The roofline ``--device-profile`` names, with figures for each precision planned
    (``precisions``, None: every one), or a one-line ValueError saying why not."""
    if path is None:
        return None
    try:
        roofline = read(path)
        for p in precisions or OPTIONS["precision"]:
            roofline.precision(p)
    except RooflineError as e:
        raise ValueError(
            f"--device-profile {e}" if str(path) in str(e) else f"--device-profile {path}: {e}"
        ) from None
    return roofline
