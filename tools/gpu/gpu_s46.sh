#!/usr/bin/env bash
# The forty-sixth session's GPU plan: an H200 was listed at the start, the first in four
# sessions. Issue 16's H200 figures under gem-model 0.6.3 / gem-trainer 0.2.22 (background
# compile with gem-parallel 0.3.12's GIL switch interval), then issue 15's table and the kernels'
# GPU tests. Three calls on one warm box, each writing summary.txt + all.tgz (tools/stage.sh):
#   PART=a  "cold": issue 16's command from empty inductor/Triton/--compile-aot folders (the
#           preset's default --compile-background), 200 steps; "warm": again over the filled
#           folders, 300 steps (gem-parallel 0.3.13: the kept variants load in the background);
#           "warmfg": 60 steps with --no-compile-background (they load before the first step);
#           "warm2" / "warmfg2": the pair again; "ckpt": warm, 300 steps with --ckpt-every 50 (the time left).
#   PART=b  "table": issue 15's table and length-mix sweep (`gem_kernels.bench.table`); "kt":
#           every kernel GPU test (`pytest kernels/tests -k gpu`, not stopping at a failure).
#   PART=c  "fp8": issue 16's command with --precision fp8_block_wgrad_bf16 (its own compiled
#           variants, over PART=a's caches), 200 steps; "mfu": the model's local-MFU bench.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in cold warm warmfg warm2 warmfg2 ckpt fp8; do [ -f "$OUT/$f.log" ] && { printf '%s ' $f; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady mfu time_to_first_step_s startup_s warmup_steps compiled_from_step recompiles_per_100_steps data_wait_frac ckpt_saves ckpt_stall_s ckpt_stall_frac ckpt_stall_per_save_s ckpt_final_wait_s ckpt_state_gb ckpt_delayed_steps | cut -c1-1200; grep -o '"compile_aot": {[^}]*}' "$OUT/$f.log" | tail -1 | cut -c1-300; }; done
  [ -f "$OUT/hop.log" ] && tail -25 "$OUT/hop.log" | cut -c1-200
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|whole|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }
  [ -f "$OUT/table.log" ] && sed -n '/^case/,$p' "$OUT/table.log" | grep -v '^{' | cut -c1-250
  [ -f "$OUT/kt.log" ] && { grep -E "FAILED|ERROR" "$OUT/kt.log" | head -20; tail -3 "$OUT/kt.log"; }; }
gpu_begin "${WATCH:-530}"
case ${PART:-a} in
a) export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
   st cold 190 python3 $H200_TR --steps 200
   st warm 120 python3 $H200_TR --steps 300
   st warmfg 70 python3 $H200_TR --steps 60 --no-compile-background
   st warm2 70 python3 $H200_TR --steps 60
   st warmfg2 70 python3 $H200_TR --steps 60 --no-compile-background
   rm -rf /tmp/ck; [ "$(gpu_left)" -gt 60 ] && st ckpt "$(gpu_left)" python3 $H200_TR --steps 300 --ckpt-every 50 --ckpt-dir /tmp/ck;;
c) export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
   st fp8 220 python3 $H200_TR --steps 200 --precision fp8_block_wgrad_bf16
   unset GEM_CACHE_DIR TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
   st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph;;
b) st table 220 bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7"
   st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests -k gpu;;
esac
gpu_end
