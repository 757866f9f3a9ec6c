"""The analyser on traces whose answer is known by construction."""

import gzip
import json

import numpy as np
import pytest

from bench.analysis import breakdown as analysis


def _x(name, ts, dur, tid=1, cat="cpu_op", args=None):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}
    if args:
        e["args"] = args
    return e


def cpu_trace(rank=0):
    """One step [0, 100): main thread computes [0, 40) and [42, 60), issues an all-reduce in
    [40, 42) and waits in [60, 90); a gloo thread moves 1000 floats in [41, 80)."""
    events = [
        _x("ProfilerStep#3", 0, 100, cat="user_annotation"),
        _x("aten::addmm", 0, 40),
        _x("c10d::allreduce_", 40, 2),
        _x("autograd::engine::evaluate_function: AddmmBackward0", 42, 18),
        _x("ReferenceDDP.wait_buckets", 60, 30, cat="user_annotation"),
        _x(
            "gloo:all_reduce", 41, 39, tid=2, args={"Input Dims": [[1000]], "Input type": ["float"]}
        ),
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 1,
            "pid": 7,
            "tid": 1,
            "args": {"Total Allocated": 500, "Bytes": 500},
        },
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 2,
            "pid": 7,
            "tid": 1,
            "args": {"Total Allocated": 1500, "Bytes": 1000},
        },
        {
            "ph": "i",
            "name": "[memory]",
            "ts": 3,
            "pid": 7,
            "tid": 1,
            "args": {"Total Allocated": 700, "Bytes": -800},
        },
    ]
    return {
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
        "traceEvents": events,
    }


def test_cpu_breakdown_by_construction(tmp_path):
    path = tmp_path / "rank0.1.pt.trace.json"
    path.write_text(json.dumps(cpu_trace()))
    trace = analysis.load_trace(path)
    assert not trace.is_gpu
    row = analysis.breakdown(trace).iloc[0]
    assert row["step"] == 3 and row["window_us"] == 100
    assert row["compute_us"] == 58  # 40 + 18; issuing and waiting are not computation
    assert row["comm_us"] == 39
    assert row["overlap_us"] == 18  # [42, 60)
    assert row["exposed_comm_us"] == 21
    assert row["idle_us"] == 100 - 40 - 39
    assert row["overlap_pct"] == pytest.approx(100 * 18 / 39)
    assert row["comm_calls"] == 1 and row["comm_bytes"] == 4000
    assert np.isnan(row["gpu_util_pct"])  # not a GPU trace: empty, never zero
    assert analysis.memory_peak_delta(trace) == 1500  # counter was 0 before the first event


@pytest.mark.parametrize(
    "span", ["FSDP::all_gather (net.2)", "FullyShardedDataParallel._pre_backward_hook"]
)
def test_fsdp_spans_that_block_on_gloo_are_waiting(tmp_path, span):
    """FSDP's spans return only when gloo's collective is done and no op inside says "wait":
    their time outside the ops they contain is waiting, not computation (seen in FSDP2 and FSDP1
    traces on CPU, where this counted as overlap that was not there)."""
    events = [
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x(span, 0, 50, cat="user_annotation"),
        _x("aten::copy_", 2, 5),  # real work inside the span
        _x("gloo:all_gather", 8, 40, tid=2, args={"Input Dims": [[10]], "Input type": ["float"]}),
        _x("aten::addmm", 50, 40),
    ]
    path = tmp_path / "rank0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    row = analysis.breakdown(analysis.load_trace(path)).iloc[0]
    assert row["compute_us"] == 5 + 40
    assert row["overlap_us"] == 0 and row["exposed_comm_us"] == 40


def test_gpu_kernels_are_classified_like_hta(tmp_path):
    events = [
        _x("ProfilerStep#1", 0, 50, cat="user_annotation"),
        _x("ProfilerStep#2", 50, 50, cat="user_annotation"),
        # launched during step 1 (correlation 1-3), running on the GPU well after it
        _x("cudaLaunchKernel", 5, 2, cat="cuda_runtime", args={"correlation": 1}),
        _x("record_param_comms", 9, 5, args={"In msg nelems": 256, "dtype": "Float"}),
        _x("cudaLaunchKernel", 10, 2, cat="cuda_runtime", args={"correlation": 2}),
        _x("cudaMemcpyAsync", 20, 2, cat="cuda_runtime", args={"correlation": 3}),
        _x("cudaLaunchKernel", 60, 2, cat="cuda_runtime", args={"correlation": 4}),
        _x("ampere_sgemm_128x64_nn", 100, 40, tid=20, cat="kernel",
           args={"correlation": 1, "stream": 7}),
        # the kernel carries no size: it comes from the record_param_comms that launched it
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 120, 50, tid=21, cat="kernel",
           args={"correlation": 2, "stream": 20}),
        _x("Memcpy DtoD (Device -> Device)", 180, 10, tid=20, cat="gpu_memcpy",
           args={"correlation": 3, "stream": 7}),
        _x("ampere_sgemm_128x64_nn", 200, 30, tid=20, cat="kernel",
           args={"correlation": 4, "stream": 7}),
    ]  # fmt: skip
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    trace = analysis.load_trace(path)
    assert trace.is_gpu
    steps = analysis.breakdown(trace)
    assert steps["step"].tolist() == [1, 2]
    assert steps["window_us"].iloc[1] == 30 and steps["compute_us"].iloc[1] == 30
    row = steps.iloc[0]
    assert row["window_us"] == 90  # first kernel start to last kernel end
    assert row["compute_us"] == 40 and row["comm_us"] == 50 and row["memory_us"] == 10
    assert row["overlap_us"] == 20 and row["idle_us"] == 90 - 70 - 10
    assert row["gpu_util_pct"] == pytest.approx(100 * 80 / 90)
    assert row["comm_bytes"] == 1024


@pytest.mark.parametrize("content", [b"", b'{"traceEvents": [', b"not json", b"[1, 2]"])
def test_unreadable_traces_name_the_file(tmp_path, content):
    path = tmp_path / "broken.pt.trace.json"
    path.write_bytes(content)
    with pytest.raises(analysis.TraceError, match=r"broken\.pt\.trace\.json"):
        analysis.load_trace(path)
