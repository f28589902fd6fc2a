#!/usr/bin/env bash
# One H200 (~8 minutes), repository root: the quality bench's GEM row at 1,000 steps on this
# tree (to compare with the previous figures: same samples, same held-out set), then the
# issue-#16 command `--steps 300` (its compile caches warm from the quality bench's run).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
}
gpu_begin "${WATCH:-500}"
st quality 400 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
   --eval-at 100,250,500,750,1000 --out "$OUT/quality"
st tr_300 $(( ${WATCH:-500} - 10 - $(cut -d= -f3 "$OUT/rcs.txt" | tr -dc 0-9) )) \
   python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress
gpu_end
