#!/usr/bin/env bash
# Twenty-fourth session's GPU plan on one H200:
#   PART=a  what the slow steady steps 15 and 46 of the h200 trainer spend (session 24's first
#           call showed no garbage collection in them, with or without a freeze): the profile
#           of the windows around step 15 (cold box: includes the compile) and around step 46
#           (warm), with the CUDA runtime stalls, CPU self time, kernel excess and the caching
#           allocators' counters per step (tools/slow_step_probe.py).
#   PART=b  the blocks compiled ahead of time (--compile-aot, gem_parallel.AotBlocks): the h200
#           trainer 60 steps with an empty store (compiles and saves), again (loads: the warm
#           time to first step), then the plain compiled path (warm caches) for comparison,
#           then the filled store with empty inductor/Triton caches (a fresh machine); plus
#           the GPU test of the per-step device time (test_slow_steps).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/t_slow.log" ] && { echo "=== t_slow"; tail -n 3 "$OUT/t_slow.log" | cut -c1-300; }
  for f in aot_cold aot_warm plain_warm aot_fresh; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'mfu_steady' in l]
keys = ('steps', 'loss', 'mfu_steady', 'step_s_median', 'step_gpu_s_median', 'time_to_first_step_s', 'compile_aot', 'compile_graphs', 'recompiles_per_100_steps', 'slow_steps')
print({k: rows[-1].get(k) for k in keys} if rows else 'no summary line')" "$OUT/$f.log"; grep -v "^{" "$OUT/$f.log" | grep -v "is_fx\|^W1" | tail -n 4 | cut -c1-300; }; done
  for f in probe15 probe46; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -v "^W1\|is_fx\|USDT\|warn" "$OUT/$f.log" | sed -n '/^slow_steps/,$p' | cut -c1-400; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  st probe15 300 python3 tools/slow_step_probe.py --steps 20 --first 12 --last 17 --json "$OUT/probe15.json"
  st probe46 $(left 560) python3 tools/slow_step_probe.py --steps 50 --first 43 --last 48 --json "$OUT/probe46.json" ;;
b)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60"
  st aot_cold 240 $TR --compile-aot /tmp/gem_aot
  ls -la /tmp/gem_aot/* > "$OUT/aot_files.log" 2>&1
  st aot_warm 100 $TR --compile-aot /tmp/gem_aot
  st plain_warm 100 $TR
  # a fresh machine given the filled store: empty inductor and Triton caches (do the files
  # carry built kernels on CUDA? on CPU they do not: 33.8 s for the tiny preset)
  st aot_fresh 150 env TORCHINDUCTOR_CACHE_DIR=/tmp/ic_fresh TRITON_CACHE_DIR=/tmp/tc_fresh $TR --compile-aot /tmp/gem_aot
  st t_slow $(left 560) python3 -m pytest -q -p no:cacheprovider trainer/tests/test_slow_steps.py ;;
esac
gpu_end
