#!/usr/bin/env bash
# The quality figures of trainer/BENCHMARKS.md on a 2-GPU box, in one call (~10 minutes):
#   GPU 0: h200 preset, GEM + pooled MLP + logistic regression, STEPS updates, one sample stream;
#   GPU 1: the same samples for GEM with attention off, then a checkpointed trainer run;
#   CPU cores: tiny-preset variants (tools/quality_sweep.sh) beside them.
# Usage: bash tools/gpu/gpu_quality.sh STEPS "tiny variant" ... ; everything lands in $OUT.
steps=${1:-1000}; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:) PYTHONUNBUFFERED=1
at="100,250,500,750,$steps"
CUDA_VISIBLE_DEVICES=0 timeout 570 python3 -m gem_trainer.bench.quality --preset h200 --steps "$steps" \
  --models gem,pooled_mlp,logreg --eval-at "$at" --out "$OUT/h200" > "$OUT/h200.log" 2>&1 &
( CUDA_VISIBLE_DEVICES=1 timeout 60 python3 -m pytest -q tests/test_no_sync_model.py > "$OUT/no_sync.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 300 python3 -m gem_trainer.bench.quality --preset h200 --steps "$steps" \
    --models gem_no_attention --eval-at "$at" --out "$OUT/h200_noattn" > "$OUT/h200_noattn.log" 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m gem_trainer --preset h200 --steps 300 --ckpt-every 50 \
    --eval-batches 0 --no-progress --ckpt-dir /tmp/gem_ck --log-dir "$OUT/ckpt_logs" > "$OUT/ckpt_run.log" 2>&1 ) &
if [ $# -gt 0 ]; then
  ( JOBS=2 LIMIT=300 bash tools/quality_sweep.sh 150 150 default "rank_buckets=0" > "$OUT/sweep150.txt" 2>&1 ) &
  JOBS=4 LIMIT=400 bash tools/quality_sweep.sh 600 150,300,600 "$@" > "$OUT/sweep600.txt" 2>&1
fi
wait
echo "=== tiny sweeps"; cat "$OUT"/sweep150.txt "$OUT"/sweep600.txt 2>/dev/null
echo "=== no-sync GPU test"; tail -n 3 "$OUT/no_sync.log"
echo "=== ckpt run"; python3 tools/trainer_summary.py "$OUT/ckpt_run.log" 2>&1 | head -3; grep -i "warning" "$OUT/ckpt_run.log" | head -3
echo "=== h200 no-attention"; grep -E " lr=[0-9.e+-]+: mean AUC|Error" "$OUT/h200_noattn.log"
echo "=== h200"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/h200.log"
