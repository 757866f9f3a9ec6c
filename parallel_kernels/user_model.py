"""``--model`` names that are not built in: a zoo model at a size (``llama:tiny``) or the user's
own factory (``path/to/file.py:factory``, ``package.module:factory``), resolved to a
``Workload`` once per process. Every way it can fail is one line (ValueError), raised before any
rank trains."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from parallel_kernels.workload import Workload


@functools.cache
def resolve(name: str, known: tuple[str, ...] = ()) -> Workload:
    source, sep, attr = name.rpartition(":")
    if not sep or not source or not attr:
        raise ValueError(
            f"unknown model {name!r} (known: {', '.join(known)}; a zoo model as NAME:SIZE, e.g. "
            f"llama:tiny; your own as path/to/file.py:factory or package.module:factory)"
        )
    from parallel_kernels.zoo import ZOO

    if source in ZOO:
        return ZOO[source](attr)
    factory = getattr(_module(source), attr, None)
    if factory is None:
        raise ValueError(f"model {name!r}: {source} has no {attr!r}")
    if not callable(factory):
        raise ValueError(f"model {name!r}: {attr} is a {type(factory).__name__}, not callable")
    try:
        made = factory()
    except Exception as e:  # noqa: BLE001  (the user's code: say what it raised, in one line)
        raise ValueError(f"model {name!r}: {attr}() raised {type(e).__name__}: {e}") from None
    if not isinstance(made, Workload):
        raise ValueError(
            f"model {name!r}: {attr}() returned a {type(made).__name__}, not a "
            f"parallel_kernels.Workload"
        )
    _check_batch(made, f"model {name!r}: {attr}()")
    return made if made.name == name else _renamed(made, name)


def _check_batch(wl: Workload, who: str) -> None:
    """``batch`` tried on two samples, before any rank trains: it must give ``(inputs,
    targets)``, the targets None where the model's output carries its own loss."""
    try:
        made = wl.batch(2, 0)
    except Exception as e:  # noqa: BLE001  (the user's code: one line)
        raise ValueError(f"{who}.batch(2, 0) raised {type(e).__name__}: {e}") from None
    if isinstance(made, tuple | list) and len(made) == 2:
        return
    if isinstance(made, Mapping):
        what = f"a dict with keys {sorted(map(str, made))}"
    elif isinstance(made, tuple | list):
        what = f"a {type(made).__name__} of {len(made)}"
    else:
        what = f"a {type(made).__name__}"
    raise ValueError(
        f"{who}.batch(2, 0) returned {what}, not (inputs, targets): return (inputs, None) "
        "when the model's output carries its own loss"
    )


def _renamed(wl: Workload, name: str) -> Workload:
    """The workload under the name the run knows it by (points, folders, reports)."""
    from dataclasses import replace

    return replace(wl, name=name)


def _module(source: str):
    """The module a factory lives in: a .py file (loaded under a name of its own) or an
    importable dotted path."""
    if source.endswith(".py"):
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"model file {source} does not exist")
        mod_name = f"bench_user_model_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            del sys.modules[mod_name]
            raise ValueError(
                f"model file {source} does not import: {type(e).__name__}: {e}"
            ) from None
        return module
    try:
        return importlib.import_module(source)
    except Exception as e:  # noqa: BLE001
        raise ValueError(
            f"model module {source} does not import: {type(e).__name__}: {e}"
        ) from None
