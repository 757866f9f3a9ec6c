"""Stream a Kineto trace into compact columns, one event at a time.

``json.load`` of a trace builds a dict per event (hundreds of bytes each, several GB for a 1 GB
file). Here the top-level object is walked with the C JSON scanner (``raw_decode``) over a
rolling text buffer, each event is decoded, reduced to the few fields the analysis needs and
appended to typed arrays (strings interned as category codes), then dropped. Memory is about 50
bytes per kept event plus one read buffer, whatever the file size.
"""

from __future__ import annotations

import gzip
import json
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
CHUNK = 1 << 22

# Bytes per element for the dtype spellings of record_shapes ("Input type") and of
# record_param_comms ("dtype").
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Byte": 1, "Char": 1,
    "Short": 2, "Bool": 1,
}  # fmt: skip
COMM_NAME = re.compile(r"^(?:nccl|gloo:|hccl)|ncclKernel|ncclDevKernel|^record_param_comms$")


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file."""


class _Stream:
    def __init__(self, f, path: Path) -> None:
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = "", 0, False

    def _fill(self) -> None:
        data = self.f.read(CHUNK)
        self.eof = not data
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._fill()

    def expect(self, ch: str, where: str) -> None:
        got = self.peek()
        if got != ch:
            what = "end of file" if got == "" else repr(got)
            raise TraceError(f"{self.path}: expected {ch!r} {where}, found {what}")
        self.pos += 1

    def value(self):
        self.peek()  # raw_decode does not skip leading whitespace
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.eof:
                    raise TraceError(
                        f"{self.path}: invalid JSON ({e.msg} at char {e.pos})"
                    ) from None
                self._fill()
                continue
            if end == len(self.buf) and not self.eof:  # a number may continue in the next chunk
                self._fill()
                continue
            self.pos = end
            return obj


@dataclass
class _Columns:
    """Typed, append-only columns of the events kept."""

    strings: dict[str, int] = field(default_factory=dict)
    name: array = field(default_factory=lambda: array("i"))
    cat: array = field(default_factory=lambda: array("i"))
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    pid: array = field(default_factory=lambda: array("i"))
    tid: array = field(default_factory=lambda: array("i"))
    nbytes: array = field(default_factory=lambda: array("d"))
    correlation: array = field(default_factory=lambda: array("q"))
    stream: array = field(default_factory=lambda: array("q"))

    def code(self, s) -> int:
        s = str(s)
        c = self.strings.get(s)
        if c is None:
            c = self.strings[s] = len(self.strings)
        return c

    def frame(self) -> pd.DataFrame:
        labels = np.array(list(self.strings), dtype=object)

        def cat_col(codes: array) -> pd.Categorical:
            codes_np = np.frombuffer(codes, dtype=np.int32) if len(codes) else np.zeros(0, int)
            used = np.unique(codes_np)
            remap = np.full(len(labels), -1, dtype=np.int32)
            remap[used] = np.arange(len(used), dtype=np.int32)
            return pd.Categorical.from_codes(remap[codes_np], categories=labels[used])

        def num(a: array, dtype) -> np.ndarray:
            return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype)

        return pd.DataFrame({
            "name": cat_col(self.name), "cat": cat_col(self.cat),
            "ts": num(self.ts, np.float64), "dur": num(self.dur, np.float64),
            "pid": cat_col(self.pid), "tid": cat_col(self.tid),
            "nbytes": num(self.nbytes, np.float64),
            "correlation": num(self.correlation, np.int64),
            "stream": num(self.stream, np.int64),
        })  # fmt: skip


def payload_bytes(args: dict) -> float:
    """Bytes a collective moves: NCCL metadata (``In msg nelems`` x dtype), else the product of
    the input shapes x dtype (gloo spans, ``c10d::`` ops with ``record_shapes``)."""
    if "In msg nelems" in args:
        return float(args["In msg nelems"]) * DTYPE_BYTES.get(str(args.get("dtype")), np.nan)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types:
        return np.nan
    total = 0.0
    for d, t in zip(dims, types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            total += float(np.prod(d)) * DTYPE_BYTES.get(t, np.nan)
    return total


def read_trace(path: str | Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(metadata, complete events, memory events) of one trace file (plain or gzip).

    Complete events (``ph == "X"``) keep name, cat, ts, dur, pid, tid, the payload bytes of
    communication events, the correlation id and the stream; memory events (``[memory]``
    instants) keep ts, total allocated and bytes.
    """
    path = Path(path)
    cols = _Columns()
    mem = {"ts": array("d"), "total_allocated": array("d"), "bytes": array("d")}
    meta: dict = {}
    seen_events = False
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            s = _Stream(f, path)
            s.expect("{", "at the start of the trace")
            while s.peek() != "}":
                if s.peek() == "":
                    raise TraceError(f"{path}: truncated (the trace object is not closed)")
                key = s.value()
                s.expect(":", f"after key {key!r}")
                if key == "traceEvents":
                    seen_events = True
                    _read_events(s, cols, mem, path)
                else:
                    meta[key] = s.value()
                if s.peek() == ",":
                    s.pos += 1
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a readable trace ({type(e).__name__}: {e})") from None
    if not seen_events:
        raise TraceError(f"{path}: no traceEvents (not a Kineto trace)")
    memory = pd.DataFrame(
        {k: np.frombuffer(v, dtype=np.float64) if len(v) else np.zeros(0) for k, v in mem.items()}
    )
    return meta, cols.frame(), memory


def _read_events(s: _Stream, cols: _Columns, mem: dict, path: Path) -> None:
    s.expect("[", "at the start of traceEvents")
    n = 0
    while True:
        ch = s.peek()
        if ch == "]":
            s.pos += 1
            return
        if ch == "":
            raise TraceError(f"{path}: truncated after {n} events")
        e = s.value()
        n += 1
        if s.peek() == ",":
            s.pos += 1
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X":
            name = e.get("name", "")
            args = e.get("args") or {}
            cols.name.append(cols.code(name))
            cols.cat.append(cols.code(e.get("cat", "")))
            cols.ts.append(float(e.get("ts", 0.0)))
            cols.dur.append(float(e.get("dur", 0.0)))
            cols.pid.append(cols.code(e.get("pid", "")))
            cols.tid.append(cols.code(e.get("tid", "")))
            cols.nbytes.append(payload_bytes(args) if COMM_NAME.search(name) else np.nan)
            cols.correlation.append(int(args.get("correlation", -1) or -1))
            stream = args.get("stream", -1)
            cols.stream.append(stream if isinstance(stream, int) else -1)
        elif ph == "i" and e.get("name") == "[memory]":
            a = e.get("args") or {}
            mem["ts"].append(float(e.get("ts", 0.0)))
            mem["total_allocated"].append(float(a.get("Total Allocated", np.nan)))
            mem["bytes"].append(float(a.get("Bytes", np.nan)))
