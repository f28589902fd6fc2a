#!/usr/bin/env bash
# The next session's plan (written in the forty-first, not run yet).
#   PART=a  (carries .fa4a) copies the compiler library to /tmp/fa4a; then the step's profile
#           without flash-attn-4 with `--who 12`: which ops launch the 2.6 ms per step of
#           device-to-device copies and the three full-size adds left in 0.6.0's step (the
#           forty-first session's profile could only count them).
#   PART=b  (carries .fa4b) installs flash-attn-4; on an H200: issue 16's command (`--steps 300`,
#           empty caches) and the model's local-MFU bench under 0.6.0 (the 40 % target: 37.6 % on
#           an H100, ~41 % estimated for an H200). On an H100: the profile again with flash-attn-4
#           and `--who 12` (the copies inside its backward, if any).
#   PART=c  (no flash-attn-4; one box) gem-model 0.6.1's `gather_stream_grads` A/B: the h200
#           trainer with the option on against off, each from its own empty caches, then warm
#           pairs alternating (`tools/with_model.py`).
#           Keep it on by default only if every pair is faster; the quality bench is unchanged by
#           construction (same gradients), but run its GEM row if it is made the default.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in prof prof4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; sed -n '/=== who/,/^{/p' "$OUT/$f.log" | cut -c1-200; }; done
  for f in on1 off1 on2 off2 on3 off3; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median recompiles_per_100_steps | cut -c1-300; }; done
  [ -f "$OUT/long.log" ] && { printf 'long '; last_summary "$OUT/long.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
gpu_begin "${WATCH:-585}"
PROF="python3 tools/profile_trainer.py --preset h200 --steps 14 --skip 8 --compile --rows 40 --who 12"
gab() {  # gab NAME on|off STEPS: one arm of the gather_stream_grads A/B in its own caches
  env GEM_CACHE_DIR=/tmp/c_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/c_$1/ind TRITON_CACHE_DIR=/tmp/c_$1/tri \
    python3 tools/with_model.py gather_stream_grads=$([ "$2" = on ] && echo true || echo false) -- $H200_TR --steps $3; }
export -f gab; export H200_TR
if [ "${PART:-a}" = c ]; then
  st on1 170 bash -c "gab on on 100"
  [ "$(gpu_left)" -gt 150 ] && st off1 170 bash -c "gab off off 100"
  for i in 2 3; do
    [ "$(gpu_left)" -gt 45 ] && st on$i 50 bash -c "gab on on 100"
    [ "$(gpu_left)" -gt 45 ] && st off$i 50 bash -c "gab off off 100"
  done
elif [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/
  st prof 240 $PROF
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    st long 260 python3 $H200_TR --steps 300
    st mfu $(gpu_left) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  else
    st prof4 200 $PROF
  fi
fi
gpu_end
