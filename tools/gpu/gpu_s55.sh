#!/usr/bin/env bash
# The fifty-fifth session's GPU plan (tools/stage.sh: summary.txt + all.tgz).
# PART=1 (after tools/gpu/gpu_s54.sh PART=1 passed the Gluon GPU tests and chose the tiles): the
#   trainer's h200 preset, 300 steps, GEM_JFA_GLUON=off vs dkdv,dq (the backward's two Gluon
#   kernels at their new default tiles), from empty caches each; steady MFU and step time.
#   (Run on 2026-12-07: over empty caches the 300 steps stayed eager; `WATCH=215 STEPS=250` over
#   the folders they left gave the compiled A/B, trainer/BENCHMARKS.md.)
# PART=2 (written for the next GPU, not yet run): the Gluon GPU tests at the new default tiles
#   and the model's local MFU (compiled, CUDA graph) with --jfa-gluon off vs dkdv,dq.
# PART=3 (next GPU, one call of ~520 s): a second trainer round, cold arms (they leave the
#   compiled variants in the arms' folders), then warm arms over them.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  [ -f "$OUT/gt.log" ] && { echo "=== gt"; grep -E "FAILED|passed|failed" "$OUT/gt.log" | tail -6 | cut -c1-300; }
  for f in mfu_off mfu_gl; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -iE "mfu" "$OUT/$f.log" | grep -v '^{' | tail -4 | cut -c1-200; }; done
  for f in "$OUT"/tr_*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; last_summary "$f" step_time_median mfu_steady first_step_s; grep -iE "error|Traceback" "$f" | tail -3 | cut -c1-300; }; done; }
gpu_begin "${WATCH:-520}"
case ${PART:-1} in
1) st tr_off 240 env GEM_JFA_GLUON=off $(arm_caches off) python3 $H200_TR --steps ${STEPS:-300}
   st tr_gluon "$(gpu_left)" env GEM_JFA_GLUON=dkdv,dq $(arm_caches gl) python3 $H200_TR --steps ${STEPS:-300};;
2) st gt 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gluon_jfa.py
   MFU="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
   st mfu_off 80 $MFU --jfa-gluon off
   st mfu_gl 80 $MFU --jfa-gluon dkdv,dq;;
3) for arm in off gl; do g=$([ $arm = off ] && echo off || echo dkdv,dq)
     [ "$(gpu_left)" -gt 100 ] && st tr_${arm}_cold 200 env GEM_JFA_GLUON=$g $(arm_caches $arm) python3 $H200_TR --steps 300; done
   for arm in off gl; do g=$([ $arm = off ] && echo off || echo dkdv,dq)
     [ "$(gpu_left)" -gt 60 ] && st tr_${arm}_warm 90 env GEM_JFA_GLUON=$g $(arm_caches $arm) python3 $H200_TR --steps 250; done;;
esac
gpu_end
