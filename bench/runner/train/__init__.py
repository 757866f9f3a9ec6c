"""The training sweep: its schedule and loop, one point's lifecycle (``lifecycle.py``), the
step, the data, and the check of each point against the plain model."""
