"""Plan before you run (``python -m bench.plan``): every configuration of a model at the scale
it will run, memory per rank tracked under fake tensors with torch's own tools, step time from
the cost model's schedules over the target's links, ranked; the best verified here.

A pipeline of stages, one module each, ``__main__.py`` calling them in order:

- ``request.py``: the command line parsed and checked, no work: a ``PlanRequest``;
- ``space.py``: the configurations, each the point record ``bench/run.py`` would resolve, and
  its command; ``families.py``: the families they come from (ddp, fsdp2, fsdp1, tp, pp), a row
  of facts each;
- ``calibration.py``: the ``Target``: the device's peaks, the links (``topology.py``), the
  computation's rates (``rates.py``: fitted to profiled steps), measured here for a plan of
  this machine; ``launch.py``: ``bench/run.py`` launched here, and a row in words;
- ``memory_stage.py``: every row's memory, in one pool: ``memory.py``: each configuration's
  peak per rank, one step tracked under ``FakeTensorMode`` with ``MemTracker``;
  ``trackings.py``: the fewest trackings that serve them all, and how they combine;
  ``tracked.py``: a tracking's figures; ``pipeline_memory.py``: a pipeline's ranks, composed over
  its schedule; ``pipeline_counts.py``: its stages' ops; ``tracking_workers.py``: the pool they run
  in; ``fakes.py``: the fake world; ``workspace.py``: what kernels allocate inside themselves;
- ``step_time.py``: each one's step on the target's links (``bench.model``'s schedules; a
  pipeline's simulated over its schedule, ``pipeline_time.py``);
- ``ranking.py``: plan.csv's rows, ranked;
- ``outputs.py``: plan.csv, plan.json, plan.html (``plan_page.py``) and the console
  (``table.py``);
- ``verification.py``: ``--verify K``, the best run here and measured against predicted.

``devices.py`` holds the devices a plan can target; ``one_thread.py`` keeps the process on one
thread. Not to be confused with ``bench.runner.configure``, which turns one sweep into its
points.
"""
