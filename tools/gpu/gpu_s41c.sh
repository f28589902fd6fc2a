#!/usr/bin/env bash
# Forty-first session, last calls: the model's local MFU under gem-model 0.6.0 (the h200 preset's
# bias-free token stream) against 0.5.4 on the same box, with flash-attn-4 (as every local-MFU row).
#   PART=a  (carries .fa4a) copies the compiler library to /tmp/fa4a; the stream-bias GPU test.
#   PART=b  (carries .fa4b and .ab/model054, the 0.5.4 model package) installs flash-attn-4, then
#           `python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph` under 0.6.0,
#           then under 0.5.4 (AB_OLD first on PYTHONPATH) while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/tests.log" ] && tail -n 2 "$OUT/tests.log"
  for f in mfu_new mfu_old; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(GEM local|seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers|whole)" "$OUT/$f.log" | cut -c1-160; }; done; }
gpu_begin "${WATCH:-585}"
if [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/
  st tests 120 python3 -m pytest -q -p no:cacheprovider model/tests/test_stream_bias.py -k gpu
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  MFU="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
  st mfu_new 260 $MFU
  [ "$(gpu_left)" -gt 120 ] && st mfu_old $(gpu_left) env PYTHONPATH=.ab/model054:$PYTHONPATH $MFU
fi
gpu_end
