"""Activation checkpointing in every mode: the same gradients as the plain model, alone and under
DDP and FSDP, the ops each mode recomputes, less memory, and bad modes refused in one line."""

import collections

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from bench.runner.cli import main
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from bench.runner.measure.flops import count_op_flops
from parallel_kernels.checkpointing import checkpoint_blocks, checkpoint_mode, set_checkpointing
from parallel_kernels.knobs import KNOBS
from parallel_kernels.models import MLP, build_model, workload
from parallel_kernels.strategies import STRATEGIES
from tests.test_fsdp import CPU, rank_batches, single_process, tiny, train
from tests.test_harness import FAST, run_points

MODES = ("off", "full", "selective:op", "selective:layer=2")
PAIRS = (("ddp", "native"), ("ddp", "reference"), ("fsdp", "native"), ("fsdp", "native_fsdp1"))
STEPS = 3


class OpCounts(TorchDispatchMode):
    """The aten ops dispatched while it is on, by name (``addmm``, ``gelu`` ...)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _gradients_and_backward_ops(model_name: str, mode: str):
    model = build_model(model_name, seed=0)
    set_checkpointing(model, mode)
    wl = workload(model_name)
    x, y = wl.batch(4, 0)
    loss = wl.compute_loss(wl.forward(model, x), y)
    with OpCounts() as ops:
        loss.backward()
    return {k: p.grad for k, p in model.named_parameters()}, ops.counts


@pytest.mark.unit
@pytest.mark.parametrize("model_name", ["transformer", "llama:tiny", "gpt2:tiny"])
def test_every_mode_gives_the_plain_gradients_and_recomputes_what_it_says(model_name):
    plain, plain_ops = _gradients_and_backward_ops(model_name, "off")
    recomputed = {}
    for mode in MODES[1:]:
        grads, ops = _gradients_and_backward_ops(model_name, mode)
        for k, g in plain.items():
            torch.testing.assert_close(grads[k], g, rtol=0, atol=0, msg=f"{mode} {k}")
        recomputed[mode] = ops - plain_ops  # the forward ops backward ran again
    blocks = len([m for m in build_model(model_name).modules() if _is_block(model_name, m)])
    matmuls = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu")
    full, op, layer = (recomputed[m] for m in MODES[1:])
    # full reruns every block's matmuls and attention; selective:op none of them (kept), only
    # the cheap ops around them; every second block reruns half of full's
    assert sum(full[m] for m in matmuls) > 0, full
    assert sum(op[m] for m in matmuls) == 0, op
    assert 0 < op.total() < full.total(), (op, full)
    assert layer.total() * blocks == full.total() * (blocks // 2), (layer, full)


def _is_block(model_name: str, module) -> bool:
    return isinstance(module, workload(model_name).block_types)


@pytest.mark.unit
def test_the_recomputed_flops_are_what_each_mode_reruns():
    wl = workload("transformer")  # 4 blocks
    plain = sum(count_op_flops(wl, 2).values())
    full = sum(count_op_flops(wl, 2, checkpointing="full").values()) - plain
    assert full > 0
    assert sum(count_op_flops(wl, 2, checkpointing="selective:op").values()) == plain
    assert (
        sum(count_op_flops(wl, 2, checkpointing="selective:layer=2").values()) == plain + full / 2
    )


@pytest.mark.unit
def test_modes_switch_on_one_model_and_off_undoes_them():
    model = tiny()
    forwards = [b.forward for b in model.blocks]
    for mode in ("selective:layer=2", "full", "selective:op", "on", "off"):
        set_checkpointing(model, mode)
        want = checkpoint_mode(mode)
        got = [getattr(b, "checkpoint_mode", None) for b in model.blocks]
        assert got == [want.label if want.checkpoints(i) else None for i in range(2)], mode
    assert [b.forward for b in model.blocks] == forwards
    set_checkpointing(MLP(), False)  # nothing to undo on a model without blocks
    with pytest.raises(ValueError, match="works per block; MLP has none"):
        checkpoint_blocks(MLP())


@pytest.mark.unit
@pytest.mark.parametrize(
    "text,label",
    [
        ("off", "off"),
        ("on", "full"),
        ("FULL", "full"),
        ("selective:op", "selective:op"),
        ("selective:layer=1", "full"),
        ("selective:layer=03", "selective:layer=3"),
    ],
)
def test_the_knob_reads_each_mode_once_spelled(text, label):
    assert KNOBS["activation_checkpointing"].parse(text) == label


@pytest.mark.unit
@pytest.mark.usefixtures("no_torchrun")
@pytest.mark.parametrize(
    "value,message",
    [
        ("sometimes", "'sometimes' is not a checkpointing mode (off, full"),
        ("selective:foo", "'selective:foo' is not a checkpointing mode"),
        ("selective:layer=0", "the layer interval N must be an integer >= 1"),
        ("selective:layer=x", "the layer interval N must be an integer >= 1"),
    ],
)
def test_a_bad_mode_is_one_line_and_exit_2(value, message, capsys):
    for args in (["--values", value], ["--option", f"activation_checkpointing={value}"]):
        sweep = "activation_checkpointing" if args[0] == "--values" else "grad_accum"
        with pytest.raises(SystemExit) as exc:
            main(["--sweep", sweep, *args, "--nproc-per-node", "2"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1, err


def _both_sides(points, root: str) -> tuple[dict, list[dict]]:
    """On each rank: every mode's losses under each strategy, then the sweep's rows."""
    world, rank = dist.get_world_size(), dist.get_rank()
    losses = {}
    for strategy, impl in PAIRS:
        for mode in MODES:
            model = set_checkpointing(tiny(), mode)
            model = STRATEGIES[strategy].apply(impl, model, group=None, device=CPU)
            losses[strategy, impl, mode] = train(model, rank_batches(world, rank, STEPS))
    return losses, run_points(points, root, FAST)


@pytest.fixture(scope="module")
def ranks(pool, tmp_path_factory):
    """The file's one pool call at 2 ranks: the sweep's default modes under DDP, selective:op
    under FSDP2 and the reference FSDP, and every mode trained under each strategy."""
    points = build_points(
        RunConfig(sweep="activation_checkpointing", impl="native", batch_size=8), world_size=2
    )
    points += build_points(
        RunConfig(
            sweep="activation_checkpointing",
            values="selective:op",
            strategy="fsdp",
            impl="native,reference",
            batch_size=8,
        ),
        world_size=2,
    )
    root = str(tmp_path_factory.mktemp("checkpointing"))
    return pool(2).run(_both_sides, points, root, timeout=400)[0]


@pytest.mark.ranks
@pytest.mark.timeout(420)
def test_checkpointed_training_matches_single_process(ranks):
    losses, _ = ranks
    _, expected = single_process(2, STEPS)  # without checkpointing
    for case, got in losses.items():
        torch.testing.assert_close(
            torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-5, msg=str(case)
        )


@pytest.mark.ranks
@pytest.mark.timeout(420)
def test_the_sweep_orders_memory_and_names_what_it_cannot_do(ranks):
    _, rows = ranks
    by = {(r["strategy"], r["impl"], r["value"]): r for r in rows}
    ddp = {m: by["ddp", "native", m] for m in MODES}
    for mode, r in ddp.items():  # each checked against the plain model in its warm-up
        assert r["status"] == "ok", (mode, r["error"])
        assert r["activation_checkpointing"] == mode
        assert r["comm_bytes_per_step"] == ddp["off"]["comm_bytes_per_step"]
    peak = {m: r["peak_mem_mb"] for m, r in ddp.items()}
    print("peak MB", peak)
    # activations of 4 blocks at batch 8 x 64 tokens: off keeps them all, selective:op the
    # matmuls' and attention's outputs, every second block's checkpointed half, full none
    assert peak["off"] > peak["selective:op"] > peak["full"], peak
    assert peak["off"] > peak["selective:layer=2"] > peak["full"], peak
    assert peak["full"] < peak["off"] - 10, peak
    # the counter's FLOPs (matmuls, attention): selective:op keeps every one it counts
    recomputed = {m: r["recompute_flops_per_step"] for m, r in ddp.items()}
    assert recomputed["off"] == recomputed["selective:op"] == 0, recomputed
    assert recomputed["full"] == 2 * recomputed["selective:layer=2"] > 0, recomputed
    fsdp = by["fsdp", "native", "selective:op"]
    assert fsdp["status"] == "ok", fsdp["error"]
    ref = by["fsdp", "reference", "selective:op"]
    assert ref["status"] == "error" and "not supported by the reference FSDP" in ref["error"]
