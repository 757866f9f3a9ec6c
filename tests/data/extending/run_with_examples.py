"""``bench/run.py`` with docs/extending.md's examples registered first, in every rank: what
tests/test_extending.py runs under torchrun. The page's ``<!-- example -->`` blocks are executed
as written, so the page and what the test proves cannot drift apart.

With ``EXTENDING_RECORD=DIR`` set, each rank also writes the keyword arguments
DistributedDataParallel received (``ddp_options.<rank>.json``), so the test can see the new
knob's value arrive where the row says it goes.
"""

import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

EXAMPLE = re.compile(r"<!-- example -->\n```python\n(.*?)```", re.S)


def register_examples() -> int:
    page = REPO / "docs" / "extending.md"
    blocks = EXAMPLE.findall(page.read_text())
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"__name__": "extending_example"})
    return len(blocks)


def record_ddp_options(folder: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from parallel_kernels import ddp

    class Recording(DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            rank = os.environ.get("RANK", "0")
            seen = {k: v for k, v in kwargs.items() if isinstance(v, bool | int | float | str)}
            path = folder / f"ddp_options.{rank}.json"
            calls = json.loads(path.read_text()) if path.exists() else []
            path.write_text(json.dumps([*calls, seen]))
            super().__init__(*args, **kwargs)

    ddp.DistributedDataParallel = Recording


if __name__ == "__main__":
    assert register_examples() == 2, "docs/extending.md should hold two runnable examples"
    if os.environ.get("EXTENDING_RECORD"):
        record_ddp_options(Path(os.environ["EXTENDING_RECORD"]))
    from bench.runner.cli import main

    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
