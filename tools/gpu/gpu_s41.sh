#!/usr/bin/env bash
# The next session's plan (written in the fortieth, not run yet): what gem-model 0.6.0 (the h200
# preset's token stream without biases, GEMConfig.stream_bias=False) still owes a GPU.
#   PART=a  (carries .fa4a; copies .fa4a/ir.so.xz to /tmp/fa4a; no FlashAttention-4) FIRST the
#           quality bench's GEM row on the h200 preset (1,000 steps, the same samples and held-out
#           set; ~300 s on an H100: give it its own stage limit of 420 s). Compare 0.5.4's 0.7547 /
#           0.7644 / 0.7825 (click / conversion / engagement, H100, fortieth session). A loss beyond
#           the rows' ±0.01 sends the preset back to stream_bias=True.
#   PART=b  (carries .fa4b; installs FlashAttention-4) issue 16's command `--steps 300` under 0.6.0
#           from empty caches, then the step's profile (which glue kernels 0.6.0 removed), then, on
#           an H200 only, the model's local-MFU bench.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220; }
  [ -f "$OUT/long.log" ] && { printf 'long '; last_summary "$OUT/long.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }
  [ -f "$OUT/prof.log" ] && { echo "=== prof"; grep -E "kernel_s_per_step" "$OUT/prof.log" | tail -n 1 | cut -c1-200; }
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(GEM local|seq_attention|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }
}
gpu_begin "${WATCH:-585}"
if [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/
  st quality 420 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality"
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st long 260 python3 $H200_TR --steps 300
  st prof 150 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 120
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    st mfu $(gpu_left) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  fi
fi
gpu_end
