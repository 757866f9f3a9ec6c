"""One table of columns: what each column of results.csv is, and how ranks make it.

Each column is a row: its name, unit, how the per-rank figures become the point's figure
(``ranks``), whether it belongs to the data contract (the design notes' columns, listed first in
docs/outputs.md) or is an extra, and one line of meaning. The harness aggregates by it, the
writer refuses any key it does not list, the report picks its table's columns from it, and
docs/outputs.md's column list is made from it (a test keeps the two equal). A new metric is
one new row here.
"""

from __future__ import annotations

from bench.runfolder.column import (
    DERIVED,
    MAX,
    MEAN,
    POINT,
    RAN_ON,
    READER,
    TIMED,
    Column,
    col,
)
from bench.runfolder.replay_columns import REPLAY

TRAINING: tuple[Column, ...] = (
    col("sweep", "", POINT, True, "the sweep's name (a grid's knobs joined by commas)"),
    col("value", "", POINT, True, "the swept value (a grid's first knob)", report=2),
    col("impl", "", POINT, True, "implementation: native (PyTorch's) or ours", report=5),
    col("strategy", "", POINT, True, "ddp, fsdp, tp or accelerate"),
    col("world_size", "ranks", POINT, True, "ranks the point ran on"),
    col("status", "", POINT, True, "ok, or error (the row keeps its error text)", report=6),
    col("error", "", POINT, True, "why the point failed: the first rank's own error"),
    col(
        "diagnosis",
        "",
        POINT,
        False,
        "a failed point's one-line diagnosis from its ranks' "
        "flight records and stacks (python -m bench.hang)",
    ),
    col(
        "hang_dir",
        "",
        POINT,
        False,
        "where the failed point's ranks left their flight records and stacks",
    ),
    col(
        "step_ms_median",
        "ms",
        TIMED,
        True,
        "median step time: first rank's start to last rank's end, on a common clock",
    ),
    col("step_ms_min", "ms", TIMED, True, "fastest timed step"),
    col("step_ms_max", "ms", TIMED, True, "slowest timed step"),
    col(
        "samples_per_s",
        "1/s",
        DERIVED,
        True,
        "samples of all replicas per second: every timed step's samples over their total time",
        report=11,
    ),
    col("compute_ms", "ms", MEAN, True, "computation per traced step", report=13),
    col("comm_ms", "ms", MEAN, True, "communication (union of collectives) per step", report=14),
    col("overlap_ms", "ms", MEAN, True, "communication hidden under computation per step"),
    col("exposed_comm_ms", "ms", MEAN, True, "communication not hidden per step", report=16),
    col("idle_ms", "ms", MEAN, True, "neither computing nor communicating per step", report=17),
    col("compute_comm_ratio", "", DERIVED, True, "compute_ms / comm_ms", report=18),
    col("overlap_pct", "%", DERIVED, True, "overlap_ms / comm_ms", report=15),
    col("gpu_util_pct", "%", MEAN, True, "GPU busy share of the step (empty on CPU)", report=20),
    col(
        "peak_mem_mb",
        "MiB",
        MAX,
        True,
        "most memory live at once in a measured step, above "
        "what the process held before the point (CUDA allocator, or CPU heap)",
        report=24,
    ),
    col("comm_bytes_per_step", "B", MEAN, True, "collective payload per step (traces)", report=22),
    col("model", "", POINT, False, "the model trained", report=1),
    col("point", "", POINT, False, "the point's id: its traces are in traces/<point>/"),
    *RAN_ON,
    col("window_ms", "ms", MEAN, False, "traced step window (the breakdown's whole)"),
    col("comm_bytes_expected", "B", POINT, False, "analytical payload per step", report=23),
    col("state_mb", "MiB", MAX, False, "parameters, gradients and optimiser state held"),
    col("state_mb_expected", "MiB", POINT, False, "the ZeRO accounting of state_mb"),
    col("param_mb", "MiB", MAX, False, "parameter bytes held by a rank"),
    col("grad_mb", "MiB", MAX, False, "gradient bytes held by a rank"),
    col("optim_mb", "MiB", MAX, False, "optimiser-state bytes held by a rank"),
    col("peak_rss_mb", "MiB", MAX, False, "peak resident memory of a rank's process"),
    col(
        "cpu_busy_pct",
        "%",
        MEAN,
        False,
        "CPU traces: main thread computing or a collective in flight, share of the step",
    ),
    col("nvml_util_pct", "%", MEAN, False, "NVML's GPU utilisation, read between timed steps"),
    col(
        "peak_reserved_mb",
        "MiB",
        MAX,
        False,
        "CUDA: most memory the caching allocator held "
        "in the measured step, above the point's start (fragmentation included; NaN on CPU)",
    ),
    col(
        "data_ms",
        "ms",
        MAX,
        False,
        "loading a step's batches onto the device, median, timed apart (not in step_ms)",
    ),
    col(
        "trace_overhead_pct",
        "%",
        MEAN,
        False,
        "a traced step's time over an untraced one's, "
        "minus 1: what tracing adds to the breakdown's steps",
        report=27,
    ),
    col("params", "", POINT, False, "parameters of the plain model"),
    col("grad_bytes", "B", POINT, False, "gradient bytes of the plain model"),
    col("comm_calls_per_step", "", MEAN, False, "collective calls per step", report=21),
    col(
        "step_ms_ci_low",
        "ms",
        TIMED,
        False,
        "95 % interval of step_ms_median, low end (order statistics: distribution-free)",
    ),
    col("step_ms_ci_high", "ms", TIMED, False, "95 % interval of step_ms_median, high end"),
    col("steps", "", TIMED, False, "timed steps, every round so far"),
    col(
        "stop",
        "",
        POINT,
        False,
        "what ended this visit's timing: target (the interval is "
        "tight enough), max_steps or max_point_s (the budget)",
    ),
    col(
        "round",
        "",
        POINT,
        False,
        "the round of this visit: a point has a row per round, the last ok one is its answer",
    ),
    col("rounds", "", POINT, False, "rounds pooled in this row's figures", report=26),
    col(
        "round_spread_pct",
        "%",
        TIMED,
        False,
        "largest over smallest round median, minus 1: drift between rounds",
    ),
    col("loss", "", POINT, False, "loss of the last step", report=25),
    col(
        "checked",
        "",
        POINT,
        False,
        "the point's first step against the plain model (same "
        "seed, global batch, optimiser): ok (tolerance, figures), not checked: why, or mismatch "
        "(the error says where)",
    ),
    col("step_ms_p10", "ms", TIMED, False, "10th percentile step time"),
    col("step_ms_p90", "ms", TIMED, False, "90th percentile step time"),
    col(
        "rank_skew_ms",
        "ms",
        TIMED,
        False,
        "median over steps of the last rank's end minus the first rank's end (common clock)",
    ),
    col("scaling", "", POINT, False, "world-size sweeps: weak or strong", report=4),
    col("global_batch", "", POINT, False, "strong scaling: the global batch"),
    col("batch_per_replica", "", POINT, False, "samples per replica and micro-batch"),
    col("grad_accum", "", POINT, False, "micro-batches per optimiser step"),
    col("comm_bytes_per_sample", "B", DERIVED, False, "comm_bytes_per_step per sample"),
    col("trace_dir", "", POINT, False, "where the point's traces were written"),
    col("value2", "", POINT, False, "a grid's second value (empty outside grids)", report=3),
    col(
        "flops_per_step",
        "FLOP",
        POINT,
        False,
        "model FLOPs of one optimiser step per rank: "
        "forward and backward of every replica's micro-batches over the step's ranks (no "
        "recomputation, no optimiser)",
    ),
    col(
        "flops_source",
        "",
        POINT,
        False,
        "counted (FlopCounterMode on the plain model), "
        "workload (its flops_per_sample; with the count's ratio where 3x apart), or uncounted: "
        "why",
    ),
    col(
        "tflops_per_s", "TFLOP/s", DERIVED, False, "flops_per_step over the timed steps' mean time"
    ),
    col(
        "peak_tflops",
        "TFLOP/s",
        MEAN,
        False,
        "the peak mfu_pct is against: the GPU's "
        "datasheet dense peak at the point's precision where known, else peak_tflops_measured",
    ),
    col(
        "peak_source",
        "",
        POINT,
        False,
        "which peak: datasheet (GPU, precision, datasheet) or "
        "measured, an fp32 point's shares of FLOPs in TF32; 'impossible peak' first where the "
        "model computed faster than it",
    ),
    col(
        "peak_tflops_measured",
        "TFLOP/s",
        MEAN,
        False,
        "this machine's best rate over a few "
        "square matmul sizes in the point's precision, timed by every rank at once",
    ),
    col(
        "mfu_pct",
        "%",
        DERIVED,
        False,
        "model FLOPs utilisation: tflops_per_s / peak_tflops "
        "(PaLM, appendix B); empty where it would exceed 100 % (the peak cannot be right)",
        report=12,
    ),
    col("efficiency_pct", "%", READER, False, "world-size sweeps: speedup / ideal", report=7),
    col("compute_share_pct", "%", READER, False, "compute_ms / window_ms", report=19),
    col("typical_ms", "ms", READER, False, "geometric mean of the rounds' medians", report=8),
    col(
        "typical_ms_low",
        "ms",
        READER,
        False,
        "its 95 % interval, low end: the rounds' drift "
        "included (or, in one round, the noise floor)",
        report=9,
    ),
    col("typical_ms_high", "ms", READER, False, "its 95 % interval, high end", report=10),
)

COLLECTIVE: tuple[Column, ...] = (
    col("sweep", "", POINT, True, "message_size"),
    col("collective", "", POINT, True, "all_reduce, all_gather, reduce_scatter ...", report=1),
    col("impl", "", POINT, True, "native or reference", report=6),
    col("world_size", "ranks", POINT, True, "ranks"),
    col("dtype", "", POINT, True, "element type", report=3),
    col("size_bytes", "B", POINT, True, "S, the whole buffer (nccl-tests' size)", report=4),
    col("count", "", POINT, True, "elements", report=5),
    col(
        "time_us",
        "us",
        TIMED,
        True,
        "time per call: a block's time over its block_calls calls "
        "back to back (nccl-tests' method), median over blocks",
        report=8,
    ),
    col("algbw_GBps", "GB/s", DERIVED, True, "S / time", report=9),
    col("busbw_GBps", "GB/s", DERIVED, True, "algbw x the collective's bus factor", report=10),
    col("wrong", "", POINT, True, "elements differing from the exact result, all ranks", report=13),
    col(
        "status",
        "",
        POINT,
        True,
        "ok, error, or unsupported (the collective has no such form)",
        report=14,
    ),
    col("error", "", POINT, True, "why the size failed, or why it is unsupported"),
    col("op", "", POINT, False, "reduction: sum, avg or max", report=2),
    col(
        "inplace",
        "",
        POINT,
        False,
        "False: out of place (two buffers; nccl-tests' first "
        "figure); True: in place (one buffer, laid out as nccl-tests does)",
        report=7,
    ),
    col("time_us_min", "us", TIMED, False, "fastest block, per call"),
    col("time_us_max", "us", TIMED, False, "slowest block, per call"),
    col("busbw_frac_p2p", "", DERIVED, False, "busbw / the measured point-to-point bandwidth"),
    col(
        "time_us_ci_low", "us", TIMED, False, "95 % interval of time_us, low end (order statistics)"
    ),
    col("time_us_ci_high", "us", TIMED, False, "95 % interval of time_us, high end"),
    col("busbw_GBps_ci_low", "GB/s", DERIVED, False, "busbw at time_us_ci_high", report=11),
    col("busbw_GBps_ci_high", "GB/s", DERIVED, False, "busbw at time_us_ci_low", report=12),
    col("iters", "", POINT, False, "timed calls, all blocks (adaptive: at least -n)"),
    col("block_calls", "", POINT, False, "calls per block: -n, or --max-steps / 6 if fewer"),
    col("stop", "", POINT, False, "what ended the timing: target, max_steps or max_point_s"),
    col("point", "", POINT, False, "the row's id (in-place rows end in -inplace)"),
    *RAN_ON,
)

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
