#!/usr/bin/env bash
# The fifty-fifth session's GPU plan (tools/stage.sh: summary.txt + all.tgz).
# PART=1 (after tools/gpu/gpu_s54.sh PART=1 passed the Gluon GPU tests and chose the tiles): the
#   trainer's h200 preset, 300 steps, GEM_JFA_GLUON=off vs dkdv,dq (the backward's two Gluon
#   kernels at their new default tiles), from empty caches each; steady MFU and step time.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in "$OUT"/tr_*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; last_summary "$f" step_time_median mfu_steady first_step_s; grep -iE "error|Traceback" "$f" | tail -3 | cut -c1-300; }; done; }
gpu_begin "${WATCH:-520}"
case ${PART:-1} in
1) st tr_off 240 env GEM_JFA_GLUON=off $(arm_caches off) python3 $H200_TR --steps ${STEPS:-300}
   st tr_gluon "$(gpu_left)" env GEM_JFA_GLUON=dkdv,dq $(arm_caches gl) python3 $H200_TR --steps ${STEPS:-300};;
esac
gpu_end
