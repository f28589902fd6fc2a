#!/usr/bin/env bash
# Two H200s (~9 minutes): torch's FlashAttention-2 backward behind our forward (kernels 0.2.0).
#   GPU 0: the quality bench's GEM row at 1,000 steps on this tree (the default backward: flash).
#   GPU 1: the kernels' GPU tests of the backward paths, the backward bench (every path side by
#          side), then the h200 trainer 60 steps with GEM_JFA_BWD=one_pass (the old default)
#          and with the default, one after the other.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="python3 -m gem_trainer --preset h200 --steps 60 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  echo "=== kernel gpu tests"; tail -n 3 "$OUT/kernel_tests.log" | cut -c1-400
  echo "=== bwd bench"; grep -A12 "^JFA backward paths" "$OUT/bwd.log" | cut -c1-260
  for r in tr_one_pass tr_flash; do echo "=== $r"; [ -f "$OUT/$r.log" ] && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1; done
}
gpu_begin "${WATCH:-565}"
( export CUDA_VISIBLE_DEVICES=0
  st quality 545 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st kernel_tests 130 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_flash2.py \
     kernels/tests/test_jfa_one_pass.py kernels/tests/test_jfa.py -k "gpu or real or flash or rule"
  st bwd 100 python3 -m gem_kernels.bench.bwd --iters 5 --out "$OUT"
  GEM_JFA_BWD=one_pass st tr_one_pass 170 $TR
  st tr_flash 110 $TR ) & P1=$!
wait "$P0" "$P1"
gpu_end
