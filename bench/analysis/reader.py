"""Read a Kineto trace into compact columns, in bounded memory and fast.

``json.load`` of a trace builds a dict per event with every argument (hundreds of bytes each,
several GB for a 1 GB file), and picking fields out of those dicts costs more than parsing.
Here msgspec decodes events straight into small typed structs holding only the fields the
analysis reads (unknown keys are skipped in C), and those are appended to typed arrays, strings
interned as category codes.

Files are read in chunks: the top-level object is walked with the standard library's scanner,
and the events array is cut at event boundaries into batches decoded in one call each, then
dropped, so memory stays at about 60 bytes per kept event plus one chunk. Kineto writes each
event of ``traceEvents`` at an indentation of two spaces, so ``"\\n  },"`` ends an event (a
newline cannot occur inside a JSON string). Text laid out otherwise is decoded whole up to
``WHOLE_LIMIT`` characters, and beyond that event by event.

Collective calls' host events also keep what the call was (the ``comm_*`` columns, for
sequence.py): gathered sparsely, a few per thousand events, spread into columns at the end.
The ops that issue them (``c10d::allreduce_``) keep their first two arguments' element counts
there (``comm_count``, ``comm_out_count``), and no name, type or group.
"""

from __future__ import annotations

import gzip
import json
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from bench.analysis.trace_events import (
    Args,
    Event,
    argument_elements,
    call_facts,
    num,
    payload_bytes,
    shape_key,
)

CHUNK = 1 << 18  # characters read and decoded at a time (small batches stay in cache)
WHOLE_LIMIT = 64 << 20  # text not laid out as Kineto's is decoded whole up to this size
_WS = re.compile(r"[ \t\n\r]*")
# What may stand between a parse failure and the end of the text when the text only ran out:
# the start of a token (``tru``, ``1.``, ``\\u12``), then whitespace.
_TOKEN_START = re.compile(r"[\w.+\-\\]*\s*")
_DECODER = json.JSONDecoder()
_EVENT_END = "\n  },"

COMM_NAME = re.compile(r"^(?:nccl|gloo:|hccl)|ncclKernel|ncclDevKernel|^record_param_comms$")
# Events whose input sizes are kept in ``nbytes``: collectives, and gradient accumulation (the
# bytes of each gradient as backward produces it, which the cost model buckets).
SIZED_NAME = re.compile(COMM_NAME.pattern + r"|^torch::autograd::AccumulateGrad$")
# A collective call's host events, whose arguments say what it was (its kernels say nothing).
COMM_CALL_NAME = re.compile(r"^(?:nccl:|gloo:)|^record_param_comms$")
# The ops that issue a collective on the caller's thread (c10d's dispatcher namespaces): their
# arguments' sizes let sequence.py put gloo's spans, which gloo's threads may start out of order,
# back in the order they were issued.
ISSUE_NAME = re.compile(r"^_?c10d\w*::")
# What an event name keeps (bit flags): its input bytes in ``nbytes``; a row in the call table
_BYTES, _CALL, _ISSUE = 1, 2, 4


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file."""


_NO_ARGS = Args()
_DOC_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])


def _int_or(v, missing: int = -1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else missing


@dataclass
class _Columns:
    """Typed, append-only columns of the events kept."""

    strings: dict = field(default_factory=dict)  # value (str, or int ids) -> code
    name: array = field(default_factory=lambda: array("i"))
    cat: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    pid: array = field(default_factory=lambda: array("i"))
    tid: array = field(default_factory=lambda: array("i"))
    nbytes: array = field(default_factory=lambda: array("d"))
    correlation: array = field(default_factory=lambda: array("q"))
    stream: array = field(default_factory=lambda: array("q"))
    seq: array = field(default_factory=lambda: array("q"))  # autograd sequence number, -1: none
    shape: array = field(default_factory=lambda: array("i"))  # code of shape_key, -1: none
    shapes: dict = field(default_factory=lambda: {None: -1})  # shape_key -> code
    mem_ts: array = field(default_factory=lambda: array("d"))
    mem_total: array = field(default_factory=lambda: array("d"))
    mem_bytes: array = field(default_factory=lambda: array("d"))
    # collective calls (COMM_CALL_NAME, a few per thousand events): (row, count, out count,
    # codes of name, dtype, group), spread into columns by frames()
    comm: list = field(default_factory=list)
    sized_names: dict = field(default_factory=dict)  # name -> 0, 1 (keep its bytes), 2 (comm)
    count: int = 0

    def codes(self, values: list) -> list[int]:
        table = self.strings
        for v in dict.fromkeys(values).keys() - table.keys():
            table[v] = len(table)
        return [table[v] for v in values]

    def add(self, batch: list[Event]) -> None:
        """Append a decoded batch, one list comprehension per column (a per-event Python loop
        would cost more than decoding)."""
        self.count += len(batch)
        xs = [e for e in batch if e.ph == "X"]
        mem = [e for e in batch if e.ph == "i" and e.name == "[memory]" and e.args is not None]
        if mem:
            self.mem_ts.extend([float(e.ts or 0.0) for e in mem])
            self.mem_total.extend([num(e.args.total_allocated) for e in mem])
            self.mem_bytes.extend([num(e.args.nbytes) for e in mem])
        if not xs:
            return
        names = [e.name if isinstance(e.name, str) else str(e.name) for e in xs]
        self.name.extend(self.codes(names))
        self.cat.extend(self.codes([e.cat or "" for e in xs]))
        self.pid.extend(self.codes([e.pid for e in xs]))
        self.tid.extend(self.codes([e.tid for e in xs]))
        self.ts.extend([e.ts or 0.0 for e in xs])
        self.dur.extend([e.dur or 0.0 for e in xs])
        args = [e.args or _NO_ARGS for e in xs]
        sized = self.sized_names
        distinct = set(names)
        for n in distinct - sized.keys():
            if COMM_CALL_NAME.search(n):
                sized[n] = _BYTES | _CALL
            elif ISSUE_NAME.search(n):
                sized[n] = _ISSUE
            else:
                sized[n] = _BYTES if SIZED_NAME.search(n) else 0
        self.nbytes.extend(
            [
                payload_bytes(a) if sized[n] & _BYTES else np.nan
                for n, a in zip(names, args, strict=True)
            ]
        )
        if any(sized[n] & (_CALL | _ISSUE) for n in distinct):  # most batches hold no call
            hits = [i for i, n in enumerate(names) if sized[n] & (_CALL | _ISSUE)]
            facts = [
                call_facts(args[i]) if sized[names[i]] & _CALL else argument_elements(args[i])
                for i in hits
            ]
            self._add_comm(facts, len(self.name) - len(xs), hits)
        self.correlation.extend([_int_or(a.correlation) for a in args])
        self.stream.extend([_int_or(a.stream) for a in args])
        self.seq.extend([_int_or(a.seq) for a in args])
        keys = [shape_key(a) for a in args]
        table = self.shapes
        for k in set(keys) - table.keys():
            table[k] = len(table) - 1
        self.shape.extend([table[k] for k in keys])

    def _add_comm(self, facts: list[tuple], first_row: int, hits: list[int]) -> None:
        count, out, *texts = zip(*facts, strict=True)
        codes = [
            [-1 if v is None else c for v, c in zip(vs, self.codes(list(vs)), strict=True)]
            for vs in texts
        ]
        self.comm.extend(zip([first_row + i for i in hits], count, out, *codes, strict=True))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        labels = np.array([str(v) for v in self.strings], dtype=object)

        def num(a: array, dtype) -> np.ndarray:
            return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype)

        comm = list(zip(*self.comm, strict=True)) or [()] * 6
        rows = np.array(comm[0], dtype=np.int64)

        def spread(values, missing, dtype) -> np.ndarray:
            out = np.full(len(self.name), missing, dtype=dtype)
            out[rows] = values
            return out

        def cat_col(codes, sparse: bool = False) -> pd.Categorical:  # sparse: codes of rows only
            codes_np = np.array(codes, dtype=np.int32) if sparse else num(codes, np.int32)
            used = np.unique(codes_np[codes_np >= 0] if sparse else codes_np)
            remap = np.full(len(labels) + 1, -1, dtype=np.int32)  # the last: -1 stays missing
            remap[used] = np.arange(len(used), dtype=np.int32)
            codes_np = spread(remap[codes_np], -1, np.int32) if sparse else remap[codes_np]
            return pd.Categorical.from_codes(codes_np, categories=labels[used])

        events = pd.DataFrame(
            {
                "name": cat_col(self.name),
                "cat": cat_col(self.cat),
                "ts": num(self.ts, np.float64),
                "dur": num(self.dur, np.float64),
                "pid": cat_col(self.pid),
                "tid": cat_col(self.tid),
                "nbytes": num(self.nbytes, np.float64),
                "correlation": num(self.correlation, np.int64),
                "stream": num(self.stream, np.int64),
                "seq": num(self.seq, np.int64),
                "shapes": pd.Categorical.from_codes(
                    num(self.shape, np.int32),
                    categories=[k.decode() for k in self.shapes if k is not None],
                ),
                "comm_count": spread(comm[1], np.nan, np.float64),
                "comm_out_count": spread(comm[2], np.nan, np.float64),
                "comm_name": cat_col(comm[3], sparse=True),
                "comm_dtype": cat_col(comm[4], sparse=True),
                "comm_group": cat_col(comm[5], sparse=True),
            }
        )
        memory = pd.DataFrame(
            {
                "ts": num(self.mem_ts, np.float64),
                "total_allocated": num(self.mem_total, np.float64),
                "bytes": num(self.mem_bytes, np.float64),
            }
        )
        return events, memory


def read_trace(path: str | Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(metadata, complete events, memory events) of one trace file (plain or gzip).

    Complete events (``ph == "X"``) keep name, cat, ts, dur, pid, tid, the payload bytes of
    communication events, the correlation id, the stream, the autograd sequence number
    (``seq``) and, where record_shapes recorded them, the op's signature (``shapes``: its
    input shapes, types and concrete values as JSON text, a category per distinct signature);
    memory events (``[memory]`` instants) keep ts, total allocated and bytes.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            s = _Stream(f, path)
            s.fill()
            # Kineto's layout streams in batches (one decode per chunk, the fastest way too);
            # other layouts are decoded whole when they fit in a chunk.
            if _EVENT_END not in s.buf:
                while not s.eof and len(s.buf) < WHOLE_LIMIT:
                    s.fill()
                if s.eof:
                    result = _read_whole(s.buf, path)
                    if result is not None:
                        return result
            return _read_streaming(s, path)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable trace ({type(e).__name__}: {e})") from None


def _read_whole(data: str, path: Path):
    """Decode a whole file; None if it is not valid JSON (the streaming reader then says
    precisely where it breaks)."""
    try:
        doc = _DOC_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if "traceEvents" not in doc:
        raise TraceError(f"{path}: no traceEvents (not a Kineto trace)")
    cols = _Columns()
    try:
        cols.add(_EVENTS_DECODER.decode(doc.pop("traceEvents")))
    except msgspec.ValidationError as e:
        raise TraceError(f"{path}: traceEvents is not a list of events ({e})") from None
    meta = {k: msgspec.json.decode(v) for k, v in doc.items()}
    return (meta, *cols.frames())


def _runs_out(text: str, e: json.JSONDecodeError) -> bool:
    """Whether ``text`` fails to parse only because it ends: more text could complete it (an
    open string, a token cut short, nothing at all where a value or delimiter is due). Anything
    else after the failure point is a fault in the text itself."""
    return e.msg.startswith("Unterminated string") or bool(_TOKEN_START.fullmatch(text, e.pos))


class _Stream:
    def __init__(self, f, path: Path) -> None:
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = "", 0, False
        # bytes (UTF-8) and lines of the text read before ``buf``: where a fault is in the file
        self.done_bytes, self.done_lines = 0, 0

    def fill(self) -> None:
        data = self.f.read(CHUNK)
        self.eof = len(data) < CHUNK  # text reads return less only at the end
        done = self.buf[: self.pos]
        self.done_bytes += len(done.encode("utf-8"))
        self.done_lines += done.count("\n")
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self.fill()

    def expect(self, ch: str, where: str) -> None:
        got = self.peek()
        if got == "":
            raise TraceError(f"{self.path}: truncated (the text ends where {ch!r} is due {where})")
        if got != ch:
            raise TraceError(f"{self.path}: expected {ch!r} {where}, found {got!r}")
        self.pos += 1

    def value(self, events: int | None = None):
        """The next JSON value. Text that fails to parse is read on while it only ran out (the
        value may end in the next chunk); at the end of the file that is a truncated trace, and
        anything else is invalid JSON, reported with where it is. ``events``: the events of
        traceEvents read before this one, when it is one."""
        self.peek()  # raw_decode does not skip leading whitespace
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if not _runs_out(self.buf, e):
                    raise TraceError(self.invalid(e, events)) from None
                if self.eof:
                    inside = "a value" if events is None else f"event {events + 1}"
                    after = "" if events is None else f" after {events} events"
                    raise TraceError(
                        f"{self.path}: truncated{after} (the text ends inside {inside})"
                    ) from None
                self.fill()
                continue
            if end == len(self.buf) and not self.eof:  # a number may continue in the next chunk
                self.fill()
                continue
            self.pos = end
            return obj

    def invalid(self, e: json.JSONDecodeError, events: int | None) -> str:
        """What is wrong at ``e.pos`` and where: the byte and line in the file (of its text,
        for a gzip file), the event, the parser's complaint, and the line it is on. A string
        followed on its line by what cannot follow one most likely holds a quote unescaped:
        torch's profiler writes ``record_function`` names into its JSON as given."""
        buf, at = self.buf, e.pos
        byte = self.done_bytes + len(buf[:at].encode("utf-8"))
        line = self.done_lines + buf.count("\n", 0, at) + 1
        event = "" if events is None else f", event {events + 1} of traceEvents"
        start = buf.rfind("\n", 0, at) + 1
        stop = buf.find("\n", at)
        text = buf[start : stop if stop >= 0 else len(buf)]
        column = at - start
        excerpt = text[max(0, column - 60) : column + 60].strip()
        hint = ""
        if buf[start:at].rstrip(" \t").endswith('"') and "delimiter" in e.msg:
            hint = (
                " just after a string: an unescaped quote in it? (torch's profiler writes "
                "names as given)"
            )
        return (
            f"{self.path}: invalid JSON at byte {byte} (line {line}{event}): {e.msg}{hint} "
            f"near {excerpt!r}"
        )


def _read_streaming(s: _Stream, path: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    cols = _Columns()
    meta: dict = {}
    has_events = False
    s.expect("{", "at the start of the trace")
    while s.peek() != "}":
        if s.peek() == "":
            raise TraceError(f"{path}: truncated (the trace object is not closed)")
        key = s.value()
        s.expect(":", f"after key {key!r}")
        if key == "traceEvents":
            has_events = True
            _read_events(s, cols, path)
        else:
            meta[key] = s.value()
        if s.peek() == ",":
            s.pos += 1
    if not has_events:
        raise TraceError(f"{path}: no traceEvents (not a Kineto trace)")
    return (meta, *cols.frames())


def _read_events(s: _Stream, cols: _Columns, path: Path) -> None:
    s.expect("[", "at the start of traceEvents")
    kineto_layout = True  # until a batch cut at "\n  }," fails to decode
    while True:
        if len(s.buf) - s.pos < CHUNK // 2 and not s.eof:
            s.fill()
        ch = s.peek()
        if ch == "]":
            s.pos += 1
            return
        if ch == "":
            raise TraceError(f"{path}: truncated after {cols.count} events")
        cut = s.buf.rfind(_EVENT_END, s.pos) if kineto_layout else -1
        if cut > s.pos:
            try:
                cols.add(_EVENTS_DECODER.decode("[" + s.buf[s.pos : cut + 4] + "]"))
                s.pos = cut + 5  # past "}" and ","
                continue
            except (msgspec.DecodeError, msgspec.ValidationError):
                kineto_layout = False  # laid out otherwise: one event at a time from here
        pending = []
        while len(pending) < 4096 and s.peek() not in ("]", ""):
            event = s.value(events=cols.count + len(pending))
            if s.peek() == ",":
                s.pos += 1
            if isinstance(event, dict):
                pending.append(event)
            else:
                cols.count += 1  # not an event object: counted, not kept
        try:  # through JSON text again: the signature fields are kept as raw JSON
            cols.add(_EVENTS_DECODER.decode(msgspec.json.encode(pending)))
        except msgspec.ValidationError as e:
            raise TraceError(f"{path}: an event has fields of the wrong type ({e})") from None
