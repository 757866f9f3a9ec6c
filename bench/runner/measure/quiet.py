"""Keep the profiler's own start/stop lines off the console.

Kineto writes ``USDT: ... profiler_start`` and ``profiler_stop`` to the process's stderr from
native code, two lines per rank for every point (80 of them in one ``make sweep``), and they
drowned the suite's progress. ``KINETO_LOG_LEVEL`` above ERROR would silence them, but with
every warning and error of kineto too (CUPTI's among them, which say why a GPU trace is
empty). So the file descriptor itself is sent to a temporary file while the profiler runs, and
everything but those lines is written back afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

PROFILER_LINES = (b"USDT:",)


@contextmanager
def without_lines(prefixes: tuple[bytes, ...] = PROFILER_LINES, fd: int = 2) -> Iterator[None]:
    """Run the block with ``fd`` captured; then write back every line not starting with one
    of ``prefixes`` (crash reports go elsewhere: ``bench/run.py`` gives faulthandler its own
    descriptor)."""
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [
                ln for ln in tmp.read().splitlines(keepends=True) if not ln.startswith(prefixes)
            ]
            if kept:
                os.write(fd, b"".join(kept))
