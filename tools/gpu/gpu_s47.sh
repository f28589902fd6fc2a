#!/usr/bin/env bash
# The forty-seventh session's GPU plan (tools/stage.sh: summary.txt + all.tgz). The forty-sixth
# session's plan found, on an H100, that every variant the background thread compiled was
# unreadable in the next process (it compiled while the parameters held gradients; fixed in
# gem-parallel 0.3.14). PART=a re-runs the warm-start A/B over caches the fixed code filled:
#   "cold"    issue 16's command from empty inductor/Triton/--compile-aot folders, 200 steps;
#   "warm" / "warm2"   over the filled folders, 60 steps (the kept variants load in the background);
#   "warmfg"  60 steps with --no-compile-background (they load before the first step);
#   "hold"    60 steps, the background worker held 4 s (tools/gpu/hold_probe.py): the first
#             step without the loads beside it;
#   "eager"   20 steps with --no-compile: the eager first step over a warm Triton cache.
# PART=h: issue 16's figures in one call (made for an H200; runs on what comes): "cold" 100
# steps from empty folders (it waits for the background compiles at the end, keeping them);
# "ckpt" 300 steps with --ckpt-every 50 over them; "steady" 300 steps; "warmfg" with time left.
# PART=b: issue 15's table (`gem_kernels.bench.table`) and every kernel GPU test.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in cold warm warmfg warm2 hold eager ckpt steady; do [ -f "$OUT/$f.log" ] && { printf '%s ' $f; last_summary "$OUT/$f.log" steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s startup_s warmup_steps compiled_from_step recompiles_per_100_steps ckpt_saves ckpt_stall_frac ckpt_stall_per_save_s ckpt_final_wait_s ckpt_state_gb | cut -c1-900; grep -o '"compile_aot": {[^}]*}' "$OUT/$f.log" | tail -1 | sed 's/"rejected": \[[^]]*\], //' | cut -c1-400; }; done
  [ -f "$OUT/table.log" ] && sed -n '/^case/,$p' "$OUT/table.log" | grep -v '^{' | cut -c1-250
  [ -f "$OUT/kt.log" ] && { grep -E "FAILED|ERROR" "$OUT/kt.log" | head -20; tail -3 "$OUT/kt.log"; }; }
gpu_begin "${WATCH:-530}"
case ${PART:-a} in
a) export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
   st cold 200 python3 $H200_TR --steps 200
   st warm 70 python3 $H200_TR --steps 60
   st warmfg 70 python3 $H200_TR --steps 60 --no-compile-background
   st warm2 70 python3 $H200_TR --steps 60
   st hold 70 python3 tools/gpu/hold_probe.py 4 --preset h200 --eval-batches 0 --no-progress --steps 60
   st eager "$(gpu_left)" python3 $H200_TR --steps 20 --no-compile;;
h) export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
   st cold 170 python3 $H200_TR --steps 100
   rm -rf /tmp/ck; st ckpt 110 python3 $H200_TR --steps 300 --ckpt-every 50 --ckpt-dir /tmp/ck
   st steady 100 python3 $H200_TR --steps 300
   [ "$(gpu_left)" -gt 35 ] && st warmfg "$(gpu_left)" python3 $H200_TR --steps 60 --no-compile-background;;
b) st table 220 bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7"
   st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests -k gpu;;
esac
gpu_end
