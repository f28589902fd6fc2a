#!/usr/bin/env bash
# The forty-second session's plan (written in the forty-first; reordered in the forty-second,
# when 466 s of the 1,800 s went to calls that found no machine). Only PART=c ran (an H100,
# trainer/BENCHMARKS.md); eleven calls found no machine. For the next session, in this order:
# PART=e (~2 min: is 0.6.2's option faster at the FFN?), PART=d (the trainer A/B and profile),
# then PART=a/b on a box that can carry flash-attn-4 (on an H200: the figures).
# The forty-third session ran PART=f (e and d in one call) on an H100 (trainer/BENCHMARKS.md);
# its H200 figures are tools/gpu/gpu_s43.sh.
#   PART=c  (first call; carries .fa4a, copied to /tmp/fa4a for PART=b on the same box; no
#           flash-attn-4 here) gem-model 0.6.1's `gather_stream_grads` A/B: the h200 trainer
#           with the option on ("new") against off ("old"), each from its own empty caches, then
#           one warm pair (`AB_FIELD=... AB_PAIRS=2 ab_runs`, tools/stage.sh). Keep it on by
#           default only if every pair is faster; the quality bench is unchanged by construction
#           (same gradients), but run its GEM row if it is made the default. Then, over the
#           "old" arm's warm caches (the default model), the step's profile with `--who 12`:
#           which ops launch the 2.6 ms per step of device-to-device copies and the three
#           full-size adds left in 0.6.0's step (the forty-first session's profile could only
#           count them).
#   PART=b  (second call, same box; carries .fa4b) installs flash-attn-4; on an H200: issue 16's
#           command (`--steps 300`, empty caches) and the model's local-MFU bench under 0.6.x
#           (the 40 % target: 37.6 % on an H100, ~41 % estimated for an H200). On an H100: the
#           profile with flash-attn-4 and `--who 12` (the copies inside its backward, if any).
#   PART=d  (written after PART=c's profile named the copies: torch.addmm copying the residual
#           into its output, 7 per step) gem-model 0.6.2's `inplace_residual_gemm` A/B, as
#           PART=c's, after its GPU test; then the profile of the "new" arm over its warm caches
#           (the copies gone? a copy kernel in their place?).
#   PART=e  (what 375 s of device time left could hold, after more calls found no machine)
#           PART=d's GPU test, then the FFN-level A/B instead of the trainer's:
#           `python3 -m gem_model.bench.residual_gemm` (the h200 GDPA FFN compiled, addmm
#           against in place, alternating).
#   PART=f  (the forty-third session's first call) PART=e's two stages, then PART=d's A/B and
#           profile, in one call (a second call may find no machine).
#   PART=a  (a box without PART=c's copy) copies .fa4a only, and profiles as PART=c does.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/tests.log" ] && { echo "=== tests"; tail -3 "$OUT/tests.log"; }
  [ -f "$OUT/resgemm.log" ] && { echo "=== residual_gemm"; grep -v '^{' "$OUT/resgemm.log" | tail -6; }
  for f in prof prof4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; sed -n '/=== who/,/^{/p' "$OUT/$f.log" | cut -c1-200; }; done
  for f in new1 old1 new2 old2 new3 old3; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median recompiles_per_100_steps | cut -c1-300; }; done
  [ -f "$OUT/long.log" ] && { printf 'long '; last_summary "$OUT/long.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
gpu_begin "${WATCH:-585}"
PROF="python3 tools/profile_trainer.py --preset h200 --steps 14 --skip 8 --compile --rows 40 --who 12"
if [ -f .fa4a/ir.so.xz ]; then mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/; fi
if [ "${PART:-a}" = c ]; then
  AB_FIELD=gather_stream_grads AB_PAIRS=2 ab_runs  # arm "new": the option on; "old": off
  [ "$(gpu_left)" -gt 60 ] && st prof "$(gpu_left)" env $(arm_caches old) $PROF
elif [ "${PART:-a}" = d ] || [ "${PART:-a}" = e ] || [ "${PART:-a}" = f ]; then
  # d: the GPU test, the trainer A/B, the "new" arm's profile; e: the test and the FFN bench;
  # f: all of them
  st tests 100 python3 -m pytest -q -p no:cacheprovider model/tests/test_stream_bias.py -k "gpu or cuda"
  [ "$PART" = e ] && st resgemm "$(gpu_left)" python3 -m gem_model.bench.residual_gemm
  [ "$PART" = f ] && st resgemm 80 python3 -m gem_model.bench.residual_gemm
  if [ "$PART" != e ]; then
    AB_FIELD=inplace_residual_gemm AB_PAIRS=2 ab_runs
    [ "$(gpu_left)" -gt 60 ] && st prof "$(gpu_left)" env $(arm_caches new) \
      python3 tools/with_model.py inplace_residual_gemm=true -- ${PROF#python3 }
  fi
elif [ "${PART:-a}" = a ]; then
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
