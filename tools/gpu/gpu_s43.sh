#!/usr/bin/env bash
# The forty-third session's H200 figures for gem-model 0.6.3 (inplace_residual_gemm on by
# default), two calls on one warm box (flash-attn-4 is carried in two parts, tools/fa4_setup.sh):
#   PART=a  (carries .fa4a) on an H200 only (on another GPU it stops at once): copies the
#           compiler library to /tmp/fa4a; with LONG0=1, then issue 16's command without
#           flash-attn-4 (`--steps 300`, empty caches: "long0").
#   PART=b  (carries .fa4b, same box) installs flash-attn-4, then issue 16's command with it
#           ("long", empty caches) and the model's local-MFU bench (the 40 % target).
# Not run in the forty-third session: three calls for an H200 found no machine (570 s of
# device time), and what was left could not start one. The next session: PART=a, then PART=b.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in long0 long; do [ -f "$OUT/$f.log" ] && { printf '%s ' $f; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps data_wait_frac | cut -c1-420; }; done
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; exit 3; fi
gpu_begin "${WATCH:-400}"
if [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/ && echo "fa4a copied" > "$OUT/copy.log"
  [ -n "$LONG0" ] && st long0 "$(gpu_left)" python3 $H200_TR --steps 300
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st long 200 python3 $H200_TR --steps 300
  st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
fi
gpu_end
