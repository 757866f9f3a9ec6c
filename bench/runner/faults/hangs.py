"""A point that fails leaves its ranks' flight records and stacks in ``hangs/<point>/``, and
its row the one-line diagnosis ``bench.hang`` reads from them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from bench.hang import diagnose_folder
from bench.hang.dumps import DumpError
from bench.runner.faults.watchdog import PointWatch
from parallel_kernels.compiling import compiler_output
from parallel_kernels.groups import set_point_group


def hang_dir(trace_dir: Path) -> Path:
    """``hangs/<point>/`` of the run folder (``trace_dir`` is its ``traces/<point>/``)."""
    return trace_dir.parent.parent / "hangs" / trace_dir.name


def run_watched(
    fn: Callable[[], dict], *, group: dist.ProcessGroup, rank: int, folder: Path, key: str
) -> tuple[dict | None, str | None]:
    """``fn()`` (the point on this rank) under its watchdog, with ``group`` named as the point's
    (``parallel_kernels.groups.point_group``); the flight recorder dumped if it raises:
    (result, None) or (None, error)."""
    watch = PointWatch(key=key, rank=rank, folder=folder)
    set_point_group(group)
    try:
        with watch:
            return fn(), None
    except Exception as e:  # noqa: BLE001  (any failure becomes the point's error row)
        watch.failed(e)
        return None, point_error(e)
    finally:
        set_point_group(None)


def point_error(e: BaseException) -> str:
    """A point's exception as its row's ``error``: its type and message, but for a kernel the
    C++ compiler failed on, the message's first line and the compiler's (the rest is the
    compiler's command line and output, which would fill the row)."""
    said = compiler_output(e)
    if said is None:
        return f"{type(e).__name__}: {e}"
    return f"{type(e).__name__}: {str(e).splitlines()[0]}: {said}"


def diagnosis(hangs: Path | None) -> dict:
    """The ``diagnosis`` and ``hang_dir`` columns of a failed point: the one line
    ``bench.hang`` reads from the ranks' dumps, where they left any."""
    if hangs is None or not hangs.is_dir():
        return {}
    try:
        line = diagnose_folder(hangs).line
    except DumpError as e:
        line = f"no diagnosis: {e}"
    except Exception as e:  # noqa: BLE001  (the row is written whatever the analysis does)
        line = f"no diagnosis: {type(e).__name__}: {e}"
    return {"diagnosis": line, "hang_dir": str(hangs)}
