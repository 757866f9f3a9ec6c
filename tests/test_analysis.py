"""The analyser on traces whose answer is known by construction."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from bench.analysis import breakdown as analysis
from bench.analysis.collective_calls import collective_summary, wait_split
from parallel_kernels.facts import op_name

pytestmark = pytest.mark.unit


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
    "span",
    ["FSDP::all_gather (net.2)", "FullyShardedDataParallel._pre_backward_hook", "my_own_region"],
)
def test_spans_that_block_on_gloo_are_waiting_whatever_their_name(tmp_path, span):
    """A span that returns only when gloo's collective is done (FSDP's, or any annotation a
    program adds) waits from its last op until the collective completes: that stretch is not
    computation, whatever the span is called (an unknown name counted as overlap that was not
    there). Its own time before the collective was even in flight, [0, 2), is not a wait."""
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
    assert row["compute_us"] == 2 + 5 + 40
    assert row["overlap_us"] == 0 and row["exposed_comm_us"] == 40


def test_an_op_that_calls_a_collective_waits_in_its_own_time(tmp_path):
    """``dist.all_reduce`` inside an autograd Function: the node's span issues the collective
    (``c10d::allreduce_``) and then sits in its own time until gloo completes it, a name no
    list knows. That time is waiting, not computation."""
    events = [
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("autograd::engine::evaluate_function: SyncGradBackward", 0, 60),
        _x("SyncGradBackward", 1, 58),
        _x("aten::clone", 2, 8),
        _x("c10d::allreduce_", 10, 4),
        _x("gloo:all_reduce", 12, 44, tid=2, args={"Input Dims": [[10]], "Input type": ["float"]}),
        _x("aten::mm", 60, 30),
    ]
    path = tmp_path / "rank0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    row = analysis.breakdown(analysis.load_trace(path)).iloc[0]
    # [0, 10): the node's own time and clone; [14, 59) blocked; [59, 60) the engine's own time
    assert row["compute_us"] == 10 + 1 + 30
    assert row["overlap_us"] == 0 and row["exposed_comm_us"] == 44


def test_an_op_computing_while_a_collective_completes_is_computation(tmp_path):
    """An operator's own time is its kernel: DDP's bucket copy (``aten::mul`` between its
    sub-ops) during which an earlier bucket's all-reduce completes was overlapped, not a wait
    (seen in native DDP's traces)."""
    events = [
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("c10d::allreduce_", 0, 5),
        _x("gloo:all_reduce", 5, 45, tid=2, args={"Input Dims": [[10]], "Input type": ["float"]}),
        _x("aten::mul", 20, 40),
        _x("aten::to", 21, 2),
        _x("aten::mm", 70, 20),
    ]
    path = tmp_path / "rank0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    row = analysis.breakdown(analysis.load_trace(path)).iloc[0]
    assert row["compute_us"] == 40 + 20
    assert row["overlap_us"] == 30  # [20, 50)


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
        _x(
            "ampere_sgemm_128x64_nn",
            100,
            40,
            tid=20,
            cat="kernel",
            args={"correlation": 1, "stream": 7},
        ),
        # the kernel carries no size: it comes from the record_param_comms that launched it
        _x(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            120,
            50,
            tid=21,
            cat="kernel",
            args={"correlation": 2, "stream": 20},
        ),
        _x(
            "Memcpy DtoD (Device -> Device)",
            180,
            10,
            tid=20,
            cat="gpu_memcpy",
            args={"correlation": 3, "stream": 7},
        ),
        _x(
            "ampere_sgemm_128x64_nn",
            200,
            30,
            tid=20,
            cat="kernel",
            args={"correlation": 4, "stream": 7},
        ),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    trace = analysis.load_trace(path)
    assert trace.is_gpu
    steps = analysis.breakdown(trace)
    assert steps["step"].tolist() == [1, 2]
    # Step 2's device window begins when its work can (the device finishes step 1's at 190)
    # and ends with its kernel at 230.
    assert steps["window_us"].iloc[1] == 40 and steps["compute_us"].iloc[1] == 30
    assert steps["idle_us"].iloc[1] == 10
    row = steps.iloc[0]
    # Step 1's begins with the host's step (nothing earlier on the device) at 0 and ends at 190:
    # the 100 us the device waited for step 1's first kernel are step 1's idle time.
    assert row["window_us"] == 190
    assert row["compute_us"] == 40 and row["comm_us"] == 50 and row["memory_us"] == 10
    assert row["overlap_us"] == 20 and row["idle_us"] == 190 - 70 - 10
    assert row["gpu_util_pct"] == pytest.approx(100 * 80 / 190)
    assert row["comm_bytes"] == 1024


def test_steps_are_the_host_s_not_kineto_s_device_side_copies(tmp_path):
    """Recent Kineto also writes each ``ProfilerStep#N`` as a ``gpu_user_annotation`` (first to
    last kernel, no stream): a step's window is the host's span whatever the file's order."""
    events = [
        _x("ProfilerStep#1", 100, 30, tid=7, cat="gpu_user_annotation"),
        _x("ProfilerStep#2", 180, 20, tid=7, cat="gpu_user_annotation"),
        _x("ProfilerStep#1", 0, 50, cat="user_annotation"),
        _x("ProfilerStep#2", 50, 50, cat="user_annotation"),
        _x("cudaLaunchKernel", 5, 2, cat="cuda_runtime", args={"correlation": 1}),
        _x("cudaLaunchKernel", 60, 2, cat="cuda_runtime", args={"correlation": 2}),
        _x(
            "ampere_sgemm_128x64_nn",
            100,
            30,
            tid=20,
            cat="kernel",
            args={"correlation": 1, "stream": 7},
        ),
        _x(
            "ampere_sgemm_128x64_nn",
            180,
            20,
            tid=20,
            cat="kernel",
            args={"correlation": 2, "stream": 7},
        ),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = analysis.load_trace(path)
    windows = analysis.step_windows(trace.events)
    assert windows["start"].tolist() == [0, 50] and windows["end"].tolist() == [50, 100]
    steps = analysis.breakdown(trace)
    assert steps["window_us"].tolist() == [130, 70]  # [0, 130) and [130, 200)
    assert analysis.hta_summary(trace)["steps"] == 1  # HTA's filter leaves out the host's last


@pytest.mark.parametrize("content", [b"", b'{"traceEvents": [', b"not json", b"[1, 2]"])
def test_unreadable_traces_name_the_file(tmp_path, content):
    path = tmp_path / "broken.pt.trace.json"
    path.write_bytes(content)
    with pytest.raises(analysis.TraceError, match=r"broken\.pt\.trace\.json"):
        analysis.load_trace(path)


def test_busbw_only_where_the_collective_s_factor_is_known():
    """nccl-tests' factors (n = 4): all-reduce 2(n-1)/n, broadcast 1. NCCL's SendRecv kernels
    run all-to-all, gather, scatter or point-to-point alike: no factor can be read from the
    name, so busbw is NaN with the collective named, never algbw under a guessed factor of 1."""
    names = [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
        "gloo:gather",
    ]
    calls = pd.DataFrame(
        {
            "rank": 0,
            "step": 1,
            "collective": [op_name(n) for n in names],
            "name": names,
            "ts": [0.0, 10.0, 20.0, 30.0],
            "dur": 1000.0,
            "nbytes": 1e6,
            "seq": 0,
        }
    )
    table = collective_summary(wait_split(calls), world_size=4).set_index("collective")
    assert table["algbw_GBps"].tolist() == pytest.approx([1.0] * 4)  # 1 MB in 1 ms
    assert table.loc["all_reduce", "busbw_GBps"] == pytest.approx(1.5)
    assert table.loc["broadcast", "busbw_GBps"] == pytest.approx(1.0)
    for unknown in ("send_recv", "gather"):
        assert np.isnan(table.loc[unknown, "busbw_factor"])
        assert np.isnan(table.loc[unknown, "busbw_GBps"])
