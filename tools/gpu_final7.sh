#!/usr/bin/env bash
# Two H200s (~7 minutes): the seventh session's measurements of today's tree.
#   GPU 0: the issue-#16 command (--steps 300, cold caches), then the compiled step under the profiler.
#   GPU 1: the GPU tests the session's changes touch (kernels: FlashAttention-2 backward, row-wise
#          Adagrad; the no-sync steps of the trainer and the model; the model's GPU tests), the
#          issue-#15 table, the backward bench, the model's local-MFU bench at the trainer's size.
#   Then both: the two-GPU trainer test (HSDP: the Adagrad kernel on FSDP2 row shards).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
  for t in kernel_tests nosync_tests model_tests multi_gpu; do echo "=== $t"; tail -n 1 "$OUT/$t.log" | cut -c1-300; done
  echo "=== table"; grep -A16 "^issue 15 table" "$OUT/table.log" | cut -c1-200
  echo "=== local mfu"; grep -iE "whole model|weighted|seq_attention|^B=" "$OUT/local_mfu.log" | head -6 | cut -c1-200
}
gpu_begin "${WATCH:-500}"
( export CUDA_VISIBLE_DEVICES=0
  st tr_300 210 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress
  st profile 90 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 --trace "$OUT/trace.json"
  [ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st kernel_tests 90 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_flash_bwd.py kernels/tests/test_rowwise_adagrad.py
  st nosync_tests 90 python3 -m pytest -q -p no:cacheprovider trainer/tests/test_no_sync_step.py tests/test_no_sync_model.py trainer/tests/test_optim.py
  st model_tests 40 python3 -m pytest -q -p no:cacheprovider model/tests/test_model.py -k gpu
  st table 100 python3 -m gem_kernels.bench.table --no-sweep --out "$OUT"
  st local_mfu 40 python3 -m gem_model.bench.local_mfu --tokens 262144 --cap 16384 --no-reference ) & P1=$!
wait "$P0" "$P1"
st multi_gpu 150 python3 -m pytest -q -p no:cacheprovider trainer/tests/test_multi_gpu.py
gpu_end
