#!/usr/bin/env bash
# Forty-first session: is the h200 preset's dense learning rate (1e-4, 10 warm-up steps, picked
# from an 80-step ablation in the sixth session) still the right one at 400+ steps? The quality
# bench's GEM row at 400 steps (the same samples and held-out set for every arm: the first
# model's batches are replayed), the default against higher peaks with a longer warm-up and a
# larger table step. No flash-attn-4 (the quality rows have always run without it).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -E ": mean AUC|Error|^ *gem[^ ]* \||Bayes" "$OUT/quality.log" | cut -c1-230; }; }
gpu_begin "${WATCH:-585}"
st quality $(gpu_left) python3 -m gem_trainer.bench.quality --preset h200 --steps "${STEPS:-400}" --models gem \
   --eval-at "${EVAL_AT:-200,400}" --out "$OUT/quality" --gem-variants \
   'lr=2e-4;warmup_steps=100' 'lr=4e-4;warmup_steps=100' 'sparse_lr=0.3'
gpu_end
