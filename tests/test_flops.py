"""FLOPs and MFU: the counter against the analytical count of a GPT-style model, the step's
FLOPs per rank against a single-process count, a workload's own figure against the counter's,
the precision torch runs fp32 in on CUDA (read from its legacy and new settings), the datasheet
peaks, the measured peak, an fp32 ResNet-50 on a simulated A100, the MFU that cannot be, and
the columns a real 2-rank harness run writes."""

import dataclasses
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.runfolder import peaks
from bench.runner.measure import flops
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
    return Workload(
        name=name,
        build=build,
        batch=lambda n, s: _token_data(n, s, vocab, seq),
        loss=_lm_loss,
        tokens_per_sample=seq,
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "wl, layers, dim",
    [
        (workload("transformer"), 4, 256),  # the built-in model, as sweeps train it
        # a long sequence on a narrow model: attention is 38 % of the FLOPs here
        (
            _wl(
                "long", lambda: Transformer(vocab=128, dim=64, heads=2, layers=2, seq=256), 256, 128
            ),
            2,
            64,
        ),
    ],
)
def test_counter_matches_the_palm_count_of_a_decoder(wl, layers, dim):
    batch = 4
    counted = flops.count_flops(wl, batch)
    seq = wl.tokens_per_sample
    expected = analytical_flops(wl.build(), layers, dim, seq, batch * seq)
    assert counted == pytest.approx(expected, rel=0.10), (counted, expected)
    # on fake tensors, as the harness counts: the same figure as on real ones
    assert flops.count_flops(wl, batch, CPU) == pytest.approx(counted, rel=1e-9)


@pytest.mark.unit
@pytest.mark.ci_needs("transformers")
@pytest.mark.parametrize("name", ["gpt2:tiny", "llama:tiny"])
def test_counter_matches_the_palm_count_of_zoo_decoders(name):
    pytest.importorskip(
        "transformers",
        reason="transformers is not installed (pip install "
        "-e '.[models]'): the zoo's models need it",
    )
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
    expected = analytical_flops(
        model, cfg.num_hidden_layers, cfg.hidden_size, ids.shape[1], ids.numel()
    )
    assert counted == pytest.approx(expected, rel=0.10), (counted, expected)


@pytest.mark.unit
def test_the_workloads_own_figure_wins():
    wl = _wl("stated", lambda: Transformer(layers=1), 64, 512)
    wl = dataclasses.replace(wl, flops_per_sample=5e8)  # the counter: 3.65e8, 1.4x away
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within 3x of the count: no warning
        assert flops.micro_batch_flops(wl, 8, CPU) == (4e9, "workload")


@pytest.mark.unit
def test_a_stated_figure_far_from_the_count_warns_naming_both():
    wl = _wl("stated", lambda: Transformer(layers=1), 64, 512)
    counted = flops.count_flops(wl, 1)
    # the forward pass's multiply-adds, as papers quote a model's size: a sixth of the FLOPs
    wl = dataclasses.replace(wl, flops_per_sample=counted / 6)
    with pytest.warns(
        UserWarning,
        match=r"stated: flops_per_sample is 6\.08e\+07, the FLOP "
        r"counter finds 3\.65e\+08 per sample \(0\.17x\): .*forward plus backward, "
        r"a multiply-add counted as 2 FLOPs",
    ):
        got, source = flops.micro_batch_flops(wl, 8, CPU)
    assert got == pytest.approx(8 * counted / 6)  # MFU uses the stated figure, and says so
    assert source == "workload (0.17x the counter's 3.65e+08)"


class ReadsItsData(nn.Module):
    """A model that looks at its data (``.item()``): it cannot run on fake tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2.0 if x.abs().sum().item() > 0 else 1.0)


@pytest.mark.unit
def test_a_model_that_reads_its_data_is_counted_on_the_device():
    wl = Workload(
        name="reads",
        build=ReadsItsData,
        batch=lambda n, s: (torch.randn(n, 16), torch.randint(0, 8, (n,))),
        loss=F.cross_entropy,
    )
    with pytest.raises(Exception, match="_local_scalar_dense"):  # .item() on a fake tensor
        flops.count_flops(wl, 4)
    # forward 2 x 4 x 16 x 8, backward the weight's gradient only (the input needs none)
    assert flops.micro_batch_flops(wl, 4, CPU) == (4 * 4 * 16 * 8, "counted")


class Uncountable(ReadsItsData):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of memory\nsecond line")


@pytest.mark.unit
def test_a_model_that_cannot_be_counted_says_why():
    wl = Workload(name="oom", build=Uncountable, batch=lambda n, s: (torch.randn(n, 16), None))
    flops_, source = flops.micro_batch_flops(wl, 4, CPU)
    assert math.isnan(flops_) and source == "uncounted: RuntimeError: out of memory"


@pytest.mark.unit
def test_step_flops_scale_with_batch_accumulation_and_tp_degree():
    micro = flops.count_flops(workload("transformer"), 4)
    base = make_point("grad_accum", "transformer", 1, "native", "ddp", batch_size=4)
    # every rank of DDP computes its own replica's micro-batches
    assert flops.step_flops(base, CPU) == (micro, "counted")
    bigger = make_point("grad_accum", "transformer", 1, "native", "ddp", batch_size=8)
    assert flops.step_flops(bigger, CPU)[0] == pytest.approx(2 * micro, rel=1e-12)
    accum = make_point(
        "grad_accum", "transformer", 3, "native", "ddp", batch_size=4, knobs={"grad_accum": 3}
    )
    assert flops.step_flops(accum, CPU)[0] == pytest.approx(3 * micro, rel=1e-12)
    # two TP ranks share one replica's FLOPs
    tp = make_point(
        "mesh", "transformer", "tp2", "native", "tp", batch_size=4, knobs={"tp_degree": 2}
    )
    assert tp.dp_size == 1 and flops.step_flops(tp, CPU)[0] == pytest.approx(micro / 2)


@pytest.mark.unit
@pytest.mark.parametrize(
    "name, precision, tflops, gpu",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5, "H100 SXM5"),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0, "H100 SXM5"),
        ("NVIDIA H100 PCIe", "tf32", 378.0, "H100 PCIe"),
        ("NVIDIA H200", "bf16", 989.5, "H200 SXM"),
        ("NVIDIA H200 NVL", "fp16", 835.5, "H200 NVL"),
        ("NVIDIA GH200 480GB", "bf16", 989.5, "GH200"),  # not "H200 SXM"
        ("NVIDIA GH200 144G HBM3e", "tf32", 494.5, "GH200"),
        ("NVIDIA H100 NVL", "bf16", 835.5, "H100 NVL"),
        ("NVIDIA H100 NVL", "fp32", 60.0, "H100 NVL"),
        ("NVIDIA B200", "bf16", 2250.0, "B200"),
        ("NVIDIA B200", "tf32", 1125.0, "B200"),
        ("NVIDIA GB200", "bf16", 2500.0, "GB200"),  # not "B200": its GPUs run at 1200 W
        ("NVIDIA GB200", "fp32", 80.0, "GB200"),
        ("NVIDIA B300 SXM6 AC", "bf16", 2250.0, "B300"),
        ("NVIDIA B300 SXM6 AC", "tf32", 1125.0, "B300"),
        ("NVIDIA L40", "bf16", 181.05, "L40"),  # not the L40S
        ("NVIDIA L40", "tf32", 90.5, "L40"),
        ("NVIDIA A10G", "bf16", 70.0, "A10G"),  # not the A10
        ("NVIDIA A10G", "fp32", 35.0, "A10G"),
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
        ("NVIDIA GB300", "bf16", None, None),  # not "B300": no per-GPU tf32 figure printed
        ("NVIDIA RTX A1000", "fp32", None, None),  # not "A100"
        ("NVIDIA GeForce RTX 4090", "bf16", None, None),
    ],
)
def test_datasheet_peaks(name, precision, tflops, gpu):
    peak = peaks.datasheet_peak(name, precision)
    if tflops is None:
        assert peak is None
        return
    assert peak.tflops == tflops and peak.source.startswith(f"datasheet: {gpu} ")
    assert "nvidia.com" in peak.source or "baseten.co" in peak.source  # where figures come from


@pytest.mark.unit
def test_mfu_arithmetic_and_bad_precision():
    assert peaks.mfu_pct(50.0, 200.0) == 25.0
    assert math.isnan(peaks.mfu_pct(50.0, math.nan)) and math.isnan(peaks.mfu_pct(math.nan, 2.0))
    with pytest.raises(ValueError, match="unknown precision 'fp4'"):
        peaks.datasheet_peak("NVIDIA H100 80GB HBM3", "fp4")


# One size or more: a size whose one matmul took over an eighth of the budget is the last, as
# 512^3 in bf16 on a loaded CPU can be (a clean-clone make test measured only 512^3 once).
MEASURED = re.compile(r"measured: (\w+) matmul (\d+)\^3 \(best of 512\^3(, 1024\^3(, 2048\^3)?)?\)")


@pytest.mark.unit
def test_measured_peak_is_the_best_rate_over_sizes(monkeypatch):
    peak = flops.measured_peak(CPU, "fp32")
    assert 0 < peak.tflops < 100 and MEASURED.fullmatch(peak.source), peak.source
    print(peak)
    # a second look at the same precision is the same measurement (once per run)
    assert flops.measured_peak(CPU, "fp32") is peak
    # the best size wins, whichever it is
    rates = {512: 0.05, 1024: 0.10, 2048: 0.20}  # TFLOP/s, as this 2-core machine's
    monkeypatch.setattr(flops, "_matmul_s", lambda device, precision, n: 2 * n**3 / rates[n] / 1e12)
    best = flops.measured_peak.__wrapped__(CPU, "fp32")
    assert best == peaks.Peak(
        pytest.approx(0.20), "measured: fp32 matmul 2048^3 (best of 512^3, 1024^3, 2048^3)"
    )
    rates[1024] = 0.30
    assert flops.measured_peak.__wrapped__(CPU, "fp32").source.startswith(
        "measured: fp32 matmul 1024^3"
    )


@pytest.mark.unit
def test_a_cpus_peak_is_its_roofline_profiles_or_measured_where_it_has_none(monkeypatch):
    from bench.roofline.profile import Curve, Roofline

    flat = Curve((1.0, 2.0), (1.0, 1.0))
    roof = Roofline("a CPU", "test", {"fp32": 0.25}, 10.0, {"fp32": flat}, flat, 1.0)
    monkeypatch.setattr(flops, "device_roofline", lambda device: (roof, "a CPU (test)"))
    monkeypatch.setattr(flops, "measured_peak", lambda device, p: peaks.Peak(0.5, f"{p} timed"))
    assert flops.device_peak(CPU, "fp32") == peaks.Peak(0.25, "measured: fp32 peak of a CPU (test)")
    assert flops.device_peak(CPU, "fp16") == peaks.Peak(0.5, "fp16 timed")
    monkeypatch.setattr(flops, "device_roofline", lambda device: (None, "none here"))
    assert flops.device_peak(CPU, "fp32") == peaks.Peak(0.5, "fp32 timed")


@pytest.mark.unit
def test_op_classes_split_a_cnns_flops_from_a_transformers():
    cnn = flops.count_op_flops(workload("resnet:tiny"), 2)
    assert cnn.keys() == {"conv", "matmul"} and cnn["conv"] > 100 * cnn["matmul"]  # the fc
    assert flops.count_op_flops(workload("transformer"), 2).keys() == {"matmul"}


# -- the precision an fp32 point runs in on CUDA ------------------------------------------


@pytest.fixture
def fp32_settings():
    """torch.backends as the test leaves it set, every precision setting back to torch's
    defaults after (legacy first: its setters write the new API's values too)."""
    yield torch.backends
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    b = torch.backends
    for module in (b, b.cuda.matmul, b.cudnn, b.mkldnn, b.mkldnn.matmul):
        module.fp32_precision = "none"
    for module in (b.cudnn.conv, b.cudnn.rnn):
        module.fp32_precision = "tf32"
    for module in (b.mkldnn.conv, b.mkldnn.rnn):
        module.fp32_precision = "none"


def _legacy_matmul_flag():
    return torch.backends.cuda.matmul.allow_tf32


@pytest.mark.unit
@pytest.mark.parametrize(
    "settings, matmul, conv",
    [
        ([], False, True),  # torch's defaults: cuDNN convolutions in TF32, matmuls not
        (["torch.backends.cuda.matmul.fp32_precision = 'tf32'"], True, True),
        (["torch.backends.cudnn.conv.fp32_precision = 'ieee'"], False, False),
        (
            [
                "torch.backends.cudnn.fp32_precision = 'ieee'",  # conv's own "tf32" wins...
                "torch.backends.cudnn.conv.fp32_precision = 'none'",
            ],
            False,
            False,
        ),  # ...until none
        (["torch.backends.fp32_precision = 'tf32'"], True, True),  # the generic one, inherited
        (["torch.set_float32_matmul_precision('high')"], True, True),  # legacy
        (["torch.backends.cuda.matmul.allow_tf32 = True"], True, True),  # legacy
        (["torch.backends.cudnn.allow_tf32 = False"], False, False),  # legacy
        # the mix that makes legacy getters raise
        (
            [
                "torch.set_float32_matmul_precision('highest')",
                "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
            ],
            True,
            True,
        ),
        (["torch.backends.cudnn.rnn.fp32_precision = 'ieee'"], False, True),
    ],
)
def test_tf32_settings_are_read_without_raising(fp32_settings, settings, matmul, conv):
    for line in settings:
        exec(line, {"torch": torch})
    assert flops.tf32_ops() == {"matmul": matmul, "conv": conv}


@pytest.mark.unit
def test_reading_the_settings_after_the_new_api_never_raises(fp32_settings):
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    # what would turn every fp32 point into an error row if read the legacy way
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        _legacy_matmul_flag()
    with pytest.raises(RuntimeError, match="a mix of the legacy and new APIs"):
        torch.backends.cudnn.allow_tf32  # noqa: B018
    assert flops.tf32_ops() == {"matmul": True, "conv": False}


@pytest.mark.unit
def test_tf32_falls_back_to_the_legacy_flags_and_never_raises():
    def missing():
        raise AttributeError("no fp32_precision before torch 2.9")

    def mixed():
        raise RuntimeError("a mix of the legacy and new APIs")

    assert flops._tf32(lambda: "tf32", mixed) is True
    assert flops._tf32(lambda: "none", lambda: True) is False  # the new API decides
    assert flops._tf32(missing, lambda: True) is True
    assert flops._tf32(missing, mixed) is False


@pytest.mark.unit
@pytest.mark.parametrize(
    "by_class, tf32, precision, why",
    [
        (
            {"conv": 99.0, "matmul": 1.0},
            {"matmul": False, "conv": True},
            "tf32",
            "fp32 point, shares of the counted FLOPs: convolutions 99 % in TF32, matmuls 1 % in "
            "IEEE fp32",
        ),
        (
            {"matmul": 5.0},
            {"matmul": False, "conv": True},
            "fp32",
            "fp32 point, shares of the counted FLOPs: matmuls 100 % in IEEE fp32",
        ),
        (
            {"matmul": 5.0},
            {"matmul": True, "conv": False},
            "tf32",
            "fp32 point, shares of the counted FLOPs: matmuls 100 % in TF32",
        ),
        # a vision transformer's patch convolution in TF32, its matmuls in fp32: most are fp32
        (
            {"conv": 1.0, "matmul": 9.0},
            {"matmul": False, "conv": True},
            "fp32",
            "fp32 point, shares of the counted FLOPs: matmuls 90 % in IEEE fp32, convolutions "
            "10 % in TF32",
        ),
        (
            {},
            {"matmul": False, "conv": True},
            "tf32",  # uncounted: the faster peak
            "fp32 point, FLOPs uncounted: convolutions in TF32",
        ),
        (
            {},
            {"matmul": False, "conv": False},
            "fp32",
            "fp32 point: matmuls and convolutions in IEEE fp32",
        ),
    ],
)
def test_an_fp32_points_peak_is_that_of_most_of_its_flops(by_class, tf32, precision, why):
    assert flops.fp32_precision(by_class, tf32) == (precision, why)


# -- an fp32 ResNet-50 on a simulated A100 ------------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"
RESNET_IMG_S = 938  # a published fp32 (TF32) ResNet-50 training rate on one A100 (issue 2)


@pytest.fixture
def simulated_gpu(monkeypatch):
    """A CUDA device for the peak's code on a CPU-only torch: the name and compute capability
    torch.cuda would report (8.0: Ampere, TF32), and a stub for the matmul timing."""

    def simulate(name: str):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        monkeypatch.setattr(
            flops,
            "measured_peak",
            lambda device, precision: peaks.Peak(
                1.0, f"measured: {precision} matmul 8192^3 (best of 4096^3, 8192^3)"
            ),
        )
        return torch.device("cuda", 0)

    return simulate


def _resnet_row(device: torch.device, batch: int = 8) -> dict:
    """The FLOPs columns of an fp32 ResNet-50 point on one device at RESNET_IMG_S."""
    point = make_point(
        "precision",
        "resnet:50",
        "fp32",
        "native",
        "ddp",
        world_size=1,
        knobs={"precision": "fp32"},
        batch_size=batch,
    )
    peak = flops.point_peaks(point, device)
    row = flops.figures(point, device, batch / RESNET_IMG_S, peak)
    return {**row, **flops.utilisation(row)}


@pytest.mark.unit
def test_fp32_resnet50_on_a_simulated_a100_is_against_the_tf32_peak(simulated_gpu, fp32_settings):
    device = simulated_gpu(A100)
    assert flops.tf32_ops() == {"matmul": False, "conv": True}  # torch's defaults
    row = _resnet_row(device)
    # the counter's ResNet-50 at 224 x 224, forward and backward: 24.3 GFLOPs per image
    assert row["flops_source"] == "counted"
    assert row["flops_per_step"] / 8 == pytest.approx(24.3e9, rel=2e-3)
    assert row["peak_tflops"] == 156.0  # the A100's dense TF32 peak, not fp32's 19.5
    assert row["peak_source"].startswith("datasheet: A100 tf32 dense (NVIDIA A100")
    assert row["peak_source"].endswith(
        "; fp32 point, shares of the counted FLOPs: "
        "convolutions 99.9 % in TF32, matmuls 0.0506 % in IEEE fp32"
    )
    assert row["mfu_pct"] == pytest.approx(100 * RESNET_IMG_S * 24.3e9 / 156e12, rel=2e-3)
    print(
        f"simulated A100, fp32 ResNet-50 at {RESNET_IMG_S} img/s: MFU {row['mfu_pct']:.2f} % "
        f"against {row['peak_source']}"
    )
    assert 14.5 < row["mfu_pct"] < 14.7


@pytest.mark.unit
def test_an_mfu_above_100_pct_is_no_figure(simulated_gpu, fp32_settings):
    """With cuDNN's TF32 off (the new API), the same rate against the fp32 peak would be 117 %
    MFU: the peak is right there, so the rate is what cannot be; either way no such figure."""
    device = simulated_gpu(A100)
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    row = _resnet_row(device)
    assert row["peak_tflops"] == 19.5
    assert math.isnan(row["mfu_pct"])  # 938 x 24.3e9 / 19.5e12 = 117 %
    assert row["peak_source"].startswith(peaks.IMPOSSIBLE + "datasheet: A100 fp32 dense")
    assert "IEEE fp32" in row["peak_source"]  # which peak it was, and why that precision


@pytest.mark.unit
def test_checked_mfu_keeps_figures_up_to_100_pct():
    assert peaks.checked_mfu(50.0, 200.0, "datasheet: x") == (25.0, "datasheet: x")
    assert peaks.checked_mfu(200.0, 200.0, "datasheet: x") == (100.0, "datasheet: x")
    mfu, source = peaks.checked_mfu(201.0, 200.0, "datasheet: x")
    assert math.isnan(mfu) and source == peaks.IMPOSSIBLE + "datasheet: x"
    assert "cannot be right" in peaks.IMPOSSIBLE


@pytest.mark.unit
def test_a_gpu_without_a_datasheet_row_says_its_peak_is_measured(simulated_gpu):
    device = simulated_gpu("NVIDIA GeForce RTX 4090")
    point = make_point(
        "precision",
        "transformer",
        "bf16",
        "native",
        "ddp",
        world_size=1,
        knobs={"precision": "bf16"},
        batch_size=4,
    )
    used, measured = flops.point_peaks(point, device)
    assert used.tflops == measured.tflops == 1.0
    assert used.source.startswith("measured: bf16 matmul 8192^3")
    assert "NVIDIA GeForce RTX 4090 has no bf16 datasheet peak here: a measured peak" in used.source


def _points():
    return [
        make_point(
            "grad_accum", "transformer", 2, "native", "ddp", batch_size=4, knobs={"grad_accum": 2}
        ),
        make_point(
            "mesh", "transformer", "tp2", "native", "tp", batch_size=4, knobs={"tp_degree": 2}
        ),
        make_point("precision", "mlp", "bf16", "native", "ddp", knobs={"precision": "bf16"}),
    ]


@pytest.mark.ranks
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
        torch.testing.assert_close(
            r["tflops_per_s"], expected * steps_per_s / 1e12, rtol=1e-6, atol=0
        )
        # on CPU the peak is the measured one in the point's precision: this host's roofline's
        precision = p.knobs["precision"]
        assert r["peak_source"].startswith(f"measured: {precision} peak of "), r["peak_source"]
        assert r["peak_tflops"] == r["peak_tflops_measured"] > 0
        assert math.isfinite(r["mfu_pct"]) and 0 < r["mfu_pct"] < 100
        assert r["mfu_pct"] == pytest.approx(100 * r["tflops_per_s"] / r["peak_tflops"])
        print(
            p.id,
            {
                k: r[k]
                for k in (
                    "flops_per_step",
                    "tflops_per_s",
                    "peak_tflops",
                    "mfu_pct",
                    "step_ms_median",
                )
            },
        )


@pytest.mark.unit
def test_report_and_console_show_mfu_next_to_throughput(tmp_path):
    import pandas as pd

    from bench.report.page import write_report
    from bench.runfolder.schema import read_run
    from bench.runner.train.sweep import _summary
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


@pytest.mark.unit
def test_the_report_names_a_peak_that_cannot_be_right():
    import pandas as pd

    from bench.report.mfu import mfu_note

    fp32 = "datasheet: A100 fp32 dense (NVIDIA A100 datasheet)"
    df = pd.DataFrame(
        {
            "peak_source": ["measured: fp32 matmul 2048^3", peaks.IMPOSSIBLE + fp32],
            "peak_tflops": [0.15, 19.5],
            "mfu_pct": [12.5, math.nan],
        }
    )
    assert mfu_note(df) == (
        "; mfu_pct: model FLOPs utilisation against measured: fp32 matmul 2048^3 = 0.15 "
        "TFLOP/s; no mfu_pct where the model computed faster than its peak, which cannot be "
        f"right: {fp32} = 19.5 TFLOP/s"
    )
