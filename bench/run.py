"""Entry point: ``torchrun --standalone --nproc_per_node=N bench/run.py --sweep bucket_cap_mb``.

Parse, build the sweep, run it, write results, report; see ``bench/runner/cli.py``.
"""

import faulthandler
import os
import signal
import sys
from pathlib import Path

# torchrun runs this file as a script: make the repository importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runner.cli import main

if __name__ == "__main__":
    # A rank that crashes in native code (a segfault or an abort in a backend) prints its
    # Python stack on stderr before it dies, so the launcher's "killed by SIGSEGV" says where.
    # Its own copy of stderr: the profiler's window sends stderr itself to a temporary file
    # (bench/runner/measure/quiet.py), and a crash there must still reach the console.
    faulthandler.enable(file=os.fdopen(os.dup(sys.stderr.fileno()), "w"))
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before the ranks' own handlers were set (start-up)
        print("interrupted (SIGINT) before the sweep began", file=sys.stderr)
        code = 128 + signal.SIGINT
    # Every result is on disk (each row fsync'd, meta.json replaced atomically) and every process
    # group destroyed: leave without running native static destructors, where a backend thread
    # still joinable can abort the process ("terminate called without an active exception"),
    # turning a finished sweep into a failed rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
