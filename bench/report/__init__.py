"""Run folder -> self-contained HTML (page, figures, tables, comparison, the model's section).
It reads the run folder only (``bench.runfolder``), never the side that runs sweeps."""
