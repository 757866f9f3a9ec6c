#!/usr/bin/env bash
# A short check of the suite's GPU path on a machine with CUDA: NCCL, the profiler's CUDA
# activity, the GPU-utilisation figures and the CUDA memory columns. Not a test (CI has no GPU):
# run it by hand on a GPU machine, with the GPU build of torch installed (README), and read
# what it prints. It writes its run folders under OUT (default /tmp/gpu_check) and
# OUT/summary.txt.
#
#   bash scripts/gpu_check.sh            # every GPU of the machine, one rank each
#
# One rank per GPU (NCCL refuses two ranks on one device), so a one-GPU machine checks NCCL at
# world size 1: the kernels, the traces and the figures, not the network.
set -u
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
N=$($PY -c "import torch; print(torch.cuda.device_count())")
[ "$N" -ge 1 ] || { echo "gpu_check: torch sees no GPU here"; exit 2; }
$PY - <<'EOF' | tee "$OUT/summary.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
try:
    print("nvml utilisation now", torch.cuda.utilization(0), "%")
except Exception as e:  # noqa: BLE001
    print("nvml: unavailable:", type(e).__name__, e)
EOF

run() {  # name, timeout, then bench/run.py's arguments
  local name=$1 limit=$2
  shift 2
  echo "== $name: bench/run.py $*" | tee -a "$OUT/summary.txt"
  timeout "$limit" torchrun --nproc_per_node="$N" bench/run.py "$@" --out "$OUT/$name" \
    --reports-dir "$OUT/reports" >"$OUT/$name.log" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -v "^USDT" "$OUT/$name.log" | tail -n 25 >>"$OUT/summary.txt"
}

run bucket 150 --sweep bucket_cap_mb --values 1,25 --model wide_mlp,transformer --rounds 2 \
  --max-steps 40 --max-point-s 3
run sharding 100 --sweep sharding_strategy --model transformer --rounds 1 --max-steps 30 --max-point-s 2
run collectives 100 --sweep message_size -b 1K -e 64M -f 8

$PY - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
from pathlib import Path

import pandas as pd

from bench.analysis.breakdown import breakdown, load_trace

out = Path(sys.argv[1])
pd.set_option("display.width", 250)
for name in ("bucket", "sharding", "collectives"):
    f = out / name / "results.csv"
    if not f.exists():
        print(f"{name}: no results.csv")
        continue
    df = pd.read_csv(f)
    cols = [c for c in (
        "model", "value", "impl", "collective", "size_bytes", "inplace", "status", "backend",
        "device", "step_ms_median", "rank_skew_ms", "data_ms", "gpu_util_pct", "nvml_util_pct",
        "idle_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "peak_mem_mb", "peak_reserved_mb",
        "trace_overhead_pct", "time_us", "busbw_GBps", "wrong", "error",
    ) if c in df]
    print(f"-- {name}")
    print(df[cols].to_string(index=False, max_colwidth=60))
traces = sorted((out / "bucket" / "traces").glob("*/rank0.*.pt.trace.json"))
for path in traces[:2]:
    t = load_trace(path)
    print(path.parent.name, "gpu trace:", t.is_gpu, "events", len(t.events),
          "device events", int((t.events["stream"] >= 0).sum()))
    print(breakdown(t).round(1).to_string(index=False))
EOF
