#!/usr/bin/env bash
# One batched call on a 2-GPU box for the system figures (trainer/BENCHMARKS.md):
#   first both GPUs: the comms bench; then GPU 0: the transfer bench on the GEM preset, then the kernels bench;
#   GPU 1: GPU tests, the h200 trainer eager and compiled with --ckpt-every 50, a profile.
# Every stage under `timeout`; logs in $OUT/<stage>.log; a compact summary last.
OUT=${OUT:-/tmp/out}
# Everything is written three folders down and comes back as one archive ($OUT/all.tgz, the
# device tool returns at most 8 files) beside the compact summary ($OUT/summary.txt).
TOP=$OUT; OUT=$TOP/r/a/b; mkdir -p "$OUT"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
KERNELS_CMD=${KERNELS_CMD:-"bash tools/gpu/kernels_gpu.sh"}
. tools/stage.sh
export OUT
if [ "${COMMS:-1}" = 1 ]; then  # both GPUs: the comms bench (matmul beside copy-engine vs NCCL all-gathers)
  st comms_bench 100 env CUDA_DEVICE_MAX_CONNECTIONS=32 python3 -m torch.distributed.run --standalone \
     --nproc-per-node 2 -m gem_comms.bench.multi_gpu --watchdog 90
fi
( export CUDA_VISIBLE_DEVICES=0
  st transfer_gem 330 python3 -m gem_transfer.bench.transfer --preset gem --time-budget "${TRANSFER_BUDGET:-300}"
  st kernels "${KERNELS_LIMIT:-150}" bash -c "$KERNELS_CMD" ) &
( export CUDA_VISIBLE_DEVICES=1
  st gpu_tests 130 python3 -m pytest -q ${GPU_TESTS:-tests/test_no_sync_model.py trainer/tests/test_no_sync_step.py checkpoint/tests/test_gpu.py}
  st trainer_eager 100 python3 -m gem_trainer --preset h200 --steps 150 --eval-batches 0 --no-progress \
     --ckpt-dir /tmp/ck_e --ckpt-every 50
  st trainer_compile 160 python3 -m gem_trainer --preset h200 --steps 150 --eval-batches 0 --no-progress \
     --compile --ckpt-dir /tmp/ck_c --ckpt-every 50
  st profile 80 python3 tools/profile_trainer.py --preset h200 --steps 12 --rows 22 ) &
wait
{ echo "=== stages"; cat "$OUT/rcs.txt"
echo "=== comms"; tail -n 12 "$OUT/comms_bench.log" | cut -c1-300
echo "=== gpu tests"; tail -n 4 "$OUT/gpu_tests.log"
for r in trainer_eager trainer_compile; do echo "=== $r"
  python3 tools/trainer_summary.py "$OUT/$r.log" | head -1; done
echo "=== profile"; tail -n 30 "$OUT/profile.log" | cut -c1-150
echo "=== kernels"; tail -n 40 "$OUT/kernels.log"
echo "=== transfer"; tail -n 25 "$OUT/transfer_gem.log" | cut -c1-400 ; } 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
