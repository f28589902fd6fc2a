#!/usr/bin/env bash
# One GPU call for issue #16's levers: the JFA backward (two-pass vs one-pass) and the Hopper
# FP8 recipe, each in its module bench and GPU tests, then in the trainer's compiled h200 step
# (same caches: the first run compiles cold, the kernel A/B reuses the graphs).
# DUAL=1 (a 2-GPU box): GPU 0 runs the kernels and the trainer; GPU 1 the precision bench and
# tests and the transfer bench's GEM preset with its student-sample sweep (issue #19).
OUT=${OUT:-/tmp/out}; TOP=$OUT; OUT=$TOP/r/a/b; mkdir -p "$OUT"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh; export OUT
STEPS=${STEPS:-60}
TR="python3 -m gem_trainer --preset h200 --steps $STEPS --eval-batches 0 --no-progress"
precision() {
  st precision_bench 110 python3 -m gem_precision.bench.hopper ${HOPPER_ARGS:-}
  st precision_tests 80 python3 -m pytest -q -p no:cacheprovider precision/tests/test_fp8_block.py -k gpu; }
main() {
  st kernels_bwd 100 python3 -m gem_kernels.bench.table --bwd-compare --out "$OUT/kbwd"
  st kernels_tests 80 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_one_pass.py -k gpu
  [ "${DUAL:-0}" = 1 ] || precision
  st tr_two_pass 130 env GEM_JFA_BWD=two_pass $TR
  st tr_one_pass 70 env GEM_JFA_BWD=one_pass $TR
  [ "${FP8:-1}" = 1 ] && st tr_fp8_one_pass 150 env GEM_JFA_BWD=one_pass $TR --precision fp8_block; }
if [ "${DUAL:-0}" = 1 ]; then
  ( export CUDA_VISIBLE_DEVICES=0; main ) &
  ( export CUDA_VISIBLE_DEVICES=1
    st transfer_gem_sweep 330 python3 -m gem_transfer.bench.transfer --preset gem --sweep --time-budget 300 --out "$OUT/tx"
    precision ) &
  wait
else
  main
fi
{ echo "=== stages"; cat "$OUT/rcs.txt"
echo "=== kernels bwd"; tail -n 30 "$OUT/kernels_bwd.log" | grep -v '^{' | cut -c1-200
echo "=== kernels tests"; tail -n 6 "$OUT/kernels_tests.log" | cut -c1-300
echo "=== precision bench"; tail -n 22 "$OUT/precision_bench.log" | grep -v '^{' | cut -c1-220
echo "=== precision tests"; tail -n 8 "$OUT/precision_tests.log" | cut -c1-300
for r in tr_two_pass tr_one_pass tr_fp8_one_pass; do echo "=== $r"
  [ -f "$OUT/$r.log" ] && { python3 tools/trainer_summary.py "$OUT/$r.log" | head -1; grep -iE "error|warn" "$OUT/$r.log" | tail -n 3 | cut -c1-300; }; done
[ -f "$OUT/transfer_gem_sweep.log" ] && { echo "=== transfer"; tail -n 40 "$OUT/transfer_gem_sweep.log" | grep -v '^{' | cut -c1-220; }
} 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
