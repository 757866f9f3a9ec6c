"""``python -m bench.plan``: every configuration of a model at the scale it will run, memory and
step time predicted, ranked; the best verified here with ``--verify K``.

    python -m bench.plan --model llama:1b --world-size 64 --gpus-per-node 8 --device h100 \\
        --link nvlink4,ib_ndr --global-batch 512 [--family ddp,fsdp2,fsdp1,tp,pp] \\
        [--option precision=bf16] [--mfu 40 | --compute RUN] [--allowance-gib 2] [--out DIR]

The pipeline, one stage a module, each handing the next a typed value: the request
(``request.py``: the flags checked, a ``PlanRequest``), the space (``space.py``: the
configurations), the calibration (``calibration.py``: the ``Target``, measured here where the
plan is for this machine), the memory (``memory_stage.py``: each configuration's tracked figures),
the time (``step_time.py``: each one's step), the ranking (``ranking.py``: plan.csv's rows),
the outputs (``outputs.py``: plan.csv, plan.json, plan.html, the console) and, with
``--verify K``, the verification (``verification.py``). Bad input (an unknown model, device,
link, family or option; a world size the nodes cannot divide; a global batch no layout splits)
prints one line and exits 2 before any work.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime

import bench.plan.one_thread  # noqa: F401 - first: one thread before torch loads
from bench.plan import table
from bench.plan.calibration import calibrate
from bench.plan.memory_stage import predict_memory
from bench.plan.outputs import plan_json, write_plan, write_verification
from bench.plan.ranking import ranked_rows
from bench.plan.request import parse_request
from bench.plan.space import enumerate_space, why_empty
from bench.plan.step_time import step_times
from bench.runfolder.atomic import OutputError

DESCRIPTION = __doc__.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    try:
        request = parse_request(argv, DESCRIPTION)
        configs = enumerate_space(request)
        if not configs:
            raise ValueError(why_empty(request))
        out = request.folder(datetime.now(UTC).strftime("%Y%m%d-%H%M%S"))
        out.mkdir(parents=True, exist_ok=True)
        target = calibrate(request, configs, out)
    except (ValueError, OSError, subprocess.SubprocessError) as e:
        print(f"bench.plan: {e}", file=sys.stderr)
        return 2
    print(table.header(request, target, len(configs)), flush=True)
    t0 = time.perf_counter()
    figures = predict_memory(
        configs,
        gpus_per_node=request.gpus_per_node,
        gpu=bool(request.device.gpu_name),  # a GPU's step: AdamW foreach, NCCL's collectives
        workers=request.workers,
        progress=table.progress_printer(),
    )
    times = step_times(configs, figures, target)
    rows = ranked_rows(configs, figures, times, target)
    meta = plan_json(request, target, time.perf_counter() - t0, len(configs))
    try:
        write_plan(rows, meta, request, out)
        if request.verify:
            # imported here: it brings scipy, which only a verification uses
            from bench.plan.verification import verify

            checked, summary = verify(rows, request, out)
            write_verification(checked, summary, meta, out)
    except OutputError as e:  # a full disk: whatever was written before is whole
        print(f"bench.plan: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
