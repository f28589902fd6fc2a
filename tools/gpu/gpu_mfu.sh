#!/usr/bin/env bash
# One GPU call for what is still unmeasured (issues #16, #15, #19), on a 1- or 2-GPU box:
#   the JFA backward two-pass vs one-pass (kernel bench, GPU tests, the compiled h200 trainer
#   step), the Hopper FP8 recipe (hopper bench incl. the fused Triton quantizer, GPU tests incl.
#   the compiled layer) on the second GPU with DUAL=1, and with TRANSFER=1 before them the
#   transfer bench's GEM-preset student-sample sweep.
# Every stage runs under `timeout -k` (tools/stage.sh); a watchdog writes the summary and the
# archive at WATCH seconds (default 560) even if a stage overruns, so a call cut at the device
# limit still returns its logs.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
STEPS=${STEPS:-60}
TR="python3 -m gem_trainer --preset h200 --steps $STEPS --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== kernels bwd"; grep -A40 "^case" "$OUT/kernels_bwd.log" | cut -c1-160; grep -A4 "^fastest" "$OUT/kernels_bwd.log"
  echo "=== precision bench"; grep -v '^{' "$OUT/precision_bench.log" | tail -n 30 | cut -c1-240
  echo "=== gpu tests"; tail -n 8 "$OUT/gpu_tests.log" | cut -c1-300
  for r in tr_two_pass tr_one_pass tr_fp8_block; do echo "=== $r"
    [ -f "$OUT/$r.log" ] && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1; done
  echo "=== local mfu (trainer batch)"; grep -A16 "GEM local MFU" "$OUT/local_mfu.log" | cut -c1-200
  [ -f "$OUT/transfer_gem_sweep.log" ] && { echo "=== transfer"; grep -v '^{' "$OUT/transfer_gem_sweep.log" | tail -n 45 | cut -c1-220; }
}
gpu_begin "${WATCH:-560}"
precision() {
  st precision_bench 100 python3 -m gem_precision.bench.hopper
  st gpu_tests 120 python3 -m pytest -q -p no:cacheprovider precision/tests/test_fp8_block.py \
     precision/tests/test_fp8_block_triton.py kernels/tests/test_jfa_one_pass.py -k "gpu or opaque"; }
main() {
  st kernels_bwd 100 python3 -m gem_kernels.bench.table --bwd-compare --out "$OUT/kbwd"
  [ "${DUAL:-0}" = 1 ] || precision
  st tr_two_pass 130 env GEM_JFA_BWD=two_pass $TR
  st tr_one_pass 70 env GEM_JFA_BWD=one_pass $TR
  st local_mfu 90 python3 -m gem_model.bench.local_mfu --tokens 262144 --cap 16384 --no-reference; }
if [ "${DUAL:-0}" = 1 ]; then
  ( export CUDA_VISIBLE_DEVICES=0; main ) & P0=$!
  ( export CUDA_VISIBLE_DEVICES=1
    [ "${TRANSFER:-0}" = 1 ] && st transfer_gem_sweep 330 python3 -m gem_transfer.bench.transfer --preset gem --sweep --time-budget 300 --out "$OUT/tx"
    precision
    st tr_fp8_block 150 $TR --precision fp8_block ) & P1=$!
  wait "$P0" "$P1"
else
  main
fi
gpu_end
