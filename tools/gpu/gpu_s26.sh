#!/usr/bin/env bash
# Twenty-sixth session's GPU plan on one H200:
#   PART=a  --compile-aot after its fix (torch 2.11 ships dynamo's enable_aot_compile off, so
#           session 25's run fell back to plain torch.compile for every block): cold store,
#           warm store (issue #16's 5 s warm start), then gem_parallel's test_aot on torch 2.11
#           and the trainer's slow-step/start-up GPU tests; the tiny run's slow steps with an
#           empty Triton cache (what outranked the injected slow step in session 25's GPU
#           test); the checkpointed h200 run after the train state moved to gem_parallel
#           (120 steps, --ckpt-every 50, then --resume to 150); last, the filled store with
#           empty inductor/Triton caches (a fresh machine).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for f in t_gpu slowtiny; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; tail -n 3 "$OUT/$f.log" | cut -c1-600; }; done
  for f in aot_cold aot_warm aot_warm2 ckpt resume aot_fresh; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss mfu_steady step_s_median time_to_first_step_s startup_s compile_aot compile_graphs resumed_from ckpt_saves ckpt_stall_per_save_s ckpt_stall_frac ckpt_state_gb ckpt_write_gb_per_s slow_steps; grep -v "^{" "$OUT/$f.log" | grep -v "is_fx\|^W1" | tail -n 3 | cut -c1-300; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
  st aot_cold 200 $TR --steps 60 --compile-aot /tmp/gem_aot
  ls -la /tmp/gem_aot/ > "$OUT/aot_files.log" 2>&1
  st aot_warm 90 $TR --steps 60 --compile-aot /tmp/gem_aot
  st aot_warm2 90 $TR --steps 30 --compile-aot /tmp/gem_aot
  st t_gpu 150 python3 -m pytest -q -p no:cacheprovider parallel/tests/test_aot.py trainer/tests/test_slow_steps.py trainer/tests/test_startup.py
  st slowtiny 60 env TRITON_CACHE_DIR=/tmp/tc_tiny python3 -c "
from gem_trainer import presets_tiny, train
s = train(presets_tiny(steps=16, batch_size=16, eval_batches=0, progress=False))
print('SLOW', [(o['step'], round(o['step_s'], 3), round(o['opt_host_s'], 3), o['gpu_s'] and round(o['gpu_s'], 3)) for o in s['slow_steps']], 'median', s['step_s_median'])"
  st ckpt 150 $TR --steps 120 --ckpt-every 50 --ckpt-dir /tmp/gem_ck --compile-aot /tmp/gem_aot
  st resume 100 $TR --steps 150 --ckpt-every 50 --ckpt-dir /tmp/gem_ck --resume --compile-aot /tmp/gem_aot
  st aot_fresh $(left 560) env TORCHINDUCTOR_CACHE_DIR=/tmp/ic_fresh TRITON_CACHE_DIR=/tmp/tc_fresh $TR --steps 30 --compile-aot /tmp/gem_aot ;;
esac
gpu_end
