#!/usr/bin/env bash
# What the seventh session left to check on the GPU, in one 2-GPU call (~7 minutes):
#   GPU 0: the issue-#16 command uncut (`--steps 300`: a cold compile ~68 s + 300 x ~0.25 s;
#          the session's runs were cut at 223 and 290 steps by their stage limits);
#   GPU 1: the kernels' GPU tests changed after the last GPU run (test_jfa_flash2.py's shared
#          check, test_rowwise_adagrad.py's lr-0 test; both CPU-checked);
#   then both GPUs: the two-GPU trainer test (HSDP: the Adagrad kernel on FSDP2 row shards,
#          the FlashAttention-2 backward in the eager multi preset).
# A watchdog writes the summary and the archive at WATCH seconds (default 540).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  for t in kernel_tests multi_gpu; do echo "=== $t"; grep -E "passed|failed|Error" "$OUT/$t.log" | tail -n 4 | cut -c1-300; done
}
gpu_begin "${WATCH:-540}"
( export CUDA_VISIBLE_DEVICES=0
  st tr_300 240 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st kernel_tests 150 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_jfa_flash2.py \
     kernels/tests/test_rowwise_adagrad.py ) & P1=$!
wait "$P0" "$P1"
st multi_gpu 240 python3 -m pytest -q -p no:cacheprovider -rf trainer/tests/test_multi_gpu.py
gpu_end
