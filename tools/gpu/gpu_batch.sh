#!/usr/bin/env bash
# One batched GPU call: module GPU tests + benches, each under its own time limit.
# Usage (on the GPU box, repo root): bash tools/gpu/gpu_batch.sh SECTION... ; writes $OUT/<name>.log
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | sort -u | paste -sd:)
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
run() { local name=$1 lim=$2; shift 2; echo "=== $name"; timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; tail -n 25 "$OUT/$name.log"; }
for s in "$@"; do case $s in
  comms) run comms_gpu_tests 90 python3 -m pytest -q -x comms/tests/test_gpu.py
         run comms_bench 120 python3 -m gem_comms.bench.interference --quick ;;
  ckpt)  run ckpt_gpu_tests 60 python3 -m pytest -q checkpoint/tests/test_gpu.py
         run ckpt_bench 120 python3 -m gem_checkpoint.bench.stall ;;
  data)  run data_gpu_tests 60 python3 -m pytest -q data/tests -k "cuda or gpu"
         run data_bench 90 python3 -m gem_data.bench.loader --quick ;;
  model) run model_bench 150 python3 -m gem_model.bench.local_mfu --quick ;;
  ckpt_tests) run ckpt_gpu_tests 50 python3 -m pytest -q checkpoint/tests/test_gpu.py ;;
  kernels_tests) run kernels_gpu_tests 120 python3 -m pytest -q -x kernels/tests -k "gpu or cuda" ;;
  precision) run precision_bench 110 python3 -m gem_precision.bench.mxfp8 --quick ;;
  trainer) run trainer_h200 180 python3 -m gem_trainer --preset h200 --steps 30 --eval-batches 2 --log-every 5 --no-progress --ckpt-dir /tmp/gem_ck --ckpt-every 10 --log-dir $OUT/trainer_logs ;;
esac; done
