"""The facts every side shares live once (parallel_kernels/facts.py): the registry, the
analysis and the replay read them, and reading them needs no torch."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.analysis.collective_calls import busbw_gbps
from bench.replay.play import registry_count
from parallel_kernels import facts
from parallel_kernels.collectives import COLLECTIVES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_the_registry_and_the_analysis_use_the_one_bus_factor_table():
    for name, coll in COLLECTIVES.items():
        assert coll.busbw_factor is facts.BUS_FACTORS[name], name
    # nccl-tests' all-reduce at 4 ranks: busbw = algbw x 2(n-1)/n = 1.5 x 1 GB/s
    assert busbw_gbps("all_reduce", 1e9, 4, 1e6) == pytest.approx(1.5)


@pytest.mark.unit
def test_precision_names_map_to_their_dtypes_and_counts_follow_the_registry():
    assert [facts.torch_dtype(p) for p in ("fp32", "tf32", "bf16", "fp16", "none")] == [
        torch.float32,
        torch.float32,
        torch.bfloat16,
        torch.float16,
        None,
    ]
    # a trace gives a rank's input; the registry's count is all-gather's output
    assert registry_count("all_gather", 10, 4) == 40 and registry_count("all_reduce", 10, 4) == 10
    assert registry_count("send", 7, 2) == 7  # not in the registry: as given


@pytest.mark.e2e
def test_the_facts_and_the_analysis_import_without_torch():
    code = (
        "import sys; import parallel_kernels.facts, bench.analysis.collective_calls; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.unit
def test_a_traces_bytes_scale_to_nccl_tests_size_as_the_registry_counts():
    for name, coll in COLLECTIVES.items():
        for n in (2, 4, 8):
            count = 64 * n
            assert facts.size_per_input(name, n) == count // coll.in_count(count, n), (name, n)


@pytest.mark.unit
@pytest.mark.parametrize(
    "spelling,name",
    [
        ("gloo:all_reduce", "all_reduce"),  # ProcessGroupGloo's span
        ("gloo:all_gather", "all_gather"),
        ("nccl:_all_gather_base", "all_gather"),  # ProcessGroupNCCL's
        ("nccl:all_to_all", "all_to_all"),
        ("c10d::allreduce_", "all_reduce"),  # c10d's op
        ("allgather_into_tensor_coalesced", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("alltoall_base", "all_to_all"),
        ("recvAnysource", "recv"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long)", "all_reduce"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)", "send_recv"),
        ("gloo:something_new", "something_new"),  # unknown: its name, without the prefix
        ("wait", "wait"),
    ],
)
def test_every_spelling_of_an_op_has_one_name(spelling, name):
    assert facts.op_name(spelling) == name
    assert facts.op_name(name) == name  # a name is its own spelling


@pytest.mark.unit
def test_the_registrys_names_are_their_own_spellings():
    for name in (*COLLECTIVES, *facts.BUS_FACTORS, *facts.POINT_TO_POINT, *facts.S_PER_INPUT):
        assert facts.op_name(name) == name
