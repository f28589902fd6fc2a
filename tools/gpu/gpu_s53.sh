#!/usr/bin/env bash
# The fifty-third session's GPU plan (tools/stage.sh: summary.txt + all.tgz), on what comes.
# PART=1: what session 52 left unrun on a GPU: the eager-plan tests (test_attn_plan.py, with
#   the FlashAttention-4 length-rule test), the forward+backward rows' host time by function
#   (`bench.eager --profile`), and Nsight Compute over the JFA / GDPA backward kernels at
#   gem-kernels 0.3.12 (do they spill on triton 3.6? what stalls them?).
# PART=2 (carries .ab, the session's starting kernels 657a0cb): the backward plans (gem-kernels
#   0.3.13): their GPU tests and the launchers' (one-pass, TMA, GDPA); the eager bench A/B against
#   the start, alternating; issue 15's table. Ran as PART=2 (rounds 1-2, table), then
#   PART=2 KT_LIMIT=200 ROUNDS="3 4" NO_TABLE=1 on the same box. PART=1 never ran (no machine).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in eager_new_1 eager_old_1 eager_new_2 eager_old_2 eager_new_3 eager_old_3 eager_new_4 eager_old_4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; sed -n '/^case /,/^{/p' "$OUT/$f.log" | grep -v '^{'; }; done
  [ -f "$OUT/kt.log" ] && { echo "=== kt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/kt.log" | tail -8; }
  for f in "$OUT"/eager_prof*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; grep -A24 "^=== cProfile" "$f" | grep -v "^$\|Ordered by\|List reduced\|function calls" | cut -c1-150; }; done
  [ -f "$OUT/ncu_table.md" ] && { echo "=== ncu"; cut -c1-330 "$OUT/ncu_table.md"; }
  [ -f "$OUT/ncu.log" ] && { echo "=== ncu log"; grep -vE "^==PROF==" "$OUT/ncu.log" | tail -n 5 | cut -c1-200; }
  [ -f "$OUT/table.log" ] && { echo "=== table"; grep -v '^{' "$OUT/table.log" | tail -n 30 | cut -c1-220; }; }
gpu_begin "${WATCH:-560}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
EG="python3 -m gem_kernels.bench.eager --iters 30"
case ${PART:-1} in
1) st kt 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py
   st eager_prof 100 bash -c "cd kernels && $EG --profile"
   mkdir -p /tmp/ncu; ncu --version > "$OUT/ncu_version.txt" 2>&1
   (cd kernels && PYTHONPATH=.:$PYTHONPATH st ncu 200 ncu --profile-from-start off --clock-control none --nvtx \
      --set full --import-source no -f -o /tmp/ncu/k python3 -m gem_kernels.bench.ncu_cases \
      --cases jfa_fb_full_two_pass,jfa_fb_causal_two_pass,gdpa_fb)
   st ncusum 60 sh -c "python3 tools/ncu_summary.py /tmp/ncu/k.ncu-rep --json $OUT/ncu.json > $OUT/ncu_table.md";;
2) st kt ${KT_LIMIT:-120} python3 -m pytest -q -p no:cacheprovider kernels/tests/test_attn_plan.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py -k "plan or gpu or tma"
   for r in ${ROUNDS:-1 2}; do
     st eager_new_$r 65 bash -c "cd kernels && $EG"
     st eager_old_$r 65 env PYTHONPATH=$PWD/.ab/old/kernels:$PYTHONPATH bash -c "cd .ab/old/kernels && $EG"
   done
   [ -z "$NO_TABLE" ] && [ "$(gpu_left)" -gt 60 ] && st table "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7 --no-sweep";;
esac
gpu_end
