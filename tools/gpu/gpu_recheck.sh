#!/usr/bin/env bash
# Re-check after fixes, on a 2-GPU box (~6 minutes): GPU 0: the GDPA GPU tests (default
# backward tiles) and the transfer bench on the GEM preset; GPU 1: the no-sync GPU tests and
# the h200 trainer with its defaults (compiled) and --ckpt-every 50. One archive comes back.
TOP=${OUT:-/tmp/out}; OUT=$TOP/r/a/b; mkdir -p "$OUT"; export OUT
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
( export CUDA_VISIBLE_DEVICES=0
  st gdpa_gpu 60 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py -k "gpu_real_sizes and not window"
  st transfer_gem 330 python3 -m gem_transfer.bench.transfer --preset gem --time-budget "${TRANSFER_BUDGET:-300}" ) &
( export CUDA_VISIBLE_DEVICES=1
  st gpu_tests 110 python3 -m pytest -q -p no:cacheprovider tests/test_no_sync_model.py trainer/tests/test_no_sync_step.py
  st trainer 190 python3 -m gem_trainer --preset h200 --steps 250 --eval-batches 0 --no-progress \
     --ckpt-dir /tmp/ck_r --ckpt-every 50 ) &
wait
{ echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== gdpa"; tail -n 3 "$OUT/gdpa_gpu.log"
  echo "=== gpu tests"; grep -E "^FAILED|^E  .*Error|passed|failed" "$OUT/gpu_tests.log" | tail -8
  echo "=== trainer"; python3 tools/trainer_summary.py "$OUT/trainer.log" | head -1
  grep -i "warning" "$OUT/trainer.log" | head -3
  echo "=== transfer"; grep -E "teacher|TARGET|target|^\{" "$OUT/transfer_gem.log" | cut -c1-700 | tail -12 ; } 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
