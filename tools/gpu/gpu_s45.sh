#!/usr/bin/env bash
# The forty-fifth session's GPU plan, whatever GPU comes (an H200 is the issues' target; the
# summary names the card). Run: PART=a and PART=b on one H100; PART=c found no machine, and the
# device time ran out (the next session: PART=c first).
#   PART=a (carries .ab/k_old: gem_kernels at 531dc4d, before the 32-bit row offsets):
#     - "cold": issue 16's command from empty caches and an empty --compile-aot folder, with
#       the h200 preset's new default --compile-background (gem-trainer 0.2.22): the time to
#       first step, and the step at which the compiled blocks took over;
#     - "warm": the same command again over the filled folder and caches (--steps 300): the
#       warm first step and the steady MFU (issue 16's figures under gem-model 0.6.3);
#     - the kernel A/B's first run a tree ("ab_*", tools/kernel_ab.py).
#   PART=c (any box): the cold run again with gem-parallel 0.3.12's GIL switch interval
#     ("cold"), then without --compile-background ("coldfg": the foreground compile on the same
#     box, its own empty caches), then the kernels' GPU
#     tests of the changed code with the rest of the call ("kt"; PART=b's limit cut them).
#   PART=b (same box, carries .ab/k_old): the A/B's second runs, the kernels' GPU tests of the
#     changed code ("kt"), GDPA's one-pass A/B ("gab"), and the model's local-MFU bench ("mfu").
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in cold coldfg warm; do [ -f "$OUT/$f.log" ] && { printf '%s ' $f; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady mfu compute_s time_to_first_step_s warmup_steps compiled_from_step recompiles_per_100_steps data_wait_frac | cut -c1-520; grep -o '"compile_aot": {[^}]*}' "$OUT/$f.log" | tail -1 | cut -c1-300; }; done
  ls "$OUT"/ab_*.log >/dev/null 2>&1 && python3 tools/kernel_ab.py --summarize $(ls "$OUT"/ab_*.log)
  [ -f "$OUT/kt.log" ] && tail -3 "$OUT/kt.log"
  [ -f "$OUT/gab.log" ] && sed -n '/^case/,$p' "$OUT/gab.log" | grep -v '^{' | cut -c1-200
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
gpu_begin "${WATCH:-540}"
KP=$(echo "$PYTHONPATH" | tr : '\n' | grep -v '^kernels$' | paste -sd:)
if [ "${PART:-a}" = c ]; then
  GEM_CACHE_DIR=/tmp/gemb TORCHINDUCTOR_CACHE_DIR=/tmp/gemb/ind TRITON_CACHE_DIR=/tmp/gemb/tri st cold 200 python3 $H200_TR --steps 200
  GEM_CACHE_DIR=/tmp/gemf TORCHINDUCTOR_CACHE_DIR=/tmp/gemf/ind TRITON_CACHE_DIR=/tmp/gemf/tri st coldfg "$(gpu_left)" python3 $H200_TR --steps 200 --no-compile-background
  [ "$(gpu_left)" -gt 60 ] && st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py kernels/tests/test_jfa_qkv.py -k "gpu and not window"
elif [ "${PART:-a}" = b ]; then
  st ab_new_2 45 env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new
  st ab_old_2 45 env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old
  st kt 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py kernels/tests/test_jfa_qkv.py -k "gpu and not window"
  st gab 100 bash -c "cd kernels && python3 -m gem_kernels.bench.schedule --gdpa-bwd-ab 3 --iters 7"
  st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
else
  export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
  st cold 230 python3 $H200_TR --steps 200
  st warm 190 python3 $H200_TR --steps 300
  unset GEM_CACHE_DIR TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
  [ "$(gpu_left)" -gt 60 ] && st ab_new_1 "$(( $(gpu_left) / 2 ))" env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new
  [ "$(gpu_left)" -gt 40 ] && st ab_old_1 "$(gpu_left)" env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old
fi
gpu_end
