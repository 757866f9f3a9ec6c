"""The flight recorder, on for every point, and what a rank leaves behind when a point fails.

torch's flight recorder keeps, per process, the last ``TORCH_FR_BUFFER_SIZE`` collectives it
issued: process group, sequence number in that group, op, sizes, dtypes and the Python stack
that issued it (torch 2.13 records gloo's as well as NCCL's). It costs a ring-buffer append per
collective (``tests/benchmarks/test_flight_recorder.py`` measures it). When a point fails,
every rank that can still act writes, into ``hangs/<point>/``:

- ``fr_rank<N>``: the record, in torch's own dump format (a pickle), so that torch's analyser
  (``python -m torch.distributed.flight_recorder.fr_trace DIR``) reads it too. gloo leaves the
  groups' member lists out of it; they are filled in here from ``torch.distributed``'s own
  registry, and entries of groups already destroyed (earlier points) are left out.
- ``stacks_rank<N>.json``: why it dumped, the error it had, the traceback of that error, and
  every thread's Python stack at the time.

``bench.hang`` reads the folder and names the rank, the call and the line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.runfolder.atomic import OutputError, write_bytes

# set while a dump is written (faults/watchdog.py defers SIGTERM meanwhile)
DUMPING = threading.Event()
BUFFER_ENTRIES = 2000  # collectives kept per process: a few steps of the largest model here
FR_PREFIX = "fr_rank"


def enable() -> None:
    """Turn the recorder on for this process, unless the user chose a size (0: off). Must run
    before the first process group is created: the recorder reads it once."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(BUFFER_ENTRIES))


def job_id() -> str:
    """What tells one job's dumps from another's in a folder: torchrun's run id, else the
    rendezvous address."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return run
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def group_config() -> dict[str, dict[str, str]]:
    """Every live process group as torch's dump format lists them: name -> name, description
    and global ranks (in group-rank order)."""
    from torch.distributed import distributed_c10d as c10d

    out = {}
    for pg, name in list(c10d._world.pg_names.items()):
        ranks = c10d._world.pg_group_ranks.get(pg, {})
        desc = getattr(pg, "group_desc", "undefined")
        out[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks, key=ranks.get))}
    return out


def record(since_ns: int = 0) -> dict:
    """This process's flight record, in torch's dump format, with the groups filled in; only
    the collectives issued from ``since_ns`` on (wall clock, as the recorder stamps them)."""
    raw = torch._C._distributed_c10d._dump_fr_trace(
        includeCollectives=True, includeStackTraces=True, onlyActive=False
    )
    rec = pickle.loads(raw)
    groups = group_config()
    rec["pg_config"] = groups
    rec["entries"] = [
        e
        for e in rec.get("entries", [])
        if e["process_group"][0] in groups and (e.get("time_created_ns") or 0) >= since_ns
    ]
    rec["job"] = job_id()
    return rec


# The file of torch's pipeline schedules, whose frames say where a schedule stood: the recorder
# keeps no gloo send or receive, so a pipeline's hang is read from these frames' locals.
_SCHEDULES = os.path.join("distributed", "pipelining", "schedules.py")
# A schedule frame's locals that say its micro-batch: 1F1B's counters, GPipe's loop index, the
# runtime's action (torch's notation: stage, F/B/W, micro-batch: "0F3").
_SCHEDULE_LOCALS = ("fwd_mb_index", "bwd_mb_index", "i", "action")


def _schedule_state(frame) -> dict | None:
    """A schedule frame's micro-batch count and position, as plain values; None elsewhere."""
    if not frame.f_code.co_filename.endswith(_SCHEDULES):
        return None
    local = frame.f_locals
    state = {k: local[k] for k in _SCHEDULE_LOCALS if isinstance(local.get(k), int)}
    if getattr(local.get("action"), "microbatch_index", None) is not None:
        state["action"] = str(local["action"])
    count = getattr(local.get("self"), "_n_microbatches", None)
    if isinstance(count, int):
        state["microbatches"] = count
    return state or None


def _frames(frames: list[tuple]) -> list[dict]:
    """(frame, line) pairs, outermost first, as the flight recorder lists frames: innermost
    first; a pipeline schedule's frame with its state (``_schedule_state``)."""
    out = []
    for f, line in reversed(frames):
        row = {"file": f.f_code.co_filename, "line": line, "name": f.f_code.co_name}
        state = _schedule_state(f)
        if state:
            row["schedule"] = state
        out.append(row)
    return out


def _stack(frame) -> list[tuple]:
    """(frame, line) from the outermost frame down to ``frame``."""
    frames = []
    while frame is not None:
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    return frames[::-1]


def _raised(tb) -> list[tuple]:
    """A traceback's (frame, line it raised through), outermost first."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def thread_stacks(skip: int | None = None) -> list[dict]:
    """Every thread's Python stack (but ``skip``'s: the watchdog's own)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    return [
        {
            "thread": names.get(ident, str(ident)),
            "main": ident == main,
            "frames": _frames(_stack(frame)),
        }
        for ident, frame in sys._current_frames().items()
        if ident != skip
    ]


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all (a hidden temporary file renamed into place: no reader takes a
    half-written dump); a full disk is one line on stderr, not a second failure of the rank
    whose point already failed."""
    try:
        write_bytes(path, data)
    except OutputError as e:
        with contextlib.suppress(OSError, ValueError):
            print(f"flight record not kept: {e}", file=sys.stderr, flush=True)


def dump(
    folder: Path,
    rank: int,
    *,
    reason: str,
    error: BaseException | str | None = None,
    threads: list[dict] | None = None,
    since_ns: int = 0,
    prefix: str = FR_PREFIX,
) -> dict:
    """Write this rank's flight record (from ``since_ns`` on), as ``<prefix><rank>``, and its
    stacks into ``folder``; return the record."""
    DUMPING.set()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        rec = record(since_ns)
        _write(folder / f"{prefix}{rank}", pickle.dumps(rec))
        write_stacks(folder, rank, reason=reason, error=error, threads=threads)
    finally:
        DUMPING.clear()
    return rec


def write_stacks(
    folder: Path,
    rank: int,
    *,
    reason: str,
    error: BaseException | str | None,
    threads: list[dict] | None = None,
) -> None:
    raised_at: list[dict] = []
    if isinstance(error, BaseException):
        raised_at = _frames(_raised(error.__traceback__))
        error = f"{type(error).__name__}: {error}"
    doc = {
        "rank": rank,
        "reason": reason,
        "error": error,
        "raised_at": raised_at,
        "time_ns": time.time_ns(),
        "job": job_id(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "threads": threads if threads is not None else thread_stacks(threading.get_ident()),
    }
    _write(folder / f"stacks_rank{rank}.json", json.dumps(doc, indent=1).encode())


def blocked_in_collective(rec: dict) -> bool:
    """Whether the record shows a collective issued and not finished (this rank waits in it)."""
    return any(
        s.get("last_enqueued_collective", -1) > s.get("last_completed_collective", -1)
        for s in rec.get("pg_status", {}).values()
    )


def default_store() -> dist.Store:
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def record_hangs() -> None:
    """For your own training script (README, "When a job hangs"): call it before
    ``init_process_group``. The recorder is turned on; when an exception ends a rank (a
    collective's timeout among them) it dumps its record and stacks next to
    ``TORCH_FR_DUMP_TEMP_FILE`` (``<prefix><rank>``, as NCCL's own dumps are named) and tells
    the other ranks through the job's store, whose watchdog threads dump theirs, the rank stuck
    in its own code too. ``python -m bench.hang DIR`` then reads the folder."""
    enable()
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "/tmp/nccl_trace_rank_")
    folder, name = Path(prefix).parent, Path(prefix).name
    key = f"bench.hang/{job_id()}"
    done = threading.Event()

    def dump_once(reason: str, error) -> None:
        if done.is_set() or not dist.is_initialized():
            return
        done.set()
        dump(folder, dist.get_rank(), reason=reason, error=error, prefix=name)

    def on_exception(kind, value, tb) -> None:
        # no store: this rank's dump is still worth writing
        with contextlib.suppress(Exception):
            default_store().add(f"{key}/failures", 1)
        dump_once("error", value)
        previous(kind, value, tb)

    def watch() -> None:
        while not done.wait(0.5):
            try:
                if dist.is_initialized() and default_store().check([f"{key}/failures"]):
                    dump_once("watchdog", "dumped by the watchdog: another rank failed")
            except Exception:  # noqa: BLE001  (the job is ending: nothing left to watch)
                return

    def leave() -> None:
        # out of the store before the interpreter ends: a daemon thread that comes back from a
        # store call then is ended by ``pthread_exit``, which aborts the rank (launcher.stop)
        done.set()
        watcher.join(timeout=10)

    previous = sys.excepthook
    sys.excepthook = on_exception
    watcher = threading.Thread(target=watch, name="bench-hang-watchdog", daemon=True)
    watcher.start()
    atexit.register(leave)
