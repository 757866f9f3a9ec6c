"""Regenerate the dumps beside this file: ``python tests/data/hang/make_dumps.py [SCENARIO...]``.

Each scenario of ``user_script.py`` runs as two processes (ranks 0 and 1, gloo, a free port on
127.0.0.1, ``OMP_NUM_THREADS=1``), each bounded by a timeout, with the recorder's two variables;
the pickles land in ``<scenario>/pickle/`` and the same records as JSON in ``<scenario>/json/``.
They are kept byte for byte as torch wrote them (its frames name this machine's paths; the
diagnosis names a line by its file's base name).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCRIPT = HERE / "user_script.py"
SCENARIOS = (
    "after_loop",
    "in_loop",
    "sizes",
    "aborted",
    "order",
    "gone",
    "raises",
    "uneven",
    "groups",
    "p2p",
    "none",
)
RANK_TIMEOUT_S = 60  # a rank that outlives this is killed (its collective timeout is 2 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, out: Path, timeout_s: float = 2.0) -> list[subprocess.CompletedProcess]:
    """Run the scenario's two ranks; their dumps in ``out/pickle`` and ``out/json``."""
    (out / "pickle").mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(out / "pickle" / "fr_rank"),
        "FR_JSON_DUMP_PREFIX": str(out / "json" / "fr_rank"),
        "SCRIPT_TIMEOUT_S": str(timeout_s),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), scenario],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    done = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=RANK_TIMEOUT_S)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    finally:
        for p in procs:  # a rank still running past its bound: end it, leave no orphan
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def keep(out: Path, dest: Path) -> None:
    """Copy the dumps to ``dest`` byte for byte, as torch wrote them."""
    for form in ("pickle", "json"):
        (dest / form).mkdir(parents=True, exist_ok=True)
        for path in sorted((out / form).iterdir()):
            shutil.copyfile(path, dest / form / path.name)


def main(argv: list[str]) -> int:
    for scenario in argv or SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            ranks = launch(scenario, Path(tmp))
            dest = HERE / scenario
            shutil.rmtree(dest, ignore_errors=True)
            keep(Path(tmp), dest)
        said = "; ".join(
            p.stdout.strip().splitlines()[-1]
            if p.stdout.strip()
            else f"rank {r}: exit {p.returncode}"
            for r, p in enumerate(ranks)
        )
        print(f"{scenario}: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
