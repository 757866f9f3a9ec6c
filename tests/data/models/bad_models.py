"""Factories that go wrong in each way ``--model FILE:FACTORY`` must refuse in one line
(tests/test_user_model.py)."""

import dataclasses
from pathlib import Path

from torch import nn

from parallel_kernels import Workload
from parallel_kernels.user_model import resolve

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "custom_model.py"

not_callable = 3


def raises() -> Workload:
    raise RuntimeError("no GPU configured")


def a_module() -> nn.Module:
    return nn.Linear(2, 2)


def plan_names_a_missing_module() -> Workload:
    return dataclasses.replace(resolve(f"{EXAMPLE}:workload"), tp_plan={"blocks.*.upp": "colwise"})


def units_the_model_lacks() -> Workload:
    return dataclasses.replace(resolve(f"{EXAMPLE}:workload"), fsdp_units=(nn.GRU,))


def no_tp_plan() -> Workload:
    return dataclasses.replace(resolve(f"{EXAMPLE}:workload"), tp_plan=None)
