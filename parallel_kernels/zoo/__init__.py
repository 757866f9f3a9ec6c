"""The models people train, built from their configs (random weights, nothing downloaded), as
workloads at named sizes: ``--model llama:tiny``. ``ZOO`` maps a model's name to a function of
the size's name; an unknown size raises ValueError naming the known ones."""

from __future__ import annotations

from collections.abc import Callable

from parallel_kernels.workload import Workload

ZOO: dict[str, Callable[[str], Workload]] = {}


def sized(model: str, sizes: dict[str, Callable[[], Workload]]) -> Callable[[str], Workload]:
    """The zoo entry of a model with named sizes."""

    def at(size: str) -> Workload:
        if size not in sizes:
            raise ValueError(f"unknown size {size!r} of {model} (known: {', '.join(sizes)})")
        return sizes[size]()

    return at


# Each family registers its sizes in ZOO; none imports transformers until a model is built.
from parallel_kernels.zoo import bert, gpt2, llama, resnet  # noqa: E402, F401
