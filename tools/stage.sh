# Sourced by the batched GPU scripts (gpu_system.sh, gpu_recheck.sh, gpu_mfu.sh, gpu_ab.sh, ...).
# st NAME LIMIT CMD...: runs CMD under `timeout LIMIT`, its output in $OUT/NAME.log, and a line
# "NAME rc=<exit> wall=<s>s" in $OUT/rcs.txt (rc 124: cut by the limit; SIGKILL 15 s later if the
# stage ignores SIGTERM: one 2-GPU call ran past the device limit and returned nothing).
st() { local name=$1 lim=$2; shift 2; local t=$(date +%s)
  timeout -k 15 "$lim" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? wall=$(( $(date +%s) - t ))s" >> "$OUT/rcs.txt"; }
export -f st

# The frame of a script whose call must return its logs even when a stage overruns:
#   define `summary` (prints the compact figures from the logs in $OUT), then
#   gpu_begin SECONDS   the logs go to $OUT=$TOP/r/a/b, below what the device sends back
#                       ($TOP = the caller's $OUT: only the summary and the archive return),
#                       and a watchdog writes both at SECONDS;
#   ... the stages (st) ...
#   gpu_end             stops the watchdog, writes both, prints the summary.
gpu_begin() { TOP=${OUT:-/tmp/out}; OUT=$TOP/r/a/b; mkdir -p "$OUT"; export OUT TOP
  GPU_T0=$(date +%s) GPU_WATCH=$1; ( sleep "$1"; _gpu_write ) & WATCHDOG=$!; }
# gpu_left: seconds left before the watchdog, less 15 (at least 1): the last stage's limit.
gpu_left() { local l=$(( GPU_WATCH - 15 - $(date +%s) + GPU_T0 )); echo $(( l > 1 ? l : 1 )); }
# The h200 trainer's arguments for the A/B stages (add --steps).
H200_TR="-m gem_trainer --preset h200 --eval-batches 0 --no-progress"
_gpu_write() { summary > "$TOP/summary.txt" 2>&1; tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null; }
gpu_end() { kill "$WATCHDOG" 2>/dev/null; _gpu_write; cat "$TOP/summary.txt"; }

# The two-tree A/B scripts (gpu_ab.sh, gpu_ab2.sh, gpu_short.sh, gpu_adagrad.sh; run from the
# folder holding both trees): `ab_trees A B` sets A, B, ROOT (that folder), PA / PB (each tree's
# module folders and tests/, for PYTHONPATH) and TR (the h200 trainer's 60-step A/B run).
ab_trees() { A=$1; B=$2; ROOT=$PWD
  PA=$(_tree_path "$A"):$ROOT/$A/tests; PB=$(_tree_path "$B"):$ROOT/$B/tests; export PYTHONUNBUFFERED=1
  TR="python3 -m gem_trainer --preset h200 --steps 60 --eval-batches 0 --no-progress"; }
_tree_path() { (cd "$ROOT/$1" && ls -d */gem_* | xargs -n1 dirname | sed "s|^|$ROOT/$1/|" | paste -sd:); }

# last_summary LOG KEY...: the trainer's summary (the last JSON line with `mfu_steady`) in LOG,
# reduced to KEYs, on one line ("no summary line" when the run printed none).
last_summary() { python3 - "$@" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'mfu_steady' in l]
print({k: rows[-1].get(k) for k in sys.argv[2:]} if rows else 'no summary line')
PY
}

# Two-model A/B of the h200 trainer on one box (gpu_s39.sh, gpu_s39b.sh): `ab_arm NAME STEPS`
# runs one arm in its own caches (/tmp/c_NAME); arm "old" puts $AB_OLD (the folder holding an
# older model/gem_model, unpacked under .ab/) first on PYTHONPATH. With $AB_FIELD (a GEMConfig
# bool) instead, one tree: arm "new" runs with that field true, "old" with it false
# (tools/with_model.py). `ab_runs` runs new, then old, each from empty caches (100 steps), then
# warm pairs alternating while time is left ($AB_PAIRS, default "2 3": the pairs' numbers).
# `arm_caches NAME`: the cache variables of arm NAME (for `env`: a later run over its warm caches).
arm_caches() { echo GEM_CACHE_DIR=/tmp/c_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/c_$1/ind TRITON_CACHE_DIR=/tmp/c_$1/tri; }
ab_arm() { local pp=$PYTHONPATH pre=
  if [ -n "$AB_FIELD" ]; then pre="tools/with_model.py $AB_FIELD=$([ "$1" = old ] && echo false || echo true) --"
  elif [ "$1" = old ]; then pp=$AB_OLD:$pp; fi
  env PYTHONPATH=$pp $(arm_caches "$1") python3 $pre $H200_TR --steps $2; }
export -f arm_caches ab_arm
ab_runs() { export AB_OLD AB_FIELD H200_TR
  st new1 170 bash -c "ab_arm new 100"
  [ "$(gpu_left)" -gt 150 ] && st old1 170 bash -c "ab_arm old 100"
  for i in ${AB_PAIRS:-2 3}; do
    [ "$(gpu_left)" -gt 45 ] && st new$i 50 bash -c "ab_arm new 100"
    [ "$(gpu_left)" -gt 45 ] && st old$i 50 bash -c "ab_arm old 100"
  done; }
