"""One point's traces as an interactive timeline in a single HTML file that needs no network:
every rank's threads (and, on GPU traces, its streams) as lanes, each event a bar at its depth,
zoom with the wheel, pan by dragging, an event's name, duration and kind on hover, and a search
that highlights matching names. For machines without internet, where TensorBoard's profiler
views and Perfetto's web UI do not load (docs/tensorboard.md).

``python -m bench.report RUN --view POINT`` writes ``reports/<run>-<point>-trace.html``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis.trace import Trace, nesting_depth, prepared
from bench.report.style import CSS

KINDS = ["compute", "comm", "comm_cpu", "memory", "none"]


def view_data(traces: list[Trace]) -> dict:
    """The viewer's data: lanes (rank, thread or stream) and events in columns, microseconds
    from the earliest event of all ranks."""
    lanes, cols = [], {"lane": [], "depth": [], "start": [], "dur": [], "name": [], "kind": []}
    names: dict[str, int] = {}
    origin = min(float(prepared(t)["ts"].min()) for t in traces)
    for t in sorted(traces, key=lambda t: t.rank):
        ev = prepared(t)
        ev = ev[ev["dur"] >= 0]
        stream = ev["stream"].to_numpy()
        key = np.where(
            stream >= 0,
            "stream " + stream.astype(str),
            "thread " + ev["tid"].astype(str).to_numpy(),
        )
        for what in pd.unique(key):
            lane = ev[key == what].sort_values(["ts", "dur"], ascending=[True, False])
            ts = lane["ts"].to_numpy(dtype=float)
            end = ts + lane["dur"].to_numpy(dtype=float)
            depth = nesting_depth(ts, end)
            lanes.append({"label": f"rank {t.rank} {what}", "depth": int(depth.max()) + 1})
            i = len(lanes) - 1
            cols["lane"] += [i] * len(lane)
            cols["depth"] += depth.tolist()
            cols["start"] += np.round(ts - origin, 1).tolist()
            cols["dur"] += np.round(end - ts, 1).tolist()
            cols["name"] += [names.setdefault(str(n), len(names)) for n in lane["name"]]
            cols["kind"] += [KINDS.index(k) if k in KINDS else 4 for k in lane["kind"]]
    return {"lanes": lanes, "names": list(names), "kinds": KINDS, **cols}


def script_safe(data: str) -> str:
    """JSON that no name inside it can end or comment out of its ``<script>`` element: every
    ``<``, ``>`` and ``&`` written as its JSON escape (``</script>``, ``<!--`` and ``<script``
    then never appear, and the parsed data is the same)."""
    return data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


SCRIPT = (Path(__file__).with_name("trace_view.js")).read_text()  # package data


def view_page(traces: list[Trace], title: str) -> str:
    data = script_safe(json.dumps(view_data(traces), separators=(",", ":")))
    return "\n".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{CSS}"
            "main{max-width:none} #tip{position:absolute;display:none;background:#ffd;"
            "border:1px solid #999;padding:2px 6px;font-size:12px;pointer-events:none}</style>"
            "</head><body><main>",
            f"<h1>{html.escape(title)}</h1>",
            "<p>Every rank's threads and streams, each event at its depth. Wheel: zoom at the "
            "pointer; drag: pan; hover: the event. Colours: computation, communication (kernels "
            "or gloo's spans), calls into the collective library, memory, other. "
            "<input id='find' placeholder='highlight names containing...'> "
            "<button id='reset'>whole trace</button> <span id='span'></span></p>",
            "<div><canvas id='tl'></canvas></div><div id='tip'></div>",
            f"<script type='application/json' id='data'>{data}</script>",
            f"<script>{SCRIPT}</script></main></body></html>",
        ]
    )
