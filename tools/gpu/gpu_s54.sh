#!/usr/bin/env bash
# The fifty-fourth session's GPU plan (tools/stage.sh: summary.txt + all.tgz), on what comes.
# PART=1: the Gluon twins of JFA's forward, dK/dV and dQ kernels (gem_kernels._gluon_jfa,
#   GEM_JFA_GLUON): their GPU tests against the Triton kernels and the reference, `bench.gluon`
#   (Triton vs Gluon tiles per kernel, whole backward and eager fwd+bwd with the switch off / on),
#   then test_gdpa's GPU tests (not run since 0.3.13).
#   With time left: issue 15's table with GEM_JFA_GLUON=all.
# PART=2: the trainer's h200 preset, 300 steps, GEM_JFA_GLUON=off vs all (steady MFU); then the
#   model's local MFU (compiled, CUDA graph) both ways. Run it only once PART=1's tests pass.
# Written in the fifty-fourth session, which was lent no GPU: none of it has run yet.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in gt gdpa; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "FAILED|ERROR|passed|failed|Error" "$OUT/$f.log" | tail -12 | cut -c1-300; }; done
  [ -f "$OUT/gluon.log" ] && { echo "=== gluon"; grep -v "^{" "$OUT/gluon.log" | tail -n 24 | cut -c1-400; }
  for f in "$OUT"/tr_*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; last_summary "$f" step_time_median mfu_steady first_step_s; }; done
  for f in mfu_off mfu_all; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -iE "mfu" "$OUT/$f.log" | grep -v '^{' | tail -4 | cut -c1-200; }; done
  [ -f "$OUT/table.log" ] && { echo "=== table (GEM_JFA_GLUON=all)"; grep -v '^{' "$OUT/table.log" | tail -n 30 | cut -c1-220; }; }
gpu_begin "${WATCH:-560}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
case ${PART:-1} in
1) st gt 200 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gluon_jfa.py
   st gluon 220 bash -c "cd kernels && python3 -m gem_kernels.bench.gluon --iters 10"
   st gdpa 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py -k "gpu"
   [ "$(gpu_left)" -gt 90 ] && st table "$(gpu_left)" env GEM_JFA_GLUON=all bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7 --no-sweep";;
2) for r in ${ROUNDS:-1}; do
     st tr_triton_$r 200 env GEM_JFA_GLUON=off python3 $H200_TR --steps 300
     st tr_gluon_$r 200 env GEM_JFA_GLUON=all python3 $H200_TR --steps 300
   done
   MFU="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
   [ "$(gpu_left)" -gt 150 ] && st mfu_off 70 env GEM_JFA_GLUON=off $MFU
   [ "$(gpu_left)" -gt 80 ] && st mfu_all "$(gpu_left)" env GEM_JFA_GLUON=all $MFU;;
esac
gpu_end
