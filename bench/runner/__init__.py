"""How a point is measured: command line, sweep and knob tables, harness, timing, profiling.
It writes the run folder (``bench.runfolder``), the only thing the reading side sees."""
