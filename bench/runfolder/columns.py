"""One table of columns: what each column of results.csv is, and how ranks make it.

Each column is a row: its name, unit, how the per-rank figures become the point's figure
(``ranks``), whether it belongs to the data contract (the design notes' columns, listed first in
docs/outputs.md) or is an extra, and one line of meaning. The harness aggregates by it, the
writer refuses any key it does not list, the report picks its table's columns from it, and
docs/outputs.md's column list is made from it (a test keeps the two equal). A new metric is
one new row here.
"""

from __future__ import annotations

from dataclasses import dataclass

# How the ranks' figures become a point's figure:
POINT = "point"  # the same on every rank: a fact of the point or of its outcome
TIMED = "timed"  # already cross-rank: the timing all-reduces each step's first start and last end
MEAN = "mean"  # mean over ranks (NaN where a rank has none)
MAX = "max"  # largest over ranks (memory: the rank that needs most)
DERIVED = "derived"  # computed from other aggregated columns
READER = "reader"  # computed by the reading side; never written to results.csv


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    ranks: str
    contract: bool  # part of the data contract (in its order) or an extra
    meaning: str
    report: int = 0  # position in the report's table of every point (0: not shown)

    @property
    def written(self) -> bool:
        return self.ranks != READER


def _c(name, unit, ranks, contract, meaning, report=0) -> Column:
    return Column(name, unit, ranks, contract, meaning, report)


# Where every row ran, in each table.
_RAN_ON = (
    _c("backend", "", POINT, False, "gloo or nccl"),
    _c("device", "", POINT, False, "cpu or cuda"),
)

TRAINING: tuple[Column, ...] = (
    _c("sweep", "", POINT, True, "the sweep's name (a grid's knobs joined by commas)"),
    _c("value", "", POINT, True, "the swept value (a grid's first knob)", report=2),
    _c("impl", "", POINT, True, "implementation: native (PyTorch's) or ours", report=5),
    _c("strategy", "", POINT, True, "ddp, fsdp, tp or accelerate"),
    _c("world_size", "ranks", POINT, True, "ranks the point ran on"),
    _c("status", "", POINT, True, "ok, or error (the row keeps its error text)", report=6),
    _c("error", "", POINT, True, "why the point failed: the first rank's own error"),
    _c("diagnosis", "", POINT, False, "a failed point's one-line diagnosis from its ranks' "
       "flight records and stacks (python -m bench.hang)"),
    _c("hang_dir", "", POINT, False, "where the failed point's ranks left their flight records "
       "and stacks"),
    _c("step_ms_median", "ms", TIMED, True, "median step time: first rank's start to last "
       "rank's end, on a common clock"),
    _c("step_ms_min", "ms", TIMED, True, "fastest timed step"),
    _c("step_ms_max", "ms", TIMED, True, "slowest timed step"),
    _c("samples_per_s", "1/s", DERIVED, True, "samples of all replicas per second: every timed "
       "step's samples over their total time", report=11),
    _c("compute_ms", "ms", MEAN, True, "computation per traced step", report=13),
    _c("comm_ms", "ms", MEAN, True, "communication (union of collectives) per step", report=14),
    _c("overlap_ms", "ms", MEAN, True, "communication hidden under computation per step"),
    _c("exposed_comm_ms", "ms", MEAN, True, "communication not hidden per step", report=16),
    _c("idle_ms", "ms", MEAN, True, "neither computing nor communicating per step", report=17),
    _c("compute_comm_ratio", "", DERIVED, True, "compute_ms / comm_ms", report=18),
    _c("overlap_pct", "%", DERIVED, True, "overlap_ms / comm_ms", report=15),
    _c("gpu_util_pct", "%", MEAN, True, "GPU busy share of the step (empty on CPU)", report=20),
    _c("peak_mem_mb", "MiB", MAX, True, "most memory live at once in a measured step, above "
       "what the process held before the point (CUDA allocator, or CPU heap)", report=24),
    _c("comm_bytes_per_step", "B", MEAN, True, "collective payload per step (traces)", report=22),
    _c("model", "", POINT, False, "the model trained", report=1),
    _c("point", "", POINT, False, "the point's id: its traces are in traces/<point>/"),
    *_RAN_ON,
    _c("window_ms", "ms", MEAN, False, "traced step window (the breakdown's whole)"),
    _c("comm_bytes_expected", "B", POINT, False, "analytical payload per step", report=23),
    _c("state_mb", "MiB", MAX, False, "parameters, gradients and optimiser state held"),
    _c("state_mb_expected", "MiB", POINT, False, "the ZeRO accounting of state_mb"),
    _c("param_mb", "MiB", MAX, False, "parameter bytes held by a rank"),
    _c("grad_mb", "MiB", MAX, False, "gradient bytes held by a rank"),
    _c("optim_mb", "MiB", MAX, False, "optimiser-state bytes held by a rank"),
    _c("peak_rss_mb", "MiB", MAX, False, "peak resident memory of a rank's process"),
    _c("cpu_busy_pct", "%", MEAN, False, "CPU traces: main thread computing or a collective "
       "in flight, share of the step"),
    _c("nvml_util_pct", "%", MEAN, False, "NVML's GPU utilisation, read between timed steps"),
    _c("peak_reserved_mb", "MiB", MAX, False, "CUDA: most memory the caching allocator held "
       "in the measured step, above the point's start (fragmentation included; NaN on CPU)"),
    _c("data_ms", "ms", MAX, False, "loading a step's batches onto the device, median, timed "
       "apart (not in step_ms)"),
    _c("trace_overhead_pct", "%", MEAN, False, "a traced step's time over an untraced one's, "
       "minus 1: what tracing adds to the breakdown's steps", report=27),
    _c("params", "", POINT, False, "parameters of the plain model"),
    _c("grad_bytes", "B", POINT, False, "gradient bytes of the plain model"),
    _c("comm_calls_per_step", "", MEAN, False, "collective calls per step", report=21),
    _c("step_ms_ci_low", "ms", TIMED, False, "95 % interval of step_ms_median, low end "
       "(order statistics: distribution-free)"),
    _c("step_ms_ci_high", "ms", TIMED, False, "95 % interval of step_ms_median, high end"),
    _c("steps", "", TIMED, False, "timed steps, every round so far"),
    _c("stop", "", POINT, False, "what ended this visit's timing: target (the interval is "
       "tight enough), max_steps or max_point_s (the budget)"),
    _c("round", "", POINT, False, "the round of this visit: a point has a row per round, the "
       "last ok one is its answer"),
    _c("rounds", "", POINT, False, "rounds pooled in this row's figures", report=26),
    _c("round_spread_pct", "%", TIMED, False, "largest over smallest round median, minus 1: "
       "drift between rounds"),
    _c("loss", "", POINT, False, "loss of the last step", report=25),
    _c("checked", "", POINT, False, "the point's first step against the plain model (same "
       "seed, global batch, optimiser): ok (tolerance, figures), not checked: why, or mismatch "
       "(the error says where)"),
    _c("step_ms_p10", "ms", TIMED, False, "10th percentile step time"),
    _c("step_ms_p90", "ms", TIMED, False, "90th percentile step time"),
    _c("rank_skew_ms", "ms", TIMED, False, "median over steps of the last rank's end minus the "
       "first rank's end (common clock)"),
    _c("scaling", "", POINT, False, "world-size sweeps: weak or strong", report=4),
    _c("global_batch", "", POINT, False, "strong scaling: the global batch"),
    _c("batch_per_replica", "", POINT, False, "samples per replica and micro-batch"),
    _c("grad_accum", "", POINT, False, "micro-batches per optimiser step"),
    _c("comm_bytes_per_sample", "B", DERIVED, False, "comm_bytes_per_step per sample"),
    _c("trace_dir", "", POINT, False, "where the point's traces were written"),
    _c("value2", "", POINT, False, "a grid's second value (empty outside grids)", report=3),
    _c("flops_per_step", "FLOP", POINT, False, "model FLOPs of one optimiser step per rank: "
       "forward and backward of every replica's micro-batches over the step's ranks (no "
       "recomputation, no optimiser)"),
    _c("flops_source", "", POINT, False, "counted (FlopCounterMode on the plain model), "
       "workload (its flops_per_sample; with the count's ratio where 3x apart), or uncounted: "
       "why"),
    _c("tflops_per_s", "TFLOP/s", DERIVED, False, "flops_per_step over the timed steps' mean "
       "time"),
    _c("peak_tflops", "TFLOP/s", MEAN, False, "the peak mfu_pct is against: the GPU's "
       "datasheet dense peak at the point's precision where known, else peak_tflops_measured"),
    _c("peak_source", "", POINT, False, "which peak: datasheet (GPU, precision, datasheet) or "
       "measured, an fp32 point's shares of FLOPs in TF32; 'impossible peak' first where the "
       "model computed faster than it"),
    _c("peak_tflops_measured", "TFLOP/s", MEAN, False, "this machine's best rate over a few "
       "square matmul sizes in the point's precision, timed by every rank at once"),
    _c("mfu_pct", "%", DERIVED, False, "model FLOPs utilisation: tflops_per_s / peak_tflops "
       "(PaLM, appendix B); empty where it would exceed 100 % (the peak cannot be right)",
       report=12),
    _c("efficiency_pct", "%", READER, False, "world-size sweeps: speedup / ideal", report=7),
    _c("compute_share_pct", "%", READER, False, "compute_ms / window_ms", report=19),
    _c("typical_ms", "ms", READER, False, "geometric mean of the rounds' medians", report=8),
    _c("typical_ms_low", "ms", READER, False, "its 95 % interval, low end: the rounds' drift "
       "included (or, in one round, the noise floor)", report=9),
    _c("typical_ms_high", "ms", READER, False, "its 95 % interval, high end", report=10),
)  # fmt: skip

COLLECTIVE: tuple[Column, ...] = (
    _c("sweep", "", POINT, True, "message_size"),
    _c("collective", "", POINT, True, "all_reduce, all_gather, reduce_scatter ...", report=1),
    _c("impl", "", POINT, True, "native or reference", report=6),
    _c("world_size", "ranks", POINT, True, "ranks"),
    _c("dtype", "", POINT, True, "element type", report=3),
    _c("size_bytes", "B", POINT, True, "S, the whole buffer (nccl-tests' size)", report=4),
    _c("count", "", POINT, True, "elements", report=5),
    _c("time_us", "us", TIMED, True, "time per call: a block's time over its block_calls calls "
       "back to back (nccl-tests' method), median over blocks", report=7),
    _c("algbw_GBps", "GB/s", DERIVED, True, "S / time", report=8),
    _c("busbw_GBps", "GB/s", DERIVED, True, "algbw x the collective's bus factor", report=9),
    _c("wrong", "", POINT, True, "elements differing from the exact result, all ranks", report=12),
    _c("status", "", POINT, True, "ok, error, or unsupported (the collective has no such "
       "form)", report=13),
    _c("error", "", POINT, True, "why the size failed, or why it is unsupported"),
    _c("op", "", POINT, False, "reduction: sum, avg or max", report=2),
    _c("inplace", "", POINT, False, "False: out of place (two buffers; nccl-tests' first "
       "figure); True: in place (one buffer, laid out as nccl-tests does)", report=6),
    _c("time_us_min", "us", TIMED, False, "fastest block, per call"),
    _c("time_us_max", "us", TIMED, False, "slowest block, per call"),
    _c("busbw_frac_p2p", "", DERIVED, False, "busbw / the measured point-to-point bandwidth"),
    _c("time_us_ci_low", "us", TIMED, False, "95 % interval of time_us, low end (order "
       "statistics)"),
    _c("time_us_ci_high", "us", TIMED, False, "95 % interval of time_us, high end"),
    _c("busbw_GBps_ci_low", "GB/s", DERIVED, False, "busbw at time_us_ci_high", report=10),
    _c("busbw_GBps_ci_high", "GB/s", DERIVED, False, "busbw at time_us_ci_low", report=11),
    _c("iters", "", POINT, False, "timed calls, all blocks (adaptive: at least -n)"),
    _c("block_calls", "", POINT, False, "calls per block: -n, or --max-steps / 6 if fewer"),
    _c("stop", "", POINT, False, "what ended the timing: target, max_steps or max_point_s"),
    _c("point", "", POINT, False, "the row's id (in-place rows end in -inplace)"),
    *_RAN_ON,
)  # fmt: skip

# A replay (python -m bench.replay): a row per collective of a traced step, per way of costing
# it (replayed with an implementation, or priced on a link), and a row per step with the totals.
REPLAY: tuple[Column, ...] = (
    _c("sweep", "", POINT, True, "replay"),
    _c("source", "", POINT, True, "replayed (run here) or priced (a link's alpha-beta costs, or "
       "this machine's fitted ones; not run)"),
    _c("impl", "", POINT, True, "replayed: native or reference; priced: empty", report=3),
    _c("link", "", POINT, True, "priced: the link preset, alpha=..,beta=.., or fitted:<run>",
       report=4),
    _c("kind", "", POINT, True, "call (one collective) or step (the step's totals)"),
    _c("step", "", POINT, True, "the traced profiler step", report=1),
    _c("index", "", POINT, True, "the call's place in its step (calls in issue order)",
       report=2),
    _c("op", "", POINT, True, "all_reduce, broadcast, all_gather, reduce_scatter, all_to_all",
       report=5),
    _c("dtype", "", POINT, True, "element type", report=6),
    _c("count", "", POINT, True, "elements of a rank's input"),
    _c("size_bytes", "B", POINT, True, "S, nccl-tests' size of the call (all-gather: its "
       "output)", report=7),
    _c("group_size", "ranks", POINT, True, "ranks of the call's process group", report=8),
    _c("traced_us", "us", TIMED, True, "the call's traced time: its shortest duration across the "
       "ranks traced (the transfer, without waiting for a late rank); a step: the sum", report=9),
    _c("time_us", "us", TIMED, True, "replayed: median over repetitions of the shortest "
       "duration across ranks (as traced_us); priced: the model's time; a step: the sum",
       report=10),
    _c("busbw_GBps", "GB/s", DERIVED, True, "S / time_us x the collective's bus factor",
       report=11),
    _c("wrong", "", POINT, True, "replayed: elements differing from the exact result, all "
       "ranks", report=12),
    _c("status", "", POINT, True, "ok, error (the backend's message in error), or unsupported",
       report=13),
    _c("error", "", POINT, True, "why the call was not replayed"),
    _c("group", "", POINT, False, "the process group's name in the trace"),
    _c("group_ranks", "", POINT, False, "its ranks"),
    _c("traced_us_max", "us", TIMED, False, "the call's longest traced duration across ranks"),
    _c("time_us_max", "us", TIMED, False, "replayed: median over repetitions of the longest "
       "duration across ranks"),
    _c("traced_busbw_GBps", "GB/s", DERIVED, False, "busbw of traced_us"),
    _c("reps", "", POINT, False, "replayed: timed repetitions of the step"),
    _c("point", "", POINT, False, "the row's id"),
    *_RAN_ON,
)  # fmt: skip

# Every timed sample of every point (samples.csv): the slowest rank's time of each timed step
# or iteration, so that runs can be compared on samples rather than on medians.
SAMPLE_COLUMNS = ["point", "round", "index", "ms"]

# noise.csv: the reference workload timed at each gap between points (``gap`` counts them,
# ``after`` names the point before it, empty at a round's start): its median, extremes, count.
NOISE_COLUMNS = ["gap", "round", "after", "ms", "ms_min", "ms_max", "n"]


def written(table: tuple[Column, ...]) -> list[str]:
    """The columns of results.csv, in order: the contract's, then the extras."""
    cols = [c for c in table if c.written]
    return [c.name for c in cols if c.contract] + [c.name for c in cols if not c.contract]


def contract(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in table if c.contract]


def by_ranks(table: tuple[Column, ...], how: str) -> list[str]:
    return [c.name for c in table if c.ranks == how]


def report_columns(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in sorted((c for c in table if c.report), key=lambda c: c.report)]


def markdown(table: tuple[Column, ...]) -> str:
    """The table as docs/outputs.md lists it."""
    lines = ["| column | unit | ranks | contract | meaning |", "|---|---|---|---|---|"]
    lines += [
        f"| `{c.name}` | {c.unit} | {c.ranks} | {'yes' if c.contract else ''} | {c.meaning} |"
        for c in table
    ]
    return "\n".join(lines)


def docs_block() -> str:
    """What docs/outputs.md holds between its column markers (a test keeps them equal)."""
    return (
        "Training sweeps (`results.csv`; ranks: how the ranks' figures become the point's; "
        "`reader` columns are computed by the report, never written):\n\n"
        + markdown(TRAINING)
        + "\n\nThe collective sweep (`--sweep message_size`):\n\n"
        + markdown(COLLECTIVE)
        + "\n\nA replay of a traced job's communication (`python -m bench.replay`):\n\n"
        + markdown(REPLAY)
    )
