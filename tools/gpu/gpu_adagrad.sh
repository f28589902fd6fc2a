#!/usr/bin/env bash
# Two H200s (~9 minutes), run from the folder holding both trees: bash B/tools/gpu/gpu_adagrad.sh A B
#   GPU 0: the h200 trainer 60 steps, tree A then tree B (each compiles cold), then B at the
#          issue's --steps 300, then B's compiled step under the profiler.
#   GPU 1: B's row-wise Adagrad GPU test and bench, a GDPA short-kv tile sweep at the
#          trainer's shape, then the quality bench's GEM row at 1,000 steps on B.
. "$(dirname "$0")/../stage.sh"
ab_trees "$1" "$2"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in tr_a tr_b tr_b_300; do echo "=== $r"; [ -f "$OUT/$r.log" ] && (cd "$ROOT/$B" && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1); done
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
  echo "=== adagrad test"; tail -n 1 "$OUT/adagrad_test.log" | cut -c1-300
  echo "=== adagrad bench"; grep -A10 "^row-wise Adagrad" "$OUT/adagrad.log" | cut -c1-200
  echo "=== gdpa sweep"; grep -E "^default|^best" "$OUT/gdpa_sweep.log" | cut -c1-300
  echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
}
gpu_begin "${WATCH:-565}"
( export CUDA_VISIBLE_DEVICES=0
  (cd "$ROOT/$A"; PYTHONPATH=$PA st tr_a 150 $TR)
  cd "$ROOT/$B"; export PYTHONPATH=$PB
  st tr_b 150 $TR
  st tr_b_300 120 ${TR/--steps 60/--steps 300}
  st profile 90 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 --trace "$OUT/trace.json"
  [ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1; cd "$ROOT/$B"; export PYTHONPATH=$PB
  st adagrad_test 60 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_rowwise_adagrad.py
  st adagrad 40 python3 -m gem_kernels.bench.adagrad --out "$OUT"
  st gdpa_sweep 90 python3 -m gem_kernels.bench.gdpa --short
  st quality 400 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality" ) & P1=$!
wait "$P0" "$P1"
gpu_end
