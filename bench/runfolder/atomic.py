"""Whole files written whole or not at all, and a full disk reported in one line.

A file is written beside its place under a temporary name, flushed to disk, then renamed over
the old one: a reader (or a report opened in a browser) sees the old file or the new one,
never a fragment, and a write that fails (a full disk, a quota) leaves the old file as it was
and raises ``OutputError``, whose message names the path and the reason in one line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


class OutputError(RuntimeError):
    """An output that could not be written; the message names the path and why."""


def describe(path: Path, e: OSError) -> str:
    return f"cannot write {path}: {e.strerror or e}"


def write_with(path: Path, write: Callable[[IO], None], *, binary: bool = False) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb" if binary else "w", newline=None if binary else "") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputError(describe(path, e)) from None
    return path


def write_text(path: Path, text: str) -> Path:
    return write_with(path, lambda f: f.write(text))


def write_bytes(path: Path, data: bytes) -> Path:
    return write_with(path, lambda f: f.write(data), binary=True)


def write_tables(folder: Path, tables: dict) -> None:
    """Each DataFrame of ``tables`` (name -> table) as ``folder/<name>.csv``, each file whole;
    ``OutputError`` at the first that cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        write_with(folder / f"{name}.csv", lambda f, df=df: df.to_csv(f, index=False))
