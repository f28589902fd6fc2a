#!/usr/bin/env bash
# GEMConfig.merged_stream_reads (model 0.3.2, ninth session, no GPU time then) on the GPU: on
# an x2 box both halves side by side in one call (~7 minutes); on one H200 two calls,
# `PART=ab bash tools/gpu/gpu_merged.sh` (~7 min) then `PART=quality bash tools/gpu/gpu_merged.sh` (~7 min):
#   GPU 0: the reads alone at the h200 step's shape (tools/bench_stream_reads.py: eager and
#          compiled, separate vs merged), the no-host-sync GPU test with the switch on, then
#          the h200 preset, 60 steps, off then on (one GPU, one run after the other: the first
#          compiles cold), then a profile of each (which kernels went: zero fills and adds of
#          [Tc, 1024] in the blocks' backward);
#   GPU 1 (or after it): the quality bench's GEM row with the switch on, 1,000 steps, against
#          the eighth session's 0.7536 / 0.7627 / 0.7819 (same samples and held-out set; the
#          command of tools/gpu/gpu_quality8.sh).
# The switch changes only the order of bf16 gradient sums; it becomes the default if the step
# is faster and the AUCs stay within their standard errors (~0.01).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
W="python3 tools/with_model.py merged_stream_reads=true --"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== microbench"; grep -E "^device|ms$" "$OUT/micro.log"
  echo "=== no-sync test (incl. compiled-merged_stream_reads)"; tail -n 2 "$OUT/nosync.log" | cut -c1-200
  for r in off on; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1; done
  for r in off on; do echo "=== profile $r"; [ -f "$OUT/prof_$r.log" ] && tail -n 30 "$OUT/prof_$r.log" | cut -c1-200; done
  echo "=== quality (on)"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality_on.log" | cut -c1-220
}
gpu_begin "${WATCH:-570}"
second=0; [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && second=1
PART=${PART:-both}
[ "$second" = 0 ] && [ "$PART" = both ] && PART=ab && echo "one GPU: the A/B only; PART=quality next"
PIDS=""
[ "$PART" = quality ] || { ( export CUDA_VISIBLE_DEVICES=0
  st micro 60 python3 tools/bench_stream_reads.py
  st nosync 90 python3 -m pytest -q -p no:cacheprovider -rf tests/test_no_sync_model.py
  st tr_off 150 python3 -m gem_trainer --preset h200 --steps 60 --eval-batches 0 --no-progress
  st tr_on 110 $W -m gem_trainer --preset h200 --steps 60 --eval-batches 0 --no-progress
  st prof_off 70 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 30
  st prof_on 70 $W tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 30
  ) & PIDS="$PIDS $!"; }
[ "$PART" = ab ] || { ( export CUDA_VISIBLE_DEVICES=$second
  st quality_on 420 $W -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality"
  ) & PIDS="$PIDS $!"; }
wait $PIDS
gpu_end
