"""Plan before you run (``python -m bench.plan``): every configuration of a model at the scale
it will run, memory per rank tracked under fake tensors with torch's own tools, step time from
the cost model's schedules over the target's links, ranked; the best verified here.

- ``space.py``: the configurations, each the point record ``bench/run.py`` would resolve, and
  its command;
- ``memory.py``: one step tracked under ``FakeTensorMode`` over the fake process group with
  ``MemTracker`` (and ``FlopCounterMode``), blocks extrapolated; ``fakes.py``: that fake world
  (the wrappers' shims, a backend's copies of a collective's buffers, the tracker);
  ``workspace.py``: what kernels allocate inside themselves, measured here for a ``cpu`` plan;
- ``calibrate.py``: the computation's rate from profiled steps of the model;
- ``timing.py``: the step on the target's links (``bench.model``'s schedules);
- ``planner.py``: the rows, sharing what tracking costs, worlds extrapolated; ``table.py``: the
  console and ``plan.json``; ``verify.py``: ``--verify K``;
- ``inputs.py``, ``devices.py``: the command line, checked before any work, and the devices;
  ``launch.py``: ``bench/run.py`` launched here (several commands' points interleaved in one
  launch), and a row's configuration in words.

Not to be confused with ``bench.runner.configure``, which turns one sweep into its points.
"""
