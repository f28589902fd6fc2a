#!/usr/bin/env bash
# One 2-GPU call: the TMA JFA forward (after its int32-offset fix): GPU 0 its bench, GPU 1 its
# GPU tests, then the h200 trainer with GEM_JFA_FWD=tma (60 steps, cold caches).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== gpu tests"; grep -E "passed|failed|FAILED|Error" "$OUT/f_gpu_tests.log" | tail -n 15 | cut -c1-260
  echo "=== fwd tma"; grep -v '^{' "$OUT/k_fwd.log" | tail -n 62 | cut -c1-200
  echo "=== tr_fwd_tma"; [ -f "$OUT/tr_fwd_tma.log" ] && { python3 tools/trainer_summary.py "$OUT/tr_fwd_tma.log" | head -1; grep -iE "error|illegal" "$OUT/tr_fwd_tma.log" | tail -n 3 | cut -c1-300; }
}
gpu_begin "${WATCH:-300}"
( export CUDA_VISIBLE_DEVICES=0
  st k_fwd 200 python3 -m gem_kernels.bench.fwd_tma --out "$OUT/fwd_tma.json" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st f_gpu_tests 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_tma_fwd.py -k gpu
  st tr_fwd_tma 130 env GEM_JFA_FWD=tma python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60 ) & P1=$!
wait "$P0" "$P1"
gpu_end
