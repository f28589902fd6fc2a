#!/usr/bin/env bash
# Tiny-preset GEM variants on CPU, several processes at once (on a many-core box).
# Usage: JOBS=6 bash tools/quality_sweep.sh STEPS EVAL_AT "variant" ...
#   "default": gem + every baseline in one process (baselines replay gem's stream);
#   otherwise a --gem-variants string, e.g. "num_heads=4" or "lr=3e-3;num_layers=3".
# Writes $OUT/sweep_<steps>/<i>.log; prints one line per variant (mean and per-task AUC).
steps=$1; eval_at=$2; shift 2
out=${OUT:-/tmp/sweep}/sweep_$steps; mkdir -p "$out"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:) PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${THREADS:-2}
one() {
  local i=$1 v=$2 args=(--preset tiny --cpu --steps "$steps" --eval-at "$eval_at" --out "$out/$1")
  if [ "$v" = default ]; then args+=(--models gem,gem_no_attention,pooled_mlp,logreg)
  else args+=(--models "" --gem-variants "$v"); fi
  timeout "${LIMIT:-560}" ${PY:-python3} -m gem_trainer.bench.quality "${args[@]}" > "$out/$i.log" 2>&1
  grep -E " lr=[0-9.e+-]+: mean AUC" "$out/$i.log" | sed "s/^ */[$steps $v] /"
}
export -f one; export steps eval_at out PY
i=0; for v in "$@"; do i=$((i + 1)); printf '%s\0%s\0' "$i" "$v"; done \
  | xargs -0 -n2 -P "${JOBS:-6}" bash -c 'one "$0" "$1"'
