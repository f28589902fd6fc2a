#!/usr/bin/env bash
# Issue 18 on a 2-GPU machine in one call (no Bazel, no network, no torchrec):
#   1. the full comms bench first (probe of the copy-engine primitives, results vs NCCL, busbw,
#      matmul slowdown beside each all-gather, then all-to-all, reduce-scatter, lanes, host
#      cost); its working flag mode is passed on to the trainer runs (GEM_COMMS_SIGNAL);
#   2. h200 preset, 60 steps: 1 GPU, 2 GPUs --comms nccl, 2 GPUs --comms copy_engine;
#   3. trainer/tests/test_multi_gpu.py: the end of a 2-GPU run under NCCL (evaluation, summary,
#      checkpoint, resume), FSDP all-gathers through NCCL and through copy engines;
#   4. a compact final table (tools/multi_gpu_table.py).
# Every stage runs under `timeout` and writes $OUT/<stage>.log; this script's own output is
# tee'd to $OUT/multi_gpu.log. The stage limits are cut to the budget (first argument, else
# $BUDGET, else 560 s), so it ends before the call limit whatever hangs; a stage that would get
# less than 30 s is skipped. Typical: bench ~60 s, each h200 run ~45 s, the trainer test ~100 s.
# Usage (repo root, on the GPU box): OUT=/some/dir BUDGET=300 bash tools/gpu/multi_gpu.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/multi_gpu}
mkdir -p "$OUT"
: > "$OUT/rcs.txt"
exec > >(tee -a "$OUT/multi_gpu.log") 2>&1
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | sort -u | paste -sd:)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# NVLink multicast stays off on the lent machines (KINDS.md): keep it so in every child.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
budget=${1:-${BUDGET:-560}}
t0=$SECONDS
left() { echo $(( budget - (SECONDS - t0) )); }

# run NAME NOMINAL_LIMIT CMD...: the limit is cut to what the budget leaves (minus a margin);
# skipped (rc "skip") when less than 30 s would be left.
run() {
  local name=$1 nominal=$2; shift 2
  local lim=$(( $(left) - 20 ))
  (( lim > nominal )) && lim=$nominal
  if (( lim < 30 )); then echo "=== $name skipped: $(left) s of the budget left"; echo "$name skip 0" >> "$OUT/rcs.txt"; return 0; fi
  echo "=== $name (limit $lim s, $(left) s of the budget left)"
  local start=$SECONDS
  timeout -k 5 "$lim" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc wall=$(( SECONDS - start )) s"
  echo "$name $rc $(( SECONDS - start ))" >> "$OUT/rcs.txt"
  grep -v -E "FutureWarning|return func\(\*args|^\s*$" "$OUT/$name.log" | tail -n 25
  return $rc
}
torchrun2=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)  # free port each time

echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -n 4
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'p2p 0->1', torch.cuda.device_count() > 1 and torch.cuda.can_device_access_peer(0, 1))"

# 1. the full comms bench first (the probe says which flag placement works; the trainer runs
#    use it). 32 hardware queues: a matmul stream must not share one with a copy-engine lane
#    waiting on a flag (the bench sets the same default itself).
rm -f "$OUT/comms_multi_gpu.json"
lim=$(( $(left) - 20 )); (( lim > 150 )) && lim=150
run comms_full "$lim" env CUDA_DEVICE_MAX_CONNECTIONS=32 "${torchrun2[@]}" -m gem_comms.bench.multi_gpu --watchdog $(( lim - 15 ))
[ -f "$OUT/comms_multi_gpu.json" ] && cp "$OUT/comms_multi_gpu.json" "$OUT/comms_multi_gpu_full.json"
sig=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('signal') or '')" "$OUT/comms_multi_gpu_full.json" 2>/dev/null)
if [ -n "$sig" ]; then export GEM_COMMS_SIGNAL=$sig; echo "GEM_COMMS_SIGNAL=$sig (from the probe)"; fi

# 2. scaling: h200 preset, 60 steps, 1 GPU vs 2 GPUs (HSDP) through NCCL and copy engines
common=(--preset h200 --steps 60 --eval-batches 0 --no-progress --log-every 1 --no-compile)  # 60 steps: eager (compiling takes ~80 s)
rm -rf "$OUT"/h200_1gpu "$OUT"/h200_2gpu_nccl "$OUT"/h200_2gpu_copy_engine
run h200_1gpu 110 python3 -m gem_trainer "${common[@]}" --log-dir "$OUT/h200_1gpu"
run h200_2gpu_nccl 110 "${torchrun2[@]}" -m gem_trainer "${common[@]}" --comms nccl --log-dir "$OUT/h200_2gpu_nccl"
run h200_2gpu_copy_engine 110 "${torchrun2[@]}" -m gem_trainer "${common[@]}" --comms copy_engine --log-dir "$OUT/h200_2gpu_copy_engine"

# 3. the end of a 2-GPU trainer run (evaluation, summary, checkpoint, resume)
run trainer_multi_gpu_test 170 python3 -m pytest -q -rA -x trainer/tests/test_multi_gpu.py

# 4. compact table, last
echo "=== summary ($(( SECONDS - t0 )) s)"
python3 tools/multi_gpu_table.py "$OUT"
