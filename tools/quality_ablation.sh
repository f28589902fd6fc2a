#!/usr/bin/env bash
# GEM ablations on the h200 preset, one process per variant (an OOM or crash in one does not
# lose the others). Usage: bash tools/quality_ablation.sh STEPS EVAL_BATCHES "variant" ...
# Each line of $OUT/ablation.log: the bench's per-model line (mean AUC and per-task AUC).
steps=$1; evb=$2; shift 2
out=${OUT:-/tmp/ablation}; mkdir -p "$out"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:) PYTHONUNBUFFERED=1
first=1
for v in "$@"; do
  args=(--preset h200 --steps "$steps" --eval-batches "$evb" --eval-at "$steps" --baseline-lrs 3e-3
        --out "$out/$first")
  if [ "$v" = "default" ]; then args+=(--models gem,pooled_mlp); else args+=(--models "" --gem-variants "$v"); fi
  start=$(date +%s)
  timeout 200 python3 -m gem_trainer.bench.quality "${args[@]}" 2>&1 \
    | grep -E "lr=|Error|error:" | grep -v "^curves" | sed "s/^/[$v] /" | tee -a "$out/ablation.log"
  echo "[$v] wall $(( $(date +%s) - start )) s" | tee -a "$out/ablation.log"
  first=$((first + 1))
done
