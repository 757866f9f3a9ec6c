"""Replay a traced job's communication here, and price it elsewhere (``python -m bench.replay``).

Between both sides: it reads traces (``bench.analysis.sequence``) and prices with the cost
model's links and fits (``bench.model``), runs the collectives on the launched ranks
(``bench.runner``'s start-up, ``parallel_kernels.collectives``), and writes a run folder that
the report reads like any other. Nothing imports it.
"""
