#!/usr/bin/env bash
# The fifty-second session's GPU plan (tools/stage.sh: summary.txt + all.tgz), on what comes.
# PART=1 (carries .ab: the session's starting kernels, made here by
#   `mkdir -p .ab/old && git archive 7c342d4 kernels/gem_kernels | tar -x -C .ab/old`):
#   gem-kernels 0.3.12's eager plans for JFA and GDPA: `gem_kernels.bench.eager` over the new
#   tree and the old one, alternating (2 rounds, 30 calls per figure); the GPU tests of the plans
#   (test_attn_plan.py) and of the cached launches' respecialization (never run on a GPU in
#   their shared form); then issue 15's table (`bench.table`, with its `ours_device` column).
# PART=2: the trainer (issue 16): cold 100 steps from empty folders, warm 300 (finishes the
#   background compiles), the compiled step's steady profile over complete folders (owed since
#   session 50), a cProfile of a warm start (where the ~5.5 s to the first step go), and a
#   last warm 300-step run for the MFU figure.
# (PART=3 and PART=4 never ran: no machine came for them; PART=5 took what time was left.)
# PART=3 (after the GPU-sized test_attn_plan): the plan tests again, then the eager A/B rounds 3
#   and 4 (round 3's new tree with --profile: the forward+backward rows' host time by function).
# PART=4: the warm start as a user's machine has it, with Python's bytecode caches: cold 100
#   steps; "pyc_w" (PYTHONDONTWRITEBYTECODE unset, PYTHONPYCACHEPREFIX=/tmp/pyc: writes them,
#   finishes the background compiles); then "pyc_r" (reads them) and "box" (the lent box's
#   setting: no bytecode) alternating, 100 steps each.
# PART=5 (gem-trainer 0.2.29; PART=3 and 4 found no machine): the plan tests again; cold 100
#   steps, then 300 (finishes the background compiles); then the warm start with the
#   background jobs held until the first step is booked ("hold", the new default) against
#   jobs started at the blocks' first calls ("nohold": --no-compile-background-after-first-step),
#   alternating, 60 steps each; round 3's eager A/B with --profile while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in "$OUT"/a_*.log; do [ -f "$f" ] && { printf '%s ' "$(basename "$f" .log)"; last_summary "$f" steps loss step_s_median mfu mfu_steady time_to_first_step_s startup_s compiled_from_step compute_s recompiles_per_100_steps | cut -c1-800; }; done
  for f in eager_new_1 eager_old_1 eager_new_2 eager_old_2 eager_new_3 eager_old_3 eager_new_4 eager_old_4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; sed -n '/^case /,/^{/p' "$OUT/$f.log" | grep -v '^{'; }; done
  [ -f "$OUT/kt.log" ] && { echo "=== kt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/kt.log" | tail -8; }
  [ -f "$OUT/eager_new_3.log" ] && grep -A20 "^=== cProfile" "$OUT/eager_new_3.log" | grep -v "^$\|Ordered by\|List reduced\|function calls" | cut -c1-150
  [ -f "$OUT/table.log" ] && { echo "=== table"; grep -v '^{' "$OUT/table.log" | tail -n 30 | cut -c1-220; }
  [ -f "$OUT/prof.log" ] && { echo "=== prof"; grep -v '^{' "$OUT/prof.log" | grep -v "^W\|^gem: note" | tail -n 40 | cut -c1-170; }
  [ -f "$OUT/ttfs_prof.txt" ] && { echo "=== warm start cProfile (cumulative)"; head -45 "$OUT/ttfs_prof.txt" | cut -c1-160; }; }
gpu_begin "${WATCH:-560}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
case ${PART:-1} in
1) EG="python3 -m gem_kernels.bench.eager --iters 30"
   for r in 1 2; do
     st eager_new_$r 70 bash -c "cd kernels && $EG"
     st eager_old_$r 70 env PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG"
   done
   st kt 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py kernels/tests/test_jfa.py kernels/tests/test_block.py kernels/tests/test_gdpa.py -k "plan or respecializes or gpu_real or gpu_matches"
   st table "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7 --no-sweep";;
2) st a_cold 170 python3 $H200_TR --steps 100
   st a_warm1 160 python3 $H200_TR --steps 300
   st prof 110 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 12 --compile --rows 60
   st ttfs 60 python3 -c "import cProfile,pstats,sys; sys.argv=['ttfs','--preset','h200','--steps','1']; cProfile.run(open('tools/ttfs.py').read(),'$OUT/ttfs.prof'); pstats.Stats('$OUT/ttfs.prof', stream=open('$OUT/ttfs_prof.txt','w')).sort_stats('cumulative').print_stats(60)"
   [ "$(gpu_left)" -gt 80 ] && st a_warm2 "$(gpu_left)" python3 $H200_TR --steps 300;;
3) EG="python3 -m gem_kernels.bench.eager --iters 30"
   st kt 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py
   st eager_new_3 90 bash -c "cd kernels && $EG --profile"
   st eager_old_3 70 env PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG"
   st eager_new_4 70 bash -c "cd kernels && $EG"
   st eager_old_4 70 env PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG";;
4) PYC="env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc"
   st a_cold 170 python3 $H200_TR --steps 100
   st a_pyc_w 170 $PYC python3 $H200_TR --steps 300
   for r in 1 2; do
     [ "$(gpu_left)" -gt 60 ] && st a_pyc_r$r 60 $PYC python3 $H200_TR --steps 100
     [ "$(gpu_left)" -gt 60 ] && st a_box$r 60 python3 $H200_TR --steps 100
   done;;
5) st kt 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py
   st a_cold 170 python3 $H200_TR --steps 100
   st a_fill 170 python3 $H200_TR --steps 300
   for r in ${ROUNDS:-1 2 3}; do
     [ "$(gpu_left)" -gt 100 ] && st a_hold$r 50 python3 $H200_TR --steps 60
     [ "$(gpu_left)" -gt 50 ] && st a_nohold$r 50 python3 $H200_TR --steps 60 --no-compile-background-after-first-step
   done
   [ "$(gpu_left)" -gt 50 ] && st eager_new_3 "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.eager --iters 30 --profile";;
esac
gpu_end
