#!/usr/bin/env bash
# The fifty-sixth session's GPU plan (tools/stage.sh: summary.txt + all.tgz).
# PART=1: the warp-specialized Gluon forward's first run (probe, then its GPU tests), the forward
#   bench (Triton, cuDNN on the dense case, the one-stream Gluon forward, the WS tile sets), then
#   while time is left the model's local MFU off vs dkdv,dq (gpu_s55.sh PART=2's).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  [ -f "$OUT/probe.log" ] && { echo "=== probe"; tail -12 "$OUT/probe.log" | cut -c1-300; }
  [ -f "$OUT/gt.log" ] && { echo "=== gt"; grep -E "FAILED|passed|failed|Error" "$OUT/gt.log" | tail -8 | cut -c1-300; }
  [ -f "$OUT/fwd.log" ] && { echo "=== fwd"; sed -n '/^Forward/,/^$/p' "$OUT/fwd.log" | cut -c1-400; grep -E "Error|error" "$OUT/fwd.log" | tail -3 | cut -c1-300; }
  for f in mfu_off mfu_gl; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -iE "mfu" "$OUT/$f.log" | grep -v '^{' | tail -4 | cut -c1-200; }; done; }
gpu_begin "${WATCH:-540}"
case ${PART:-1} in
1) st probe 90 python3 tools/gpu/ws_probe.py
   if grep -q "rc=0" <(grep probe "$OUT/rcs.txt"); then
     st gt 170 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gluon_jfa.py -k "forward or nan or refused"
     st fwd 150 bash -c "cd kernels && python3 -m gem_kernels.bench.gluon --fwd-only --iters 10"
   fi
   MFU="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
   [ "$(gpu_left)" -gt 80 ] && st mfu_off 80 $MFU --jfa-gluon off
   [ "$(gpu_left)" -gt 60 ] && st mfu_gl "$(gpu_left)" $MFU --jfa-gluon dkdv,dq;;
esac
gpu_end
