#!/usr/bin/env bash
# Thirty-fifth session, one Hopper box, one call: gem-precision 0.3.6's forward_slice and
# gem-model 0.5.1 (the rows-only last layer slices a converted wqkv: q for the slot rows
# only under FP8 recipes too). 0.5.0 for the A/B is commit c3aab35's model/gem_model,
# unpacked by
#   mkdir -p .ab/model050 && git archive c3aab35 model/gem_model | tar x -C .ab/model050 --strip-components=1
# (git-ignored; the call carries `.ab`), put first on PYTHONPATH.
# Stages: the slice's GPU tests (cuBLAS, eager and compiled, at the h200 wqkv's size); then
# the h200 trainer in eager mode (no compile: this call has no time for 4 cold compiles),
# 40 steps each: fp8_block 0.5.1, fp8_block 0.5.0, bf16 0.5.1, then fp8_block 0.5.1 again
# while time is left (WATCH: the call's seconds; 175 fits the first three; a shorter WATCH
# runs the tests and the stages that fit).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
OLD="env PYTHONPATH=.ab/model050:$PYTHONPATH"
[ -f .ab/model050/gem_model/__init__.py ] || { echo "gpu_s35: no .ab/model050: unpack 0.5.0 (header) and carry .ab" >&2; exit 2; }
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/gputest.log" ] && { echo "=== gpu test"; tail -n 1 "$OUT/gputest.log" | cut -c1-200; }
  for f in f1 f0 b1 f2; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" steps loss step_s_median step_gpu_s_median mfu_steady precision_effective model_version | cut -c1-400; }; done
}
gpu_begin "${WATCH:-175}"
TR="$H200_TR --no-compile --steps ${STEPS:-40}"
st gputest 55 python3 -m pytest -q -p no:cacheprovider precision/tests/test_slice.py -k gpu
# each trainer stage only while 35 s are left (a short call runs the tests and what fits)
[ "$(gpu_left)" -gt 35 ] && st f1 40 python3 $TR --precision fp8_block
[ "$(gpu_left)" -gt 35 ] && st f0 40 $OLD python3 $TR --precision fp8_block
[ "$(gpu_left)" -gt 35 ] && st b1 40 python3 $TR
[ "$(gpu_left)" -gt 30 ] && st f2 $(gpu_left) python3 $TR --precision fp8_block
gpu_end
