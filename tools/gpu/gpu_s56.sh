#!/usr/bin/env bash
# The fifty-sixth session's GPU plan (tools/stage.sh: summary.txt + all.tgz).
# PART=1 (~600 s): the first GPU run of 0.3.16's Gluon work, correctness first: a probe of every
#   warp-specialized forward tile set (JFA, persistent, GDPA) with a deadlock limit, then their
#   GPU tests and the Gluon plan tests (test_gluon_jfa / test_gluon_gdpa), the eager plans' GPU
#   tests (test_attn_plan), and the forward bench if time is left.
# PART=4 (~500 s, after PART=1 passed): `bench.gluon --fwd-only` (Triton, cuDNN on the dense case,
#   the one-stream Gluon forward, the WS tile sets, GDPA's) then the model's local MFU: dkdv,dq
#   (the trainer's), all (with the fastest WS forward on the trainer's batch,
#   tools/gpu/ws_pick.py), off.
# PART=2 (after PART=1, once DEFAULT_FWD_TILES names the WS set that won there): the trainer's h200
#   preset, GEM_JFA_GLUON=dkdv,dq (the trainer's default) against all (adds the Gluon forward),
#   each from empty caches (they stay eager while the background compile runs), then warm over
#   the folders they left.
# PART=3 (an H200, when one is lent): issue 15's table and the trainer's 300 steps, the issue's
#   command.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  [ -f "$OUT/probe.log" ] && { echo "=== probe"; tail -12 "$OUT/probe.log" | cut -c1-300; }
  for f in gt plan; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "FAILED|passed|failed|Error" "$OUT/$f.log" | tail -8 | cut -c1-300; }; done
  [ -f "$OUT/fwd.log" ] && { echo "=== fwd"; sed -n '/^Forward/,/^$/p;/^GDPA/,/^$/p' "$OUT/fwd.log" | cut -c1-400; grep -E "Error|error" "$OUT/fwd.log" | tail -3 | cut -c1-300; }
  for f in mfu_gl mfu_all mfu_off; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -iE "mfu" "$OUT/$f.log" | grep -v '^{' | tail -4 | cut -c1-200; }; done
  [ -f "$OUT/table.log" ] && { echo "=== table"; tail -25 "$OUT/table.log" | grep -v '^{' | cut -c1-250; }
  for f in "$OUT"/tr_*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; last_summary "$f" step_time_median mfu_steady first_step_s jfa_gluon; grep -iE "error|Traceback" "$f" | tail -3 | cut -c1-300; }; done; }
gpu_begin "${WATCH:-585}"
case ${PART:-1} in
1) st probe 90 python3 tools/gpu/ws_probe.py
   if grep -q "rc=0" <(grep probe "$OUT/rcs.txt"); then
     st gt 230 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gluon_jfa.py kernels/tests/test_gluon_gdpa.py \
       -k "forward or nan or refused or gdpa or plan"
   fi
   # The eager plans (0.3.16 keys them by the Gluon switch): their GPU tests, switch off and on.
   st plan 100 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py
   [ "$(gpu_left)" -gt 120 ] && st fwd "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.gluon --fwd-only --iters 10";;
4) st fwd 200 bash -c "cd kernels && python3 -m gem_kernels.bench.gluon --fwd-only --iters 10"
   # The model's local MFU (compiled, CUDA graph): the trainer's dkdv,dq, then "all" with the
   # fastest WS forward on the trainer's batch (where one beat Triton there), then off.
   MFU="-m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
   WS=$(python3 tools/gpu/ws_pick.py "$OUT/gluon_fwd.json" 2>/dev/null); echo "ws pick: ${WS:-none}" >> "$OUT/rcs.txt"
   [ "$(gpu_left)" -gt 80 ] && st mfu_gl 80 python3 $MFU --jfa-gluon dkdv,dq
   [ -n "$WS" ] && [ "$(gpu_left)" -gt 80 ] && st mfu_all 80 python3 -c "import runpy, sys
from gem_kernels import _gluon_jfa as g; g.DEFAULT_FWD_TILES = $WS
runpy.run_module('gem_model.bench.local_mfu', run_name='__main__')" --compile --no-reference --cuda-graph --jfa-gluon all
   [ "$(gpu_left)" -gt 80 ] && st mfu_off "$(gpu_left)" python3 $MFU --jfa-gluon off;;
2) for arm in gl all; do g=$([ $arm = gl ] && echo dkdv,dq || echo all)
     [ "$(gpu_left)" -gt 100 ] && st tr_${arm}_cold 200 env GEM_JFA_GLUON=$g $(arm_caches $arm) python3 $H200_TR --steps 300; done
   for arm in gl all; do g=$([ $arm = gl ] && echo dkdv,dq || echo all)
     [ "$(gpu_left)" -gt 60 ] && st tr_${arm}_warm 90 env GEM_JFA_GLUON=$g $(arm_caches $arm) python3 $H200_TR --steps 250; done;;
3) st table 300 bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7 --no-sweep"
   st tr_h200 "$(gpu_left)" python3 $H200_TR --steps 300;;
esac
gpu_end
