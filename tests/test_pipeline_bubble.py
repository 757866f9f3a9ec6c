"""A pipeline stage's bubble and point-to-point bytes, read from traces whose answer is known by
construction (bench/analysis/pipeline_bubble.py); the spans a pipeline records and the
micro-batch phases the step timeline draws of them; the point-to-point count for any placement
of the stages; a per-rank column listing every rank's figure."""

import json

import numpy as np
import pytest

from bench.analysis import breakdown as analysis
from bench.analysis.pipeline_bubble import pipeline_bubble, stage_summary
from bench.analysis.timeline import step_timeline
from bench.analysis.trace_folder import analyse, load_trace_dir
from bench.runner.measure.pipeline_columns import pipelines
from bench.runner.train.figures import aggregate
from parallel_kernels import facts, pipeline
from parallel_kernels.pipeline_theory import Pipeline, p2p_bytes_by_rank, p2p_bytes_per_step
from tests.test_harness import make_point

pytestmark = pytest.mark.unit

SEND = {"Input Dims": [[4, 8]], "Input type": ["float"]}  # 128 bytes


def _x(name, ts, dur, tid=1, cat="cpu_op", args=None):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}
    if args:
        e["args"] = args
    return e


def _note(name, ts, dur, **kw):
    return _x(name, ts, dur, cat="user_annotation", **kw)


def cpu_stage(rank: int = 0) -> dict:
    """One step [0, 200) of a first stage: its schedule span [10, 190); micro-batch 0's
    forward computes [12, 48), sends 128 bytes (the call [48, 50), gloo's span [49, 120)); its
    backward calls a receive [52, 54) and blocks until gloo's receive ends at 130, then
    computes to the span's end. Computation: [10, 48) + [50, 52) + [130, 190) = 100 of 180."""
    events = [
        _note("ProfilerStep#4", 0, 200),
        _note("Optimizer.zero_grad#AdamW.zero_grad", 2, 5),
        _note(facts.PIPELINE_SCHEDULE_SPAN, 10, 180),
        _note(facts.pipeline_micro_span("F", 0), 10, 40),
        _x("aten::mm", 12, 36),
        _x("c10d::send", 48, 2),
        _note("gloo:send", 49, 71, args=SEND),
        _note(facts.pipeline_micro_span("B", 0), 50, 140),
        _x("c10d::recv_", 52, 2),
        _note("gloo:recv", 53, 77, args=SEND),
        _x("aten::mm", 130, 55),
        _note("gloo:all_reduce", 192, 5, tid=2, args=SEND),  # the tied weights: outside
    ]
    return {
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
        "traceEvents": events,
    }


def _launch(corr: int, at: float, kernel: str, start: float, dur: float, stream: int = 7):
    return [
        _x("cudaLaunchKernel", at, 1, cat="cuda_runtime", args={"correlation": corr}),
        _x(kernel, start, dur, tid=7, cat="kernel", args={"correlation": corr, "stream": stream}),
    ]


def gpu_stage() -> dict:
    """A GPU stage: the schedule span [100, 900) on the host; the work launched before it ends
    at 180, its own kernels compute [200, 300) and [600, 700) around a send [400, 600). The
    span's device window: [180, 700), 200 of 520 computing."""
    events = [
        _note("ProfilerStep#1", 0, 1000),
        *_launch(1, 50, "sm90_gemm_kernel", 60, 120),
        _note(facts.PIPELINE_SCHEDULE_SPAN, 100, 800),
        *_launch(2, 150, "sm90_gemm_kernel", 200, 100),
        _x("nccl:send", 390, 20, args={"In msg nelems": 64, "dtype": "Float"}),
        *_launch(3, 400, "ncclDevKernel_SendRecv", 400, 200, stream=8),
        *_launch(4, 500, "sm90_gemm_kernel", 600, 100),
    ]
    return {
        "distributedInfo": {"rank": 1, "world_size": 2, "backend": "nccl"},
        "traceEvents": events,
    }


def _load(tmp_path, doc: dict, name: str = "rank0.1.pt.trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return analysis.load_trace(path)


def test_a_cpu_stage_bubble_is_its_span_less_its_computation(tmp_path):
    steps = pipeline_bubble(_load(tmp_path, cpu_stage()))
    row = steps.iloc[0]
    assert (row["rank"], row["step"], row["span_us"]) == (0, 4, 180)
    assert row["compute_us"] == pytest.approx(100)  # the blocked receive and the calls are not
    assert row["bubble_pct"] == pytest.approx(100 * 80 / 180)
    assert (row["p2p_sends"], row["p2p_bytes"]) == (1, 128)  # the all-reduce is no send
    assert stage_summary(steps) == pytest.approx(
        {"bubble_pct": 100 * 80 / 180, "p2p_bytes_per_step": 128}
    )


def test_a_gpu_stage_bubble_is_read_in_its_span_window_on_the_device(tmp_path):
    row = pipeline_bubble(_load(tmp_path, gpu_stage())).iloc[0]
    assert (row["rank"], row["span_us"], row["compute_us"]) == (1, 520, 200)
    assert row["bubble_pct"] == pytest.approx(100 * 320 / 520)
    assert (row["p2p_sends"], row["p2p_bytes"]) == (1, 256)


def test_a_trace_that_does_not_pipeline_has_no_bubble_and_no_pipeline_table(tmp_path):
    doc = cpu_stage()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("pipeline")]
    assert pipeline_bubble(_load(tmp_path, doc)).empty
    assert stage_summary(pipeline_bubble(_load(tmp_path, doc))) == {}
    assert "pipeline" not in analyse(load_trace_dir(tmp_path))
    _load(tmp_path, cpu_stage(rank=1), "rank1.1.pt.trace.json")
    tables = analyse(load_trace_dir(tmp_path))
    assert list(tables["pipeline"]["rank"]) == [1]  # the folder's table: the stages that have one


def test_the_timeline_draws_a_stage_micro_batches_as_its_phases(tmp_path):
    tl = step_timeline([_load(tmp_path, cpu_stage())])
    phases = tl[tl["lane"] == "phase"]
    assert list(phases["label"]) == ["F0", "B0"]  # not forward and backward
    assert list(phases["end_ms"] - phases["start_ms"]) == pytest.approx([0.04, 0.14])


def test_span_names_are_one_fact_of_every_side():
    assert pipeline.SCHEDULE_SPAN == facts.PIPELINE_SCHEDULE_SPAN  # the writer's is the reader's
    labels = {
        facts.pipeline_micro_span("F", 3): "F3",
        facts.pipeline_micro_span("B", 12): "B12",
        "Forward 3": "F3",  # torch's GPipe
        "Backward 0": "B0",
        "PP:1F3": "1F3",  # torch's multi-stage schedules
        "PP:0W2": "0W2",
        "pipeline schedule": None,
        "Forward": None,
        "PP:1UNSHARD": None,
    }
    assert {n: facts.pipeline_micro_label(n) for n in labels} == labels


def test_point_to_point_bytes_for_any_placement_of_the_stages():
    # one stage a rank: the count per stage
    for p in (2, 3, 4):
        pipe = Pipeline(p, 4)
        by_rank = p2p_bytes_by_rank(4, tuple(range(p)), (10,) * (p - 1))
        assert by_rank == {s: p2p_bytes_per_step(pipe, s, 10, 10) for s in range(p)}
    # interleaved, two stages a rank (stage s on rank s mod 2): every boundary crosses ranks
    assert p2p_bytes_by_rank(2, (0, 1, 0, 1), (1, 2, 3)) == {0: 2 * (1 + 2 + 3), 1: 2 * (1 + 2 + 3)}
    # a V-shape: stages 1 and 2 on one rank hand over without a send
    assert p2p_bytes_by_rank(1, (0, 1, 1, 0), (5, 7, 9)) == {0: 5 + 9, 1: 5 + 9}
    with pytest.raises(ValueError, match="boundaries"):
        p2p_bytes_by_rank(2, (0, 1), (1, 2))


def test_a_per_rank_column_lists_every_rank_in_rank_order():
    ranks = [
        {"pp_bubble_pct": 10.0, "pp_bubble_by_rank_pct": 10.0, "pp_peak_mem_by_rank_mb": 40.125},
        {"pp_bubble_pct": 30.0, "pp_bubble_by_rank_pct": 30.0, "pp_peak_mem_by_rank_mb": np.nan},
    ]
    out = aggregate(ranks)
    assert out["pp_bubble_pct"] == 30.0  # the most idle stage
    assert out["pp_bubble_by_rank_pct"] == "10;30"
    assert out["pp_peak_mem_by_rank_mb"] == "40.12;"  # a rank without the figure: empty


def test_only_a_point_whose_implementation_runs_a_schedule_has_pipeline_columns():
    assert pipelines(make_point("pp_microbatches", "transformer", 2, "reference", "pp"))
    assert pipelines(make_point("pp_microbatches", "transformer", 2, "native", "pp"))
    assert not pipelines(make_point("bucket_cap_mb", "transformer", 25, "native", "ddp"))
