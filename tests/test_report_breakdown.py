"""The report's stacked step-breakdown bar adds up to the traced step window: on GPU traces the
memcpy/memset time outside computation and communication is a part of its own, not lost."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes

from bench.report import charts as figures

pytestmark = pytest.mark.unit


def test_the_stacked_bar_adds_up_to_the_step_window(monkeypatch):
    # a GPU point: 10 ms window = 5 compute + 1 exposed communication + 1.5 memcpy + 2.5 idle;
    # a CPU point: nothing but computation, communication and idle
    ok = pd.DataFrame(
        {
            "model": "mlp",
            "value": [1.0, 25.0],
            "impl": "native",
            "window_ms": [10.0, 8.0],
            "compute_ms": [5.0, 4.0],
            "overlap_ms": [2.0, 1.0],
            "exposed_comm_ms": [1.0, 2.0],
            "idle_ms": [2.5, 2.0],
        }
    )
    drawn: dict[str, np.ndarray] = {}
    barh = Axes.barh

    def record(self, y, width, *args, **kwargs):
        drawn[kwargs["label"]] = np.asarray(width, dtype=float)
        return barh(self, y, width, *args, **kwargs)

    monkeypatch.setattr(Axes, "barh", record)
    assert figures.breakdown_figure(ok).startswith("<figure>")
    assert sum(drawn.values()) == pytest.approx(ok["window_ms"].to_numpy())
    memory = [v for k, v in drawn.items() if "memcpy" in k]
    assert len(memory) == 1 and memory[0] == pytest.approx([1.5, 0.0])
