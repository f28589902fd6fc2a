#!/usr/bin/env bash
# A/B of two source trees in one 2-GPU call (~8 minutes), run from the folder holding them:
#   bash A/tools/gpu/gpu_ab.sh A B
#   GPU 0: the quality bench's GEM row at 1,000 steps with tree B (the change), to compare
#          with tree A's figures (the data are deterministic: the same samples, same held-out set).
#   GPU 1: the h200 trainer, 60 steps, A then B, one after the other on the same GPU; with
#          ONEPASS=1 B again with GEM_JFA_BWD=one_pass, with LONG=1 B at the issue's --steps 300;
#          B's model GPU tests; B's compiled step under the profiler.
. "$(dirname "$0")/../stage.sh"  # this script's own tree: A may predate gpu_begin
ab_trees "$1" "$2"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== quality ($B)"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  for r in tr_a tr_b tr_b_one_pass tr_b_300; do echo "=== $r"; [ -f "$OUT/$r.log" ] && (cd "$ROOT/$A" && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1); done
  echo "=== model gpu tests"; tail -n 2 "$OUT/model_tests.log" | cut -c1-300
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
}
gpu_begin "${WATCH:-560}"
( export CUDA_VISIBLE_DEVICES=0; cd "$ROOT/$B"; export PYTHONPATH=$PB
  st quality 540 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  (cd "$ROOT/$A"; PYTHONPATH=$PA st tr_a 170 $TR)
  cd "$ROOT/$B"; export PYTHONPATH=$PB
  st tr_b 150 $TR
  [ "${ONEPASS:-0}" = 1 ] && GEM_JFA_BWD=one_pass st tr_b_one_pass 90 $TR
  [ "${LONG:-0}" = 1 ] && st tr_b_300 150 ${TR/--steps 60/--steps 300}
  st model_tests 60 python3 -m pytest -q -p no:cacheprovider model/tests/test_model.py -k gpu
  st profile 120 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 \
     --trace "$OUT/trace.json"
  [ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json" ) & P1=$!
wait "$P0" "$P1"
gpu_end
