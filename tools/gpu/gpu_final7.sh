#!/usr/bin/env bash
# One H200 (~8 minutes): the seventh session's measurements of today's tree.
#   The issue-#16 command (--steps 300, cold caches); the GPU tests the session's changes touch
#   (the no-sync steps of the trainer and the model with the FlashAttention-2 backward and the
#   Adagrad kernel; the model's GPU tests); the issue-#15 table; the model's local-MFU bench at
#   the trainer's size. (The two-GPU trainer test needs an x2 box: tools/gpu/multi_gpu.sh.)
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  for t in nosync_tests model_tests; do echo "=== $t"; tail -n 1 "$OUT/$t.log" | cut -c1-300; done
  echo "=== table"; grep -A16 "^issue 15 table" "$OUT/table.log" | cut -c1-200
  echo "=== local mfu"; grep -iE "whole model|weighted|seq_attention|^B=" "$OUT/local_mfu.log" | head -6 | cut -c1-200
}
gpu_begin "${WATCH:-480}"
st tr_300 175 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress
st nosync_tests 90 python3 -m pytest -q -p no:cacheprovider trainer/tests/test_no_sync_step.py tests/test_no_sync_model.py trainer/tests/test_optim.py
st model_tests 40 python3 -m pytest -q -p no:cacheprovider model/tests/test_model.py -k gpu
st table 100 python3 -m gem_kernels.bench.table --no-sweep --out "$OUT"
st local_mfu 40 python3 -m gem_model.bench.local_mfu --tokens 262144 --cap 16384 --no-reference
gpu_end
