#!/usr/bin/env bash
# Thirty-first session's last call, one H200 box (the reply names the card), gem-parallel 0.3.10:
#   long      the h200 trainer, 60 steps, from an empty folder and caches: with inductor's
#             mix-order reduction in its non-strict mode the store should compile 2 variants,
#             not 4 (PART=cd of gpu_s30.sh, the same session: 4, the later 2 for batches of
#             fewer than 256 samples, guarded in scheduler.py's can_fuse); its steady step
#             against that run's 0.2323 s (another box);
#   off1/on1 .. off3/on3  warm 2-step starts over the filled folder, alternating: "off" with
#             gem_parallel.start_triton_key replaced by a no-op (the key computed inside the
#             first step's load, as before 0.3.10), "on" as shipped (computed in a thread from
#             the start of train()). Ran at commit cce3e3b on an H100 (no H200 came); the
#             thread gave no gain beyond the box's noise (trainer/BENCHMARKS.md) and was removed
#             in the next commit, so on a later tree the "off" and "on" runs are the same.
#   PART=next (the plan for the next H200 call) the long run, then two plain warm 2-step
#             starts (warm1, warm2): the H200's step and variants under 0.3.10, and its warm start.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/long.log" ] && { echo "=== long"; last_summary "$OUT/long.log" steps loss time_to_first_step_s compile_aot recompiles_per_100_steps mfu_steady step_s_median | cut -c1-1500; }
  for f in off1 on1 off2 on2 off3 on3 warm1 warm2; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; python3 -c "
import json; s = [json.loads(l) for l in open('$OUT/$f.log') if l.startswith('{') and 'mfu_steady' in l][-1]
p = s['startup_s']; a = s['compile_aot']
print('ttfs %.2f setup %.2f loader %.3f before_first_step %.3f first_fb %.2f load_s %.2f loaded %d compiled %d' % (s['time_to_first_step_s'], p['setup'], p['loader'], p['before_first_step'], p['first_forward_backward'], a['load_s'], a['loaded'], a['compiled']))" 2>&1 | tail -1; }; done
}
gpu_begin "${WATCH:-470}"
TR="--preset h200 --eval-batches 0 --no-progress"
OFF="import runpy, sys, gem_parallel; gem_parallel.start_triton_key = lambda: None; sys.argv[0] = 'gem_trainer'; runpy.run_module('gem_trainer', run_name='__main__', alter_sys=True)"
st long "${LIM:-280}" python3 -m gem_trainer $TR --steps "${STEPS:-60}"
[ "${PART:-}" = next ] && { st warm1 60 python3 -m gem_trainer $TR --steps 2; st warm2 60 python3 -m gem_trainer $TR --steps 2; }
[ "${PART:-}" = next ] || for i in 1 2 3; do
  st off$i 60 python3 -c "$OFF" $TR --steps 2
  st on$i 60 python3 -m gem_trainer $TR --steps 2
done
gpu_end
