#!/usr/bin/env bash
# The fifty-first session's GPU plan (tools/stage.sh: summary.txt + all.tgz), on what comes.
# PART=1 (a fresh box, carries .ab: the session's starting kernels, made here by
#   `mkdir -p .ab/old && git archive 9175601 kernels/gem_kernels | tar -x -C .ab/old &&
#   cp kernels/gem_kernels/bench/eager.py .ab/old/kernels/gem_kernels/bench/`): "eager" (`gem_kernels.bench.eager --profile`: how much of issue
#   15's eager figures is host time: eager call vs CUDA-graph replay vs host time per call),
#   "eager_old" (the same over the starting kernels), "eager2" (ours again); then
#   session 50's planned PART=6: the shipped Triton manifest through "auto" on an empty box,
#   "a_cold" (issue 16's command, 100 steps, empty caches: the precompile workers start), then
#   "a_warm1" (300 steps over the filled caches: the marker, no worker); "prof" (the compiled
#   step's profile over the warm folders, owed since session 50); "a_warm2" while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in "$OUT"/a_*.log; do [ -f "$f" ] && { printf '%s ' "$(basename "$f" .log)"; last_summary "$f" steps loss step_s_median mfu_steady time_to_first_step_s startup_s warmup_steps compiled_from_step recompiles_per_100_steps triton_precompile jfa_backward | cut -c1-900; }; done
  for f in eager eager_old eager2 eager_old_1 eager_new_1 eager_old_2 eager_new_2; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; sed -n '/^case /,/^{/p' "$OUT/$f.log" | grep -v '^{'; }; done
  [ -f "$OUT/eager.log" ] && grep -A22 "^=== cProfile" "$OUT/eager.log" | grep -v "^$\|Ordered by\|List reduced\|function calls" | cut -c1-150
  [ -f "$OUT/kt.log" ] && { grep -E "FAILED|ERROR" "$OUT/kt.log" | head; tail -2 "$OUT/kt.log"; }
  [ -f "$OUT/prof.log" ] && { echo "=== prof"; grep -v '^{' "$OUT/prof.log" | grep -v "^W\|^gem: note" | tail -n 45 | cut -c1-180; }; }
gpu_begin "${WATCH:-560}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
case ${PART:-1} in
1) EG="python3 -m gem_kernels.bench.eager"
   st eager 100 env TRITON_CACHE_DIR=/tmp/tri_eager bash -c "cd kernels && $EG --profile"
   # the same bench over the session's starting kernels (.ab/old, carried), then ours again
   st eager_old 50 env TRITON_CACHE_DIR=/tmp/tri_eager PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG --profile"
   [ "$(gpu_left)" -gt 480 ] && st eager2 45 env TRITON_CACHE_DIR=/tmp/tri_eager bash -c "cd kernels && $EG"
   st a_cold 170 python3 $H200_TR --steps 100
   st a_warm1 90 python3 $H200_TR --steps 300
   st prof 120 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 60
   [ "$(gpu_left)" -gt 75 ] && st a_warm2 "$(gpu_left)" python3 $H200_TR --steps 300;;
2) # after gem-parallel 0.3.16 (PART=1's a_cold stopped: the background compile's fx patches reached
   # the main thread's eager blocks): the cold start again, then warm; the eager A/B again
   # (rounds alternating); the kernels' GPU tests of the changed launches while time is left.
   EG="python3 -m gem_kernels.bench.eager --iters 30"
   st a_cold 170 python3 $H200_TR --steps 100
   st a_warm1 90 python3 $H200_TR --steps 300
   for r in 1 2; do
     st eager_old_$r 40 env TRITON_CACHE_DIR=/tmp/gemc/tri PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG"
     st eager_new_$r 40 env TRITON_CACHE_DIR=/tmp/gemc/tri bash -c "cd kernels && $EG"
   done
   [ "$(gpu_left)" -gt 40 ] && st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_gdpa.py kernels/tests/test_launch.py -k "gpu or launch";;
esac
gpu_end
