"""Predict before you measure: a cost model of a training step, fitted from this suite's runs.

- ``comm.py``: alpha-beta(-gamma) costs of the collectives, fitted by least squares to a
  ``--sweep message_size`` run, per backend, implementation and collective, with bootstrap
  intervals from the run's iterations.
- ``links.py``: documented link presets (NVLink, InfiniBand, Ethernet) for what-if questions.
- ``compute.py``: a step's computation read from a training run's traces: forward, backward with
  each gradient's ready time and size in the order backward produces them, and what follows
  backward (optimiser step).
- ``schedule.py``: one step simulated as two timelines, computation and a communication queue:
  DDP buckets, FSDP units, tensor-parallel all-reduces.
- ``predict.py``: a results row (strategy, options, world size) -> its simulated step.
- ``validate.py`` / ``whatif.py``: measured against predicted, and predictions at other scales.

Command line: ``python -m bench.model validate|whatif ...`` (``__main__.py``).
"""
