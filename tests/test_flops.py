"""FLOPs and MFU: the counter against the analytical count of a GPT-style model, the step's
FLOPs per rank against a single-process count, the datasheet peaks, the measured peak, and the
columns a real 2-rank harness run writes."""

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.runfolder import peaks
from bench.runner import flops
from parallel_kernels.models import Transformer, _lm_loss, _token_data, workload
from parallel_kernels.workload import Workload
from tests.test_harness import FAST, make_point, run_points

CPU = torch.device("cpu")


def matmul_params(model: nn.Module) -> int:
    """Kaplan et al. 2020's non-embedding parameters N (table 1) plus the de-embedding (the LM
    head, tied to the token embedding in GPT-2): the weights of every matmul, biases and norms
    aside. Each module once, so a tied head counts as the matmul it is."""
    n = 0
    for m in model.modules():
        w = m._parameters.get("weight")
        if w is not None and w.dim() == 2 and not isinstance(m, nn.Embedding):
            n += w.numel()
    return n


def analytical_flops(model: nn.Module, layers: int, dim: int, seq: int, tokens: int) -> float:
    """Forward and backward FLOPs of a decoder on ``tokens`` tokens of ``seq``-long sequences:
    6 N + 12 L H Q T per token (PaLM, Chowdhery et al. 2022, appendix B; H Q = d_model): 6 N for
    the weight matmuls (2 forward, 4 backward) and 12 L d T for attention's two matmuls over the
    sequence, causal mask not halved."""
    return (6 * matmul_params(model) + 12 * layers * dim * seq) * tokens


def _wl(name: str, build, seq: int, vocab: int) -> Workload:
    return Workload(name=name, build=build, batch=lambda n, s: _token_data(n, s, vocab, seq),
                    loss=_lm_loss, tokens_per_sample=seq)  # fmt: skip


@pytest.mark.parametrize(
    "wl, layers, dim",
    [
        (workload("transformer"), 4, 256),  # the built-in model, as sweeps train it
        # a long sequence on a narrow model: attention is 38 % of the FLOPs here
        (_wl("long", lambda: Transformer(vocab=128, dim=64, heads=2, layers=2, seq=256), 256,
             128), 2, 64),
    ],
)  # fmt: skip
def test_counter_matches_the_palm_count_of_a_decoder(wl, layers, dim):
    batch = 4
    counted = flops.count_flops(wl, batch)
    seq = wl.tokens_per_sample
    expected = analytical_flops(wl.build(), layers, dim, seq, batch * seq)
    assert counted == pytest.approx(expected, rel=0.10), (counted, expected)
    # on fake tensors, as the harness counts: the same figure as on real ones
    assert flops.count_flops(wl, batch, CPU) == pytest.approx(counted, rel=1e-9)


@pytest.mark.ci_needs("transformers")
@pytest.mark.parametrize("name", ["gpt2:tiny", "llama:tiny"])
def test_counter_matches_the_palm_count_of_zoo_decoders(name):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install "
                        "-e '.[models]'): the zoo's models need it")  # fmt: skip
    from parallel_kernels.zoo import ZOO

    if name.split(":")[0] not in ZOO:
        pytest.skip(f"the zoo (parallel_kernels/zoo/) has no {name} yet")
    wl = workload(name)
    batch = 2
    inputs, _ = wl.batch(batch, 0)
    ids = inputs["input_ids"] if isinstance(inputs, dict) else inputs
    model = wl.build()
    cfg = model.config  # Hugging Face's names, the same for both (GPT-2's n_layer, n_embd)
    counted = flops.count_flops(wl, batch)
    expected = analytical_flops(model, cfg.num_hidden_layers, cfg.hidden_size, ids.shape[1],
                                ids.numel())  # fmt: skip
    assert counted == pytest.approx(expected, rel=0.10), (counted, expected)


def test_the_workloads_own_figure_wins():
    wl = _wl("stated", lambda: Transformer(layers=1), 64, 512)
    wl = dataclasses.replace(wl, flops_per_sample=1.5e9)
    assert flops.micro_batch_flops(wl, 8, CPU) == (1.2e10, "workload")


class ReadsItsData(nn.Module):
    """A model that looks at its data (``.item()``): it cannot run on fake tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2.0 if x.abs().sum().item() > 0 else 1.0)


def test_a_model_that_reads_its_data_is_counted_on_the_device():
    wl = Workload(name="reads", build=ReadsItsData,
                  batch=lambda n, s: (torch.randn(n, 16), torch.randint(0, 8, (n,))),
                  loss=F.cross_entropy)  # fmt: skip
    with pytest.raises(Exception, match="_local_scalar_dense"):  # .item() on a fake tensor
        flops.count_flops(wl, 4)
    # forward 2 x 4 x 16 x 8, backward the weight's gradient only (the input needs none)
    assert flops.micro_batch_flops(wl, 4, CPU) == (4 * 4 * 16 * 8, "counted")


class Uncountable(ReadsItsData):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of memory\nsecond line")


def test_a_model_that_cannot_be_counted_says_why():
    wl = Workload(name="oom", build=Uncountable, batch=lambda n, s: (torch.randn(n, 16), None))
    flops_, source = flops.micro_batch_flops(wl, 4, CPU)
    assert math.isnan(flops_) and source == "uncounted: RuntimeError: out of memory"


def test_step_flops_scale_with_batch_accumulation_and_tp_degree():
    micro = flops.count_flops(workload("transformer"), 4)
    base = make_point("grad_accum", "transformer", 1, "native", "ddp", batch_size=4)
    # every rank of DDP computes its own replica's micro-batches
    assert flops.step_flops(base, CPU) == (micro, "counted")
    bigger = make_point("grad_accum", "transformer", 1, "native", "ddp", batch_size=8)
    assert flops.step_flops(bigger, CPU)[0] == pytest.approx(2 * micro, rel=1e-12)
    accum = make_point("grad_accum", "transformer", 3, "native", "ddp", batch_size=4,
                       knobs={"grad_accum": 3})  # fmt: skip
    assert flops.step_flops(accum, CPU)[0] == pytest.approx(3 * micro, rel=1e-12)
    # two TP ranks share one replica's FLOPs
    tp = make_point("mesh", "transformer", "tp2", "native", "tp", batch_size=4,
                    knobs={"tp_degree": 2})  # fmt: skip
    assert tp.dp_size == 1 and flops.step_flops(tp, CPU)[0] == pytest.approx(micro / 2)


@pytest.mark.parametrize(
    "name, precision, tflops, gpu",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5, "H100 SXM5"),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0, "H100 SXM5"),
        ("NVIDIA H100 PCIe", "tf32", 378.0, "H100 PCIe"),
        ("NVIDIA H200", "bf16", 989.5, "H200 SXM"),
        ("NVIDIA H200 NVL", "fp16", 835.5, "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0, "A100"),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5, "A100"),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0, "V100 SXM2"),
        ("Tesla V100-SXM2-16GB", "tf32", 15.7, "V100 SXM2"),  # no TF32 there: plain fp32
        ("Tesla V100S-PCIE-32GB", "fp32", 16.4, "V100S PCIe"),
        ("NVIDIA L4", "bf16", 121.0, "L4"),
        ("NVIDIA L40S", "bf16", 362.05, "L40S"),
        ("NVIDIA A10", "bf16", 125.0, "A10"),
        ("Tesla T4", "fp16", 65.0, "T4"),
        ("Tesla V100-SXM2-16GB", "bf16", None, None),  # not in its datasheet
        ("NVIDIA A10G", "bf16", None, None),  # no NVIDIA datasheet
        ("NVIDIA H100 NVL", "bf16", None, None),
        ("NVIDIA L40", "bf16", None, None),
        ("NVIDIA GeForce RTX 4090", "bf16", None, None),
    ],
)  # fmt: skip
def test_datasheet_peaks(name, precision, tflops, gpu):
    peak = peaks.datasheet_peak(name, precision)
    if tflops is None:
        assert peak is None
        return
    assert peak.tflops == tflops and peak.source.startswith(f"datasheet: {gpu} ")
    assert "NVIDIA" in peak.source  # the datasheet it comes from


def test_mfu_arithmetic_and_bad_precision():
    assert peaks.mfu_pct(50.0, 200.0) == 25.0
    assert math.isnan(peaks.mfu_pct(50.0, math.nan)) and math.isnan(peaks.mfu_pct(math.nan, 2.0))
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        peaks.datasheet_peak("NVIDIA H100 80GB HBM3", "fp8")


def test_measured_peak_is_a_real_rate():
    peak = flops.measured_peak(CPU, "fp32")
    assert 0 < peak.tflops < 100 and peak.source == "measured: fp32 matmul 1024^3"
    # a second look at the same precision is the same measurement (once per run)
    assert flops.measured_peak(CPU, "fp32") is peak


def _points():
    return [
        make_point("grad_accum", "transformer", 2, "native", "ddp", batch_size=4,
                   knobs={"grad_accum": 2}),
        make_point("mesh", "transformer", "tp2", "native", "tp", batch_size=4,
                   knobs={"tp_degree": 2}),
        make_point("precision", "mlp", "bf16", "native", "ddp", knobs={"precision": "bf16"}),
    ]  # fmt: skip


@pytest.mark.timeout(300)
def test_a_two_rank_run_writes_flops_and_mfu(pool, tmp_path):
    points = _points()
    rows = pool(2).run(run_points, points, str(tmp_path), FAST, timeout=280)[0]
    for p, r in zip(points, rows, strict=True):
        assert r["status"] == "ok", r["error"]
        # the per-rank FLOPs against a single-process count of the plain model
        micro = flops.count_flops(workload(p.model), p.batch_per_replica, CPU)
        expected = micro * p.knobs["grad_accum"] * p.dp_size / p.world_size
        torch.testing.assert_close(r["flops_per_step"], expected, rtol=1e-9, atol=0)
        assert r["flops_source"] == "counted"
        # the rate at the row's own throughput: steps per second = samples_per_s / samples
        steps_per_s = r["samples_per_s"] / (p.batch_per_replica * p.knobs["grad_accum"] * p.dp_size)
        torch.testing.assert_close(r["tflops_per_s"], expected * steps_per_s / 1e12, rtol=1e-6,
                                   atol=0)  # fmt: skip
        # on CPU the peak is the measured one, in the point's precision
        precision = p.knobs["precision"]
        assert r["peak_source"] == f"measured: {precision} matmul 1024^3"
        assert r["peak_tflops"] == r["peak_tflops_measured"] > 0
        assert math.isfinite(r["mfu_pct"]) and 0 < r["mfu_pct"] < 100
        assert r["mfu_pct"] == pytest.approx(100 * r["tflops_per_s"] / r["peak_tflops"])
        print(p.id, {k: r[k] for k in ("flops_per_step", "tflops_per_s", "peak_tflops",
                                       "mfu_pct", "step_ms_median")})  # fmt: skip


def test_report_and_console_show_mfu_next_to_throughput(tmp_path):
    import pandas as pd

    from bench.report.page import write_report
    from bench.runfolder.folder import read_run
    from bench.runner.training import _summary
    from tests.report_fixtures import make_training_run

    times = {("mlp", v, "native"): ms for v, ms in ((1.0, 10.0), (25.0, 12.0))}
    run_dir = make_training_run(tmp_path / "run", times)
    results = pd.read_csv(run_dir / "results.csv")
    results["peak_tflops"] = 0.15
    results["peak_source"] = "measured: fp32 matmul 1024^3"
    results["mfu_pct"] = 12.5
    results.to_csv(run_dir / "results.csv", index=False)
    page = write_report(run_dir, tmp_path / "reports")[0].read_text()
    headers = re.findall(r"<th scope='col'>(\w+)</th>", page)
    assert headers[headers.index("samples_per_s") + 1] == "mfu_pct"
    note = "mfu_pct: model FLOPs utilisation against measured: fp32 matmul 1024^3 = 0.15 TFLOP/s"
    assert note in page and ">12.50</td>" in page
    console = _summary(read_run(run_dir))
    assert note in console and "mfu_pct" in console.splitlines()[0]
