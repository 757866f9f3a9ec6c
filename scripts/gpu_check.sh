#!/usr/bin/env bash
# `make gpu-check`: the suite's GPU path on one machine with CUDA, in a few minutes, checked by
# hand (CI has no GPU): NCCL at world size 1 (one rank per GPU: NCCL refuses two ranks on one
# device), a zoo model's DDP and FSDP sweeps, two ranks sharing GPU 0 over gloo with CUDA
# tensors (DDP, TP, a 2-stage pipeline), compile and float8 against eager bf16, the collectives, the planner's memory against CUDA's allocator
# (bench/selftime/plan_memory.py), and the analyser on the GPU traces the sweeps wrote. First it
# measures the GPU's roofline (python -m bench.roofline: OUT/roofline.json, docs/roofline.md);
# last it prints the MFU waterfall of a GPU step priced on it.
# It ends with a summary: device, MFU, GPU utilisation (trace and NVML), the analyser's figures.
#
#   make gpu-check TORCH=            # with your CUDA torch in .venv (README)
#   bash scripts/gpu_check.sh        # with the python3 that holds your CUDA torch
#
# Run folders go under OUT (default /tmp/gpu_check), the summary to OUT/summary.txt. On a
# machine without CUDA it says so in one line and exits 0.
set -u
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
MODEL=${MODEL:-llama:tiny}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu-check: torch sees no CUDA device here; nothing to check"
  exit 0
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
N=$($PY -c "import torch; print(torch.cuda.device_count())")
$PY - <<'EOF' | tee "$OUT/summary.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
try:
    print("nvml utilisation now", torch.cuda.utilization(0), "%")
except Exception as e:  # noqa: BLE001
    print("nvml: unavailable:", type(e).__name__, e)
EOF

# The GPU's roofline (peaks, bandwidth, efficiency curves, launch), measured while it is quiet:
# the file a command's --device-profile takes in place of the datasheet's stated one.
echo "== roofline: python -m bench.roofline --out $OUT/roofline.json" | tee -a "$OUT/summary.txt"
timeout 180 $PY -m bench.roofline --out "$OUT/roofline.json" 2>&1 | tee -a "$OUT/summary.txt"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"

run() {  # name, ranks, time limit (s), then bench/run.py's arguments
  local name=$1 ranks=$2 limit=$3
  shift 3
  echo "== $name ($ranks rank(s)): bench/run.py $*" | tee -a "$OUT/summary.txt"
  timeout "$limit" $PY -m torch.distributed.run --standalone --nproc_per_node="$ranks" \
    bench/run.py "$@" --out "$OUT/$name" --reports-dir "$OUT/reports" >"$OUT/$name.log" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -v "^USDT" "$OUT/$name.log" | tail -n 12 >>"$OUT/summary.txt"
}

run ddp "$N" 120 --sweep bucket_cap_mb --values 1,25 --model "$MODEL,transformer" \
  --rounds 1 --max-point-s 3
run fsdp "$N" 120 --sweep sharding_strategy --values FULL_SHARD,NO_SHARD --model "$MODEL" \
  --rounds 1 --max-point-s 3
run shared_gpu 2 120 --sweep bucket_cap_mb --values 1,25 --model "$MODEL" --impl native \
  --backend gloo-cuda --rounds 1 --max-point-s 3
# tensor parallelism on CUDA tensors: the DTensor step whose AdamW is CUDA's foreach
run tp_shared_gpu 2 120 --sweep tp_degree --values 2 --model "$MODEL" --backend gloo-cuda \
  --rounds 1 --max-point-s 3
run collectives "$N" 90 --sweep message_size -b 1K -e 64M -f 8
# a pipeline of 2 stages sharing GPU 0 (gloo, CUDA tensors): both implementations' 1F1B and
# torch's GPipe, each stage's bubble and peak memory in the rows
run pp_shared_gpu 2 150 --sweep pp_schedule --values 1f1b,gpipe --model "$MODEL" \
  --backend gloo-cuda --rounds 1 --max-point-s 3
# the levers: the blocks compiled (inductor with Triton), and float8 matmuls (torchao), timed
# where the GPU has float8 (compute capability 8.9 or more), against eager and bf16
run compile "$N" 240 --sweep compile --values off,blocks --model "$MODEL" --rounds 1 \
  --max-point-s 3
run fp8 "$N" 180 --sweep precision --values bf16,fp8 --model "$MODEL" --rounds 1 \
  --max-point-s 3

# The planner's peak per rank (fake tensors, no GPU used) against CUDA's allocator peak of the
# same step, with the device memory outside the allocator beside it (the --allowance-gib).
memory() {  # name, time limit (s), then plan_memory.py's arguments
  local name=$1 limit=$2
  shift 2
  echo "== $name: bench/selftime/plan_memory.py --gpu $*" | tee -a "$OUT/summary.txt"
  timeout "$limit" $PY bench/selftime/plan_memory.py --gpu "$@" >"$OUT/$name.log" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -E "^(model|largest|reservation|[a-z0-9_/.:]+ )" "$OUT/$name.log" >>"$OUT/summary.txt"
}
memory plan_memory 300 --ranks 1 --backend nccl
memory plan_memory_shared 200 --ranks 2 --layouts "ddp,ddp ckpt,tp2" --backend gloo-cuda

$PY - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
from pathlib import Path

import pandas as pd

from bench.analysis.trace_folder import analyse, load_trace_dir

out = Path(sys.argv[1])
pd.set_option("display.width", 250)
for name in ("ddp", "fsdp", "shared_gpu", "tp_shared_gpu", "pp_shared_gpu", "compile", "fp8",
             "collectives"):
    f = out / name / "results.csv"
    if not f.exists():
        print(f"-- {name}: no results.csv")
        continue
    df = pd.read_csv(f)
    cols = [c for c in (
        "model", "value", "impl", "collective", "size_bytes", "inplace", "status", "backend",
        "device", "step_ms_median", "mfu_pct", "tflops_per_s", "peak_tflops", "peak_source",
        "gpu_util_pct", "nvml_util_pct",
        "idle_ms", "exposed_comm_ms", "peak_mem_mb", "peak_reserved_mb", "trace_overhead_pct",
        "pp_bubble_pct", "pp_bubble_theory_pct", "compile_seconds", "matmul_precision",
        "time_us", "busbw_GBps", "wrong", "error",
    ) if c in df]
    print(f"-- {name}: {int((df['status'] == 'ok').sum())} of {len(df)} rows ok")
    print(df[cols].to_string(index=False, max_colwidth=50))
for name in ("ddp", "shared_gpu"):
    folders = sorted(p for p in (out / name / "traces").glob("*") if p.name != "sweep_scalars")
    if folders:
        print(f"-- the analyser on {folders[0]}")
        tables = analyse(load_trace_dir(folders[0]))
        for key in ("ranks", "steps"):
            if key in tables:
                print(tables[key].round(1).to_string(index=False))
EOF

# Where a GPU step's MFU goes: the MFU waterfall of the DDP sweep's first point, priced on the
# roofline measured above (docs/analysis.md, "The MFU waterfall").
first=$(ls -d "$OUT"/ddp/traces/*/ 2>/dev/null | grep -v sweep_scalars | head -n 1)
if [ -n "$first" ]; then
  profile=()
  [ -s "$OUT/roofline.json" ] && profile=(--device-profile "$OUT/roofline.json")
  echo "== MFU waterfall: bench.analysis $first --mfu ${profile[*]}" | tee -a "$OUT/summary.txt"
  timeout 120 $PY -m bench.analysis "$first" --mfu "${profile[@]}" 2>&1 | tee -a "$OUT/summary.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
fi
