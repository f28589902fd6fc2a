#!/usr/bin/env bash
# One H200 (~7 minutes), from the folder holding both trees: bash B/tools/gpu/gpu_short.sh A B
# B = A + the short-kv GDPA kernels (several q tiles per program) + our JFA backward for short
# query sequences (the pooling seeds). One stage after the other:
#   B's GPU tests of the two changes; `bench.gdpa --short` (q tiles per program A/B);
#   `bench.bwd --only pma` (the pooling backward: ours vs FlashAttention-2); the h200 trainer
#   60 steps, tree A then tree B (with FLASH=1 also B with GEM_JFA_BWD=flash: the GDPA change
#   alone). The quality bench on B is a separate call (~400 s).
. "$(dirname "$0")/../stage.sh"
ab_trees "$1" "$2"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in tr_a tr_b tr_b_flash; do echo "=== $r"; [ -f "$OUT/$r.log" ] && (cd "$ROOT/$B" && python3 tools/trainer_summary.py "$OUT/$r.log" | head -1); done
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
  echo "=== tests"; tail -n 3 "$OUT/tests.log" | cut -c1-300
  echo "=== gdpa short"; grep -E "^\| |^config|one tile|short kernels" "$OUT/gdpa_short.log" | grep -v "^{" | cut -c1-160 | tail -n 20
  echo "=== bwd pma"; grep -A4 "^JFA backward" "$OUT/bwd_pma.log" | cut -c1-260
  echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
}
gpu_begin "${WATCH:-560}"
cd "$ROOT/$B"; export PYTHONPATH=$PB
st tests 90 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_gdpa.py kernels/tests/test_jfa_flash2.py -k "gpu"
st gdpa_short 60 python3 -m gem_kernels.bench.gdpa --short
st bwd_pma 40 python3 -m gem_kernels.bench.bwd --only pma --out "$OUT"
(cd "$ROOT/$A"; PYTHONPATH=$PA st tr_a 150 $TR)
st tr_b 130 $TR
[ "${FLASH:-0}" = 1 ] && GEM_JFA_BWD=flash st tr_b_flash 70 $TR
gpu_end
