"""The training sweeps' table (results.csv): its columns, one ``Column`` row each, in their
order, and last the columns the reading side computes from a row (never written), so that
writer and readers name them alike; ``columns.py`` gathers the tables and what is made from
them."""

from __future__ import annotations

from bench.runfolder.column import (
    DERIVED,
    MAX,
    MEAN,
    POINT,
    RAN_ON,
    RANKS,
    READER,
    TIMED,
    Column,
)

# The MFU waterfall's parts of a traced step, each the mean over the profiled steps and ranks
# (bench/runner/measure/waterfall_columns.py); all but wf_ideal_ms and wf_matmul_loss_ms, or
# wf_matmul_ms in their place, add up to window_ms.
WATERFALL: tuple[Column, ...] = (
    Column(
        name="wf_ideal_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: the traced step's matmul, attention and convolution FLOPs at "
        "the peak of wf_profile at their precision (its share of window_ms is the achieved "
        "MFU); empty where not priced (no shapes, no profile)",
    ),
    Column(
        name="wf_matmul_loss_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: matmul, attention and convolution time beyond wf_ideal_ms",
    ),
    Column(
        name="wf_matmul_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: matmul, attention and convolution ops' time, "
        "wf_ideal_ms + wf_matmul_loss_ms where priced",
    ),
    Column(
        name="wf_memory_bound_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: the other ops' time (elementwise, normalisation, copies; "
        "memcpy and memset on a GPU)",
    ),
    Column(
        name="wf_recompute_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: forward ops recomputed in backward (activation checkpointing)",
    ),
    Column(
        name="wf_optimizer_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: the optimiser step's ops",
    ),
    Column(
        name="wf_exposed_comm_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: communication not hidden under computation",
    ),
    Column(
        name="wf_idle_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: nothing running",
    ),
    Column(
        name="wf_other_ms",
        unit="ms",
        ranks=MEAN,
        meaning="MFU waterfall: time outside any op (an annotation's or autograd node's own; "
        "other device work)",
    ),
    Column(
        name="wf_profile",
        ranks=POINT,
        meaning="the roofline the MFU waterfall is priced on: this host's measured profile "
        "on a CPU, the datasheet's stated one on a GPU (docs/roofline.md)",
    ),
    Column(
        name="wf_unpriced",
        ranks=POINT,
        meaning="what the MFU waterfall could not price, and why (no shapes, no device "
        "profile); empty where it priced every part",
    ),
)

# A pipeline's figures (bench/runner/measure/pipeline_columns.py): filled only for points whose
# implementation steps by a schedule, a stage a rank (its place in the pipeline).
PIPELINE: tuple[Column, ...] = (
    Column(
        name="pp_bubble_pct",
        unit="%",
        ranks=MAX,
        meaning="pipelines: the most idle stage's bubble, the share of its traced steps' "
        "schedule span ('pipeline schedule') it did not compute (breakdown's computation: "
        "CPU, the main thread less its waits; GPU, compute kernels)",
    ),
    Column(
        name="pp_bubble_mean_pct",
        unit="%",
        ranks=MEAN,
        meaning="pipelines: the stages' bubble, mean over stages",
    ),
    Column(
        name="pp_bubble_theory_pct",
        numeric=True,
        unit="%",
        ranks=POINT,
        meaning="pipelines: the schedule's theoretical bubble, (p-1)/(v m+p-1) of p stages of "
        "equal work, v a rank, m micro-batches",
    ),
    Column(
        name="pp_bubble_by_rank_pct",
        unit="%",
        ranks=RANKS,
        meaning="pipelines: each rank's stage's bubble, in rank order, ';'-joined",
    ),
    Column(
        name="pp_peak_mem_by_rank_mb",
        unit="MiB",
        ranks=RANKS,
        meaning="pipelines: each rank's peak_mem_mb (its stage's), in rank order, ';'-joined",
    ),
    Column(
        name="pp_p2p_bytes_per_step",
        unit="B",
        ranks=MEAN,
        meaning="pipelines: point-to-point bytes a stage sends per step (its traced sends in "
        "the schedule span), mean over stages",
    ),
    Column(
        name="pp_p2p_bytes_expected",
        numeric=True,
        unit="B",
        ranks=POINT,
        meaning="pipelines: pp_p2p_bytes_per_step counted from the stages' shapes: each "
        "activation forward and its gradient back, per micro-batch",
    ),
)

TRAINING: tuple[Column, ...] = (
    Column(
        name="sweep",
        ranks=POINT,
        contract=True,
        meaning="the sweep's name (a grid's knobs joined by commas)",
    ),
    Column(
        name="value",
        ranks=POINT,
        contract=True,
        meaning="the swept value (a grid's first knob)",
        report=2,
        console=2,
    ),
    Column(
        name="impl",
        ranks=POINT,
        contract=True,
        meaning="implementation: native (PyTorch's) or ours",
        report=5,
        console=5,
    ),
    Column(name="strategy", ranks=POINT, contract=True, meaning="ddp, fsdp, tp or accelerate"),
    Column(
        name="world_size",
        numeric=True,
        unit="ranks",
        ranks=POINT,
        contract=True,
        meaning="ranks the point ran on",
    ),
    Column(
        name="status",
        ranks=POINT,
        contract=True,
        meaning="ok, or error (the row keeps its error text)",
        report=6,
        console=6,
    ),
    Column(
        name="error",
        ranks=POINT,
        contract=True,
        meaning="why the point failed: the first rank's own error",
    ),
    Column(
        name="diagnosis",
        ranks=POINT,
        meaning="a failed point's one-line diagnosis from its ranks' "
        "flight records and stacks (python -m bench.hang)",
    ),
    Column(
        name="hang_dir",
        ranks=POINT,
        meaning="where the failed point's ranks left their flight records and stacks",
    ),
    Column(
        name="step_ms_median",
        unit="ms",
        ranks=TIMED,
        contract=True,
        meaning="median step time: first rank's start to last rank's end, on a common clock",
    ),
    Column(name="step_ms_min", unit="ms", ranks=TIMED, contract=True, meaning="fastest timed step"),
    Column(name="step_ms_max", unit="ms", ranks=TIMED, contract=True, meaning="slowest timed step"),
    Column(
        name="samples_per_s",
        unit="1/s",
        ranks=DERIVED,
        contract=True,
        meaning="samples of all replicas per second: every timed step's samples over their "
        "total time",
        report=11,
        console=12,
    ),
    Column(
        name="compute_ms",
        unit="ms",
        ranks=MEAN,
        contract=True,
        meaning="computation per traced step",
        report=13,
    ),
    Column(
        name="comm_ms",
        unit="ms",
        ranks=MEAN,
        contract=True,
        meaning="communication (union of collectives) per step",
        report=14,
    ),
    Column(
        name="overlap_ms",
        unit="ms",
        ranks=MEAN,
        contract=True,
        meaning="communication hidden under computation per step",
    ),
    Column(
        name="exposed_comm_ms",
        unit="ms",
        ranks=MEAN,
        contract=True,
        meaning="communication not hidden per step",
        report=16,
        console=17,
    ),
    Column(
        name="idle_ms",
        unit="ms",
        ranks=MEAN,
        contract=True,
        meaning="neither computing nor communicating per step",
        report=17,
    ),
    Column(
        name="compute_comm_ratio",
        ranks=DERIVED,
        contract=True,
        meaning="compute_ms / comm_ms",
        report=18,
    ),
    Column(
        name="overlap_pct",
        unit="%",
        ranks=DERIVED,
        contract=True,
        meaning="overlap_ms / comm_ms",
        report=15,
        console=16,
    ),
    Column(
        name="gpu_util_pct",
        unit="%",
        ranks=MEAN,
        contract=True,
        meaning="GPU busy share of the step (empty on CPU)",
        report=20,
    ),
    Column(
        name="peak_mem_mb",
        unit="MiB",
        ranks=MAX,
        contract=True,
        meaning="most memory the allocator had handed out at once in a measured step (the "
        "higher of two, on a build of the point's own), above what it had before the build, "
        "less what the release leaves and the synthetic data set (CUDA's caching allocator, "
        "or c10's CPU allocator)",
        report=24,
        console=18,
    ),
    Column(
        name="comm_bytes_per_step",
        unit="B",
        ranks=MEAN,
        contract=True,
        meaning="collective payload per step (traces)",
        report=22,
    ),
    Column(name="model", ranks=POINT, meaning="the model trained", report=1, console=1),
    Column(name="point", ranks=POINT, meaning="the point's id: its traces are in traces/<point>/"),
    *RAN_ON,
    Column(
        name="window_ms",
        unit="ms",
        ranks=MEAN,
        meaning="traced step window (the breakdown's whole)",
    ),
    Column(
        name="comm_bytes_expected",
        numeric=True,
        unit="B",
        ranks=POINT,
        meaning="analytical payload per step",
        report=23,
    ),
    Column(
        name="state_mb",
        unit="MiB",
        ranks=MAX,
        meaning="parameters, gradients and optimiser state held",
    ),
    Column(
        name="state_mb_expected",
        numeric=True,
        unit="MiB",
        ranks=POINT,
        meaning="the ZeRO accounting of state_mb",
    ),
    Column(name="param_mb", unit="MiB", ranks=MAX, meaning="parameter bytes held by a rank"),
    Column(name="grad_mb", unit="MiB", ranks=MAX, meaning="gradient bytes held by a rank"),
    Column(name="optim_mb", unit="MiB", ranks=MAX, meaning="optimiser-state bytes held by a rank"),
    Column(
        name="peak_rss_mb",
        unit="MiB",
        ranks=MAX,
        meaning="peak resident memory of a rank's process",
    ),
    Column(
        name="cpu_busy_pct",
        unit="%",
        ranks=MEAN,
        meaning="CPU traces: main thread computing or a collective in flight, share of the step",
    ),
    Column(
        name="nvml_util_pct",
        unit="%",
        ranks=MEAN,
        meaning="NVML's GPU utilisation, read between timed steps; NaN in an interleaved cohort",
    ),
    # memory around the peak: what the allocator reserved, what stayed in use once the point
    # was released, and of that the point's own (bench/runner/measure/peak_memory.py)
    Column(
        name="peak_reserved_mb",
        unit="MiB",
        ranks=MAX,
        meaning="CUDA: most memory the caching allocator held "
        "in the measured step, above the point's start (fragmentation included; NaN on CPU)",
    ),
    Column(
        name="mem_left_mb",
        unit="MiB",
        ranks=MAX,
        meaning="memory still in use once the point was released, above its start (caches it "
        "filled, or a leak): not in peak_mem_mb but for mem_kept_mb",
    ),
    Column(
        name="mem_kept_mb",
        unit="MiB",
        ranks=MAX,
        meaning="of mem_left_mb, the point's own parameters, gradients and optimiser state "
        "still alive once it was released (the implementation's leak): in peak_mem_mb",
    ),
    Column(
        name="data_ms",
        unit="ms",
        ranks=MAX,
        meaning="loading a step's batches onto the device, median, timed apart (not in step_ms)",
    ),
    Column(
        name="trace_overhead_pct",
        unit="%",
        ranks=MEAN,
        meaning="a traced step's time over an untraced one's, "
        "minus 1: what tracing adds to the breakdown's steps",
        report=27,
    ),
    Column(name="params", numeric=True, ranks=POINT, meaning="parameters of the plain model"),
    Column(
        name="grad_bytes",
        numeric=True,
        unit="B",
        ranks=POINT,
        meaning="gradient bytes of the plain model",
    ),
    Column(
        name="comm_calls_per_step",
        ranks=MEAN,
        meaning="collective calls per step",
        report=21,
        console=14,
    ),
    Column(
        name="step_ms_ci_low",
        unit="ms",
        ranks=TIMED,
        meaning="95 % interval of step_ms_median, low end (order statistics: distribution-free)",
    ),
    Column(
        name="step_ms_ci_high",
        unit="ms",
        ranks=TIMED,
        meaning="95 % interval of step_ms_median, high end",
    ),
    Column(name="steps", ranks=TIMED, meaning="timed steps, every round so far"),
    Column(
        name="stop",
        ranks=POINT,
        meaning="what ended this visit's timing: target (the interval is "
        "tight enough), decided (interleaved: every comparison with the best answered), "
        "max_steps or max_point_s (the budget)",
    ),
    Column(name="method", ranks=POINT, meaning="rounds, or paired: interleaved in a cohort"),
    Column(name="cohort", ranks=POINT, meaning="paired: its cohort (samples pair within one)"),
    Column(
        name="cycles",
        numeric=True,
        ranks=POINT,
        meaning="paired: the cycles it was timed in (a sample each; decided early, fewer)",
    ),
    Column(name="alone_ms", unit="ms", ranks=TIMED, meaning="paired: median step timed alone"),
    Column(
        name="interleave_cost_pct",
        unit="%",
        ranks=TIMED,
        meaning="paired: its median step interleaved over alone, minus 1 (caches, allocator)",
    ),
    Column(
        name="round",
        numeric=True,
        ranks=POINT,
        meaning="the round of this visit: a point has a row per round, the last ok one is "
        "its answer",
    ),
    Column(
        name="rounds",
        numeric=True,
        ranks=POINT,
        meaning="rounds pooled in this row's figures",
        report=26,
        console=11,
    ),
    Column(
        name="round_spread_pct",
        unit="%",
        ranks=TIMED,
        meaning="largest over smallest round median, minus 1: drift between rounds",
    ),
    Column(name="loss", numeric=True, ranks=POINT, meaning="loss of the last step", report=25),
    Column(
        name="checked",
        ranks=POINT,
        meaning="the point's first step against the plain model (same "
        "seed, global batch, optimiser): ok (tolerance, figures), not checked: why, or mismatch "
        "(the error says where)",
    ),
    Column(name="step_ms_p10", unit="ms", ranks=TIMED, meaning="10th percentile step time"),
    Column(name="step_ms_p90", unit="ms", ranks=TIMED, meaning="90th percentile step time"),
    Column(
        name="rank_skew_ms",
        unit="ms",
        ranks=TIMED,
        meaning="median over steps of the last rank's end minus the first rank's end "
        "(common clock)",
    ),
    Column(
        name="scaling",
        ranks=POINT,
        meaning="world-size sweeps: weak or strong",
        report=4,
        console=4,
    ),
    Column(
        name="global_batch", numeric=True, ranks=POINT, meaning="strong scaling: the global batch"
    ),
    Column(
        name="batch_per_replica",
        numeric=True,
        ranks=POINT,
        meaning="samples per replica and micro-batch",
    ),
    Column(
        name="grad_accum", numeric=True, ranks=POINT, meaning="micro-batches per optimiser step"
    ),
    Column(
        name="comm_bytes_per_sample",
        unit="B",
        ranks=DERIVED,
        meaning="comm_bytes_per_step per sample",
    ),
    Column(name="trace_dir", ranks=POINT, meaning="where the point's traces were written"),
    Column(
        name="value2",
        ranks=POINT,
        meaning="a grid's second value (empty outside grids)",
        report=3,
        console=3,
    ),
    Column(
        name="flops_per_step",
        numeric=True,
        unit="FLOP",
        ranks=POINT,
        meaning="model FLOPs of one optimiser step per rank: "
        "forward and backward of every replica's micro-batches over the step's ranks (no "
        "recomputation, no optimiser)",
    ),
    Column(
        name="activation_checkpointing",
        ranks=POINT,
        meaning="the point's activation checkpointing: off, full, selective:op or "
        "selective:layer=N (docs/sweeps.md)",
        report=32,
        console=23,
        quiet="off",
    ),
    Column(
        name="recompute_flops_per_step",
        numeric=True,
        unit="FLOP",
        ranks=POINT,
        meaning="FLOPs per step per rank that activation checkpointing recomputes in backward: "
        "the plain model counted with the point's mode, less without (0 with it off)",
        report=33,
        console=24,
        quiet=0.0,
    ),
    Column(
        name="compile",
        ranks=POINT,
        meaning="the point's torch.compile: off, blocks or model (docs/sweeps.md)",
        report=30,
        console=25,
        quiet="off",
    ),
    Column(
        name="compile_seconds",
        unit="s",
        ranks=MAX,
        meaning="compilation time, never in a timed step: the first warm-up step's time less "
        "the last warm-up step's, the slowest rank's (empty: not compiled, or one warm-up step)",
        report=31,
        console=22,
    ),
    Column(
        name="matmul_precision",
        ranks=POINT,
        meaning="the precision the point's matmuls run in: fp32, bf16, fp16 (autocast or the "
        "strategy's mixed precision) or fp8 (the blocks' Linears in float8, docs/sweeps.md)",
        report=28,
        console=20,
    ),
    Column(
        name="untimed",
        ranks=POINT,
        meaning="why the step times do not time the configuration (fp8 emulated on a device "
        "without float8 matmuls: correctness and memory only); empty: they do",
        report=29,
        console=21,
    ),
    Column(
        name="flops_source",
        ranks=POINT,
        meaning="counted (FlopCounterMode on the plain model), "
        "workload (its flops_per_sample; with the count's ratio where 3x apart), or uncounted: "
        "why",
    ),
    Column(
        name="tflops_per_s",
        unit="TFLOP/s",
        ranks=DERIVED,
        meaning="flops_per_step over the timed steps' mean time",
    ),
    Column(
        name="peak_tflops",
        unit="TFLOP/s",
        ranks=MEAN,
        meaning="the peak mfu_pct is against: the GPU's "
        "datasheet dense peak at the point's precision where known, else peak_tflops_measured",
    ),
    Column(
        name="peak_source",
        ranks=POINT,
        meaning="which peak: datasheet (GPU, precision, datasheet) or "
        "measured, an fp32 point's shares of FLOPs in TF32; 'impossible peak' first where the "
        "model computed faster than it",
    ),
    Column(
        name="peak_tflops_measured",
        unit="TFLOP/s",
        ranks=MEAN,
        meaning="this machine's best rate over a few "
        "square matmul sizes in the point's precision, timed by every rank at once",
    ),
    Column(
        name="mfu_pct",
        unit="%",
        ranks=DERIVED,
        meaning="model FLOPs utilisation: tflops_per_s / peak_tflops "
        "(PaLM, appendix B); empty where it would exceed 100 % (the peak cannot be right)",
        report=12,
        console=13,
    ),
    # the MFU waterfall of the traced steps (bench/analysis/waterfall.py, docs/analysis.md
    # "The MFU waterfall"): its parts add up to window_ms; empty where not priced, never zero
    *WATERFALL,
    *PIPELINE,
    # read, never written: figures the reading side computes from results.csv (the report,
    # the console's closing table), listed here so that both name them alike
    Column(
        name="efficiency_pct",
        unit="%",
        ranks=READER,
        meaning="world-size sweeps: speedup / ideal",
        report=7,
        console=19,
    ),
    Column(
        name="compute_share_pct",
        unit="%",
        ranks=READER,
        meaning="compute_ms / window_ms",
        report=19,
    ),
    Column(
        name="typical_ms",
        unit="ms",
        ranks=READER,
        meaning="geometric mean of the rounds' medians",
        report=8,
        console=8,
    ),
    Column(
        name="typical_ms_low",
        unit="ms",
        ranks=READER,
        meaning="its 95 % interval, low end: the rounds' drift "
        "included (or, in one round, the noise floor)",
        report=9,
        console=9,
    ),
    Column(
        name="typical_ms_high",
        unit="ms",
        ranks=READER,
        meaning="its 95 % interval, high end",
        report=10,
        console=10,
    ),
    Column(
        name="best",
        ranks=READER,
        meaning="the console's mark: * the best value per model and implementation, = tied "
        "with it at 95 % (the report shades the rows instead)",
        console=7,
    ),
    Column(
        name="comm_MB",
        unit="MB",
        ranks=READER,
        meaning="comm_bytes_per_step in MB (1e6 bytes), as the console prints it",
        console=15,
    ),
)
