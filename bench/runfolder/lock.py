"""One run at a time in a run folder.

Two sweeps started into one ``--out`` would both append to results.csv and samples.csv under
the same point ids, and meta.json would be the last writer's. The process that writes the
folder (rank 0) holds an exclusive ``flock`` on ``<run>/.lock`` for the run's life; a second
run is refused in one line naming the first (its pid, host, start and command, which the
holder writes into the file). The kernel lets go of the lock when its process ends, however it
ends, so a run killed with SIGKILL leaves no lock behind, only its line in the file: the next
run takes the folder over and names the run that ended there without finishing (a run that
finishes empties the file). ``flock`` holds between processes of one machine, which is where a
folder's writer and the commands that start runs into it live.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.runfolder.folder import utc_now
from bench.runfolder.points import RunFolderError

LOCK_FILE = ".lock"


class FolderInUse(RunFolderError):
    """Another run holds the folder; the message names it."""


@dataclass
class FolderLock:
    """A held lock: ``stale`` is the line of a run that held the folder before and ended
    without finishing (or "")."""

    path: Path
    fd: int
    stale: str

    def finished(self) -> None:
        """The run finished: empty the file (the lock itself goes with the process)."""
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_HELD: list[FolderLock] = []  # kept for the process's life: closing the file would let go


def _holder_text(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


def _busy(run_dir: Path, holder: str) -> FolderInUse:
    who = holder or "a run that has not yet written who it is"
    return FolderInUse(
        f"{run_dir} is in use by another run ({who}): wait for it to end or choose another --out"
    )


def hold(run_dir: Path, argv: list[str] | None = None) -> FolderLock:
    """Take the folder's lock for this process's life, or FolderInUse naming the holder."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunFolderError(f"cannot create {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_text(fd)
        os.close(fd)
        raise _busy(Path(run_dir), holder) from None
    stale = _holder_text(fd)
    me = (
        f"pid {os.getpid()} on {socket.gethostname()} since "
        f"{utc_now()}: {' '.join(argv if argv is not None else sys.argv)}"
    )
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (me[:2000] + "\n").encode())
    lock = FolderLock(path=path, fd=fd, stale=stale)
    _HELD.append(lock)
    return lock


def held(run_dir: Path) -> FolderLock:
    """This process's lock of ``run_dir`` (taken by ``hold``)."""
    for lock in _HELD:
        if lock.path.parent == Path(run_dir):
            return lock
    raise RunFolderError(f"{run_dir} is not held by this process")


def check_free(run_dir: Path) -> None:
    """FolderInUse where another run holds the folder now (a check before launching ranks;
    the writer takes the lock itself)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(Path(run_dir), _holder_text(fd)) from None
    finally:
        os.close(fd)
