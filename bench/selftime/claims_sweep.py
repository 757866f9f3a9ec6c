"""``bench/run.py`` with two more models, for ``claims_check.py``: ``<model>_twin`` (the same
model under another name: an A/A pair) and ``<model>_slowed`` (the same model doing a chosen
share of extra computation in every step: a known effect, not a sleep).

    torchrun --standalone --nproc_per_node=2 bench/selftime/claims_sweep.py --extra-pct 5 \\
        --sweep bucket_cap_mb --values 25 --impl native --model wide_mlp,wide_mlp_slowed

The extra computation is a product of the first hidden activation with a fixed matrix, added
back scaled by 1e-6 (so the loss stays the model's): forward and backward each do 2 x k x width
multiply-adds per sample, with k chosen so that they add ``--extra-pct`` % of the model's own
forward and backward arithmetic (6 x parameters per sample). Its time share is measured, not
assumed: ``claims_check.py`` reports the slowdown its runs saw.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch import nn

from parallel_kernels.models import MODELS, param_count


class ExtraWork(nn.Module):
    """``model`` (an MLP: Linear first) with a fixed k x width product on its first hidden
    activation."""

    def __init__(self, model: nn.Module, extra_pct: float) -> None:
        super().__init__()
        self.net = model.net
        width = self.net[0].out_features
        flops = 6 * param_count(model)  # forward and backward, per sample
        self.k = max(1, min(width, round(extra_pct / 100 * flops / (4 * width))))
        g = torch.Generator().manual_seed(0)
        self.register_buffer("extra", torch.randn(self.k, width, generator=g) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[1](self.net[0](x))
        h = h + 1e-6 * (h[:, : self.k] @ self.extra)
        for layer in self.net[2:]:
            h = layer(h)
        return h


def register(base: str, extra_pct: float) -> None:
    spec = MODELS[base]
    MODELS[f"{base}_twin"] = spec.__class__(**{**vars(spec), "name": f"{base}_twin"})
    MODELS[f"{base}_slowed"] = spec.__class__(
        **{
            **vars(spec),
            "name": f"{base}_slowed",
            "description": f"{spec.description} + {extra_pct:g} % extra arithmetic",
            "build": lambda: ExtraWork(spec.build(), extra_pct),
        }
    )


def main(argv: list[str]) -> int:
    extra = 5.0
    if argv[:1] == ["--extra-pct"]:
        extra, argv = float(argv[1]), argv[2:]
    for base in ("mlp", "wide_mlp"):
        register(base, extra)
    from bench.runner.cli import main as run_main

    return run_main(argv)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as bench/run.py, for the same reason
