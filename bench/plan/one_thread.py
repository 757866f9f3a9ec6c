"""The planner's process on one thread, set before torch loads (``bench/plan/__main__.py``
imports this first): it computes nothing a thread pool would speed (fake tensors, no
weights), and a process with more than one thread spawns its tracking workers afresh
(``planner._start_method``: a fork copies a lock another thread may hold), each importing
torch and the models again, where one thread forks them. Without it, loading torch and
numpy started OpenMP's and OpenBLAS's pools (three threads) and the planner always spawned:
planning llama:1b at 1024 ranks took 53.1 and 53.6 s against 49.4 and 48.4 s forked, run
alternately (2026-12-05), the workers' start 3 s and their end 1.8 s of it. A user's own
``OMP_NUM_THREADS`` is kept (OpenBLAS reads it too), as ``bench/run.py`` keeps it for its
ranks."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
