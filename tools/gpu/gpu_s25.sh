#!/usr/bin/env bash
# Twenty-fifth session's GPU plan on one H200 (written while no device was lent; session 24's
# PART=b never ran, so it is this plan's first part):
#   PART=a  the blocks compiled ahead of time (--compile-aot, gem_parallel.AotBlocks): the h200
#           trainer 60 steps with an empty store (compiles and saves), again (loads: the warm
#           time to first step against issue #16's 5 s), the plain compiled path (warm caches),
#           then the filled store with empty inductor/Triton caches (a fresh machine: do the
#           files carry built kernels on CUDA?), and the same with the cold run's
#           --compile-cache file (the best fresh-machine start). Each run's summary now splits its time to
#           first step (`startup_s`: setup, build, parallelize, loader, first batch, first
#           forward+backward, first optimizer, first device wait): where the warm start's
#           5.2 s outside torch.compile goes. Then the GPU tests of the per-step device time
#           and of the start-up phases (test_slow_steps, test_startup).
#   PART=b  the checkpointed h200 run after the train state moved to gem_parallel
#           (`Parallelized.train_state`): 120 steps, --ckpt-every 50 (stall per save, state size,
#           write rate against the sixteenth session's 0.082 s / 3.34 GB), then --resume to 150 on
#           the same folder (the loaded step, the loss continuing).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/t_gpu.log" ] && { echo "=== t_gpu"; tail -n 3 "$OUT/t_gpu.log" | cut -c1-300; }
  for f in aot_cold aot_warm plain_warm aot_fresh aot_fresh_cc ckpt resume; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss mfu_steady step_s_median step_gpu_s_median time_to_first_step_s startup_s compile_aot compile_cache compile_cache_entries compile_graphs recompiles_per_100_steps resumed_from ckpt_saves ckpt_stall_per_save_s ckpt_stall_frac ckpt_state_gb ckpt_write_gb_per_s; grep -v "^{" "$OUT/$f.log" | grep -v "is_fx\|^W1" | tail -n 4 | cut -c1-300; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60"
  st aot_cold 240 $TR --compile-aot /tmp/gem_aot --compile-cache /tmp/gem_cc.bin
  ls -la /tmp/gem_aot/* > "$OUT/aot_files.log" 2>&1
  st aot_warm 100 $TR --compile-aot /tmp/gem_aot
  st plain_warm 100 $TR
  st aot_fresh 120 env TORCHINDUCTOR_CACHE_DIR=/tmp/ic_fresh TRITON_CACHE_DIR=/tmp/tc_fresh $TR --compile-aot /tmp/gem_aot
  # ... and with the compile-cache file the cold run wrote (inductor's graphs and, on CUDA, the
  # Triton kernels they built): the best start a fresh machine can get
  st aot_fresh_cc 120 env TORCHINDUCTOR_CACHE_DIR=/tmp/ic_fresh2 TRITON_CACHE_DIR=/tmp/tc_fresh2 $TR --compile-aot /tmp/gem_aot --compile-cache /tmp/gem_cc.bin
  st t_gpu $(left 560) python3 -m pytest -q -p no:cacheprovider trainer/tests/test_slow_steps.py trainer/tests/test_startup.py ;;
b)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
  st ckpt 300 $TR --steps 120 --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  st resume $(left 560) $TR --steps 150 --ckpt-every 50 --ckpt-dir /tmp/gem_ck --resume ;;
esac
gpu_end
