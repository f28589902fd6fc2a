#!/usr/bin/env bash
# The fifty-fourth session's GPU plan (tools/stage.sh: summary.txt + all.tgz), on what comes.
# PART=1: the Gluon twins of JFA's forward, dK/dV and dQ kernels (gem_kernels._gluon_jfa,
#   GEM_JFA_GLUON): their GPU tests against the Triton kernels and the reference, `bench.gluon`
#   (Triton vs Gluon tiles per kernel, whole backward and eager fwd+bwd with the switch off / on),
#   then test_gdpa's GPU tests (not run since 0.3.13).
# PART=2: the trainer's h200 preset, 300 steps, GEM_JFA_GLUON=off vs all (steady MFU).
# Written in the fifty-fourth session, which was lent no GPU: none of it has run yet.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in gt gdpa; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "FAILED|ERROR|passed|failed|Error" "$OUT/$f.log" | tail -12 | cut -c1-300; }; done
  [ -f "$OUT/gluon.log" ] && { echo "=== gluon"; grep -v "^{" "$OUT/gluon.log" | tail -n 24 | cut -c1-400; }
  for f in "$OUT"/tr_*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; last_summary "$f" step_time_median mfu_steady first_step_s; }; done; }
gpu_begin "${WATCH:-560}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
case ${PART:-1} in
1) st gt 170 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gluon_jfa.py
   st gluon 240 bash -c "cd kernels && python3 -m gem_kernels.bench.gluon --iters 10"
   st gdpa "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py -k "gpu";;
2) for r in ${ROUNDS:-1}; do
     st tr_triton_$r 200 env GEM_JFA_GLUON=off python3 $H200_TR --steps 300
     st tr_gluon_$r 200 env GEM_JFA_GLUON=all python3 $H200_TR --steps 300
   done;;
esac
gpu_end
