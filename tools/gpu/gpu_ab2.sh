#!/usr/bin/env bash
# One H200 (~7 minutes), from the folder holding both trees: bash B/tools/gpu/gpu_ab2.sh A B
# B = A + short-kv GDPA kernels (8 q tiles per program) + event tokens built in the CLS layout
# + rope_qkv's one-pass backward. One stage after the other:
#   B's GDPA GPU tests (the new kernels at real sizes, causal/window);
#   the h200 trainer 60 steps, tree A then tree B (same GPU, one after the other);
#   B's compiled step under the profiler (the removed kernels must be gone).
# The quality bench on B is a separate call (~380 s).
. "$(dirname "$0")/../stage.sh"
ab_trees "$1" "$2"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in tr_a tr_b; do echo "=== $r"; [ -f "$OUT/$r.log" ] && (cd "$ROOT/$B" && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1); done
  echo "=== tests"; tail -n 2 "$OUT/tests.log" | cut -c1-300
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
  [ -f "$OUT/trace.json.gz" ] && python3 - "$OUT/trace.json.gz" <<'PY'
import gzip, json, sys, collections
ev = [e for e in json.load(gzip.open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
tot = collections.Counter()
for e in ev:
    tot[e["name"][:70]] += e["dur"]
s = sum(tot.values())
print(f"kernel ms total {s / 1e3:.1f}")
for n, d in tot.most_common(25):
    print(f"{d / 1e3:9.2f} {n}")
PY
}
gpu_begin "${WATCH:-520}"
cd "$ROOT/$B"; export PYTHONPATH=$PB
st tests 70 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_gdpa.py -k "gpu"
(cd "$ROOT/$A"; PYTHONPATH=$PA st tr_a 150 $TR)
st tr_b 130 $TR
st profile 100 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 --trace "$OUT/trace.json"
[ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json"
gpu_end
