"""The planner's process on one thread, set before torch loads (``bench/plan/__main__.py``
imports this first): it computes nothing a thread pool would speed (fake tensors, no
weights), and a process with more than one thread spawns its tracking workers afresh
(``tracking_workers._start_method``: a fork copies a lock another thread may hold), each importing
torch and the models again, where one thread forks them; loading torch and numpy would
otherwise start OpenMP's and OpenBLAS's pools (docs/benchmarks.md, "Planning time"). A user's
own ``OMP_NUM_THREADS`` is kept (OpenBLAS reads it too), as ``bench/run.py`` keeps it for its
ranks."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
