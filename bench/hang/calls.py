"""The dumps as one table: a row per collective each rank issued, with the source line that
issued it; and how a rank's stacks say where it is."""

from __future__ import annotations

import linecache
import os
import re

import pandas as pd

from bench.hang.dumps import Dumps, seq_id
from parallel_kernels.facts import POINT_TO_POINT, ROOT_ONLY_INPUT, TORCH_DTYPE, op_name

# A frame of torch itself (its distributed package, autograd, nn): the line that matters is
# the first one outside it, the user's or the suite's.
_TORCH_FRAME = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]torch[/\\]|[/\\]torch[/\\](?:distributed|nn|autograd|_tensor)"
)
_TORCH_DIST_FRAME = re.compile(r"[/\\]torch[/\\]distributed[/\\]")

# Errors that only say a peer stopped answering: the cause is elsewhere.
_COMM_FAILURES = (
    "timed out",
    "connection closed",
    "connection reset",
    "read error",
    "broken pipe",
    "interrupted by the watchdog",
    "dumped by the watchdog",
    "communicator was aborted",
)


def comm_failure(message: str | None) -> bool:
    """Whether an error only says that a peer stopped answering (a timeout, a closed
    connection, the watchdog): the rank that failed first, or never arrived, is the cause."""
    low = str(message or "").lower()
    return any(s in low for s in _COMM_FAILURES)


def frame(f: dict) -> dict:
    """A frame as the suite's stacks give it (torch's dumps say ``filename``)."""
    return {
        "file": str(f.get("file", f.get("filename", "?"))),
        "line": int(f.get("line", 0)),
        "name": str(f.get("name", "?")),
    }


def own_frame(frames: list[dict]) -> dict | None:
    """The innermost frame outside torch (frames are innermost first)."""
    for f in map(frame, frames or []):
        if not _TORCH_FRAME.search(f["file"]) and not f["file"].startswith("<"):
            return f
    return None


UNKNOWN_SITE = "?"  # a call whose dump holds no stack (torch's JSON dumps hold none)


def site(frame: dict | None) -> str:
    """``file.py:42``, the way a user finds the line."""
    if not frame:
        return UNKNOWN_SITE
    return f"{os.path.basename(str(frame['file']))}:{frame['line']}"


def code(frame: dict | None) -> str:
    """The source text of the frame's line, where this machine has the file."""
    if not frame:
        return ""
    text = linecache.getline(str(frame["file"]), int(frame["line"])).strip()
    return text.split("  # ")[0]  # the code, not its comment


def _op(e: dict) -> str:
    """The entry's op by its one name (``parallel_kernels.facts.op_name``): ``gloo:all_reduce``
    -> all_reduce; ``nccl:send 0->1`` -> send; ``nccl:_allgather_base`` -> all_gather."""
    return op_name(str(e.get("profiling_name", "?")).split(" ")[0])


def has_stacks(entry: dict) -> bool:
    """Whether the entry says which Python lines issued it (torch's JSON dumps never do)."""
    return bool(entry.get("frames"))


def calls(d: Dumps) -> pd.DataFrame:
    """One row per collective a rank issued (point-to-point calls are left out: they are
    numbered apart and matched by peer, not by group)."""
    rows = []
    for rank, dump in d.ranks.items():
        for e in dump.record["entries"]:
            op = _op(e)
            if e.get("is_p2p", op in POINT_TO_POINT):  # older dumps have no is_p2p
                continue
            frame = own_frame(e.get("frames") or [])
            side = "output" if op in ROOT_ONLY_INPUT else "input"
            shapes = tuple(tuple(s) for s in e.get(f"{side}_sizes") or [])
            dtypes = tuple(TORCH_DTYPE.get(t, t) for t in e.get(f"{side}_dtypes") or [])
            numel = sum(int(pd.Series(s).prod()) if s else 1 for s in shapes)
            rows.append(
                {
                    "rank": rank,
                    "record": int(e.get("record_id") or 0),
                    "group": str(e["process_group"][0]),
                    "seq": int(seq_id(e)),
                    "op": op,
                    "shapes": shapes,
                    "dtypes": dtypes,
                    "numel": numel,
                    "done": bool(e.get("retired", False)),
                    "time_ns": e.get("time_created_ns") or 0,
                    "site": site(frame),
                    "frame": frame,
                }
            )
    cols = [
        "rank",
        "record",
        "group",
        "seq",
        "op",
        "shapes",
        "dtypes",
        "numel",
        "done",
        "time_ns",
        "site",
        "frame",
    ]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values(["group", "rank", "seq"]).reset_index(drop=True)


def main_thread_frames(stacks: dict | None) -> list[dict]:
    if not stacks:
        return []
    main = [t for t in stacks.get("threads", []) if t.get("main")]
    return main[0]["frames"] if main else []


def in_collective(stacks: dict | None) -> bool:
    """Whether the rank's main thread stood in ``torch.distributed`` when it dumped."""
    frames = main_thread_frames(stacks)
    return bool(frames) and any(_TORCH_DIST_FRAME.search(frame(f)["file"]) for f in frames[:3])


# torch's point-to-point calls, and its pipeline schedules' helpers around them: a rank whose
# stack stands in one of these is in a send or a receive (the recorder keeps none of gloo's)
_P2P_FRAME = re.compile(
    r"^(?:send|recv|isend|irecv|batch_isend_irecv|_batch_p2p|_sorted_batch_p2p|_wait_batch_p2p"
    r"|send_object_list|recv_object_list)$"
)
# gloo's timeout of one: it names which, but a collective's timeout says "recv" too (gloo's
# collectives are sends and receives between pairs), so only a frame says a rank is in one
_P2P_ERROR = re.compile(r"for (send|recv) operation")


def point_to_point(stacks: dict | None) -> dict | None:
    """Where a rank stood in a send or a receive when it dumped or failed, else None: ``op``
    (send, recv, or None where a batch holds both), ``site`` (the line outside torch that ran
    it) and ``torch_site`` (torch's line, a schedule's). Read from the error's traceback, else
    the main thread's stack: a frame of one of ``_P2P_FRAME``'s functions says it."""
    if not stacks:
        return None
    said = _P2P_ERROR.search(str(stacks.get("error") or ""))
    frames = [frame(f) for f in stacks.get("raised_at") or []]  # innermost first
    frames = frames or [frame(f) for f in main_thread_frames(stacks)]
    inner = next((f for f in frames if _P2P_FRAME.match(f["name"])), None)
    if inner is None:
        return None
    mine = own_frame(frames)
    # torch's line that called the send or receive helper: a schedule's, where it is one
    after = frames[frames.index(inner) + 1 :]
    torch_line = next((f for f in after if _TORCH_DIST_FRAME.search(f["file"])), None)
    op = said.group(1) if said else None
    if op is None and inner["name"] in ("send", "isend", "recv", "irecv"):
        op = inner["name"].lstrip("i")
    raw = stacks.get("raised_at") or main_thread_frames(stacks)
    state = next(
        (f["schedule"] for f in raw if isinstance(f, dict) and isinstance(f.get("schedule"), dict)),
        None,
    )
    return {
        "op": op,
        "site": site(mine),
        "torch_site": site(torch_line),
        "schedule": schedule_position(state),
    }


def schedule_position(state: dict | None) -> str | None:
    """Where a pipeline schedule stood, in words, from the state the suite's stacks keep of
    torch's schedule frame (bench/runner/faults/flight.py): its micro-batch count and its
    position (1F1B's forward and backward counts, GPipe's micro-batch, a runtime's action in
    torch's notation, stage F/B/W micro-batch); None without one."""
    if not state:
        return None

    def number(key: str) -> int | None:
        v = state.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    fwd, bwd, i, count = (number(k) for k in ("fwd_mb_index", "bwd_mb_index", "i", "microbatches"))
    if isinstance(state.get("action"), str):
        where = f"at action {state['action'][:40]}"
    elif fwd is not None and bwd is not None:
        where = f"{fwd} forward{'s' * (fwd != 1)} and {bwd} backward{'s' * (bwd != 1)} done"
    elif i is not None:
        where = f"at micro-batch {i}"
    else:
        where = None
    parts = [f"{count} micro-batches" if count is not None else None, where]
    return ", ".join(p for p in parts if p) or None
