#!/usr/bin/env bash
# Fortieth session, one call (no FlashAttention-4: the device time left held one box): gem-model
# 0.6.0's h200 preset without the token-stream biases (GEMConfig.stream_bias=False: no bias-grad
# column sums over the token rows, the residual added inside the `wo` / `w2` GEMMs), against 0.5.4
# (commit 8beb2cc's model/gem_model, unpacked by
#   mkdir -p .ab/model054 && git archive 8beb2cc model/gem_model | tar x -C /tmp && cp -r /tmp/model/gem_model .ab/model054/
# git-ignored; carried). Stages: the new GPU tests; the trainer A/B, each arm from its own empty
# caches (`--preset h200 --steps 60`); the quality bench's GEM row (h200, 1,000 steps, the same
# samples and held-out set: compare 0.5.4's 0.7547 / 0.7644 / 0.7825 from gpu_s40.sh PART=a, same
# kind of box); then warm A/B pairs while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/tests.log" ] && { echo "=== tests"; grep -E "passed|failed|error|FAILED" "$OUT/tests.log" | tail -n 6 | cut -c1-300; }
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220; }
  for f in new1 old1 new2 old2 new3 old3; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }; done
}
gpu_begin "${WATCH:-585}"
export AB_OLD=.ab/model054 H200_TR
st tests 110 python3 -m pytest -q -p no:cacheprovider model/tests/test_stream_bias.py model/tests/test_model.py tests/test_no_sync_model.py -k "gpu or eager or compiled-merged"
st new1 120 bash -c "ab_arm new 60"
st old1 120 bash -c "ab_arm old 60"
st quality $(gpu_left) python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
   --eval-at 100,250,500,750,1000 --out "$OUT/quality"
for i in 2 3; do
  [ "$(gpu_left)" -gt 40 ] && st new$i 35 bash -c "ab_arm new 60"
  [ "$(gpu_left)" -gt 40 ] && st old$i 35 bash -c "ab_arm old 60"
done
gpu_end
