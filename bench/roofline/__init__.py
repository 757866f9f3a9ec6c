"""A device's roofline as data: its peaks, its memory bandwidth and the efficiencies ops reach
(``profile.py``), measured on this host (``measure.py``, ``python -m bench.roofline``) or
stated for a datasheet GPU. The analysis explains a measured step with it (where MFU goes) and
the planner prices a planned one."""
