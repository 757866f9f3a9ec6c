"""Entry point: ``torchrun --standalone --nproc_per_node=N bench/run.py --sweep bucket_cap_mb``.

Parse, build the sweep, run it, write results, report; see ``bench/cli.py``.
"""

import sys
from pathlib import Path

# torchrun runs this file as a script: make the repository importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runner.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
