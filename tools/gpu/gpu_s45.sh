#!/usr/bin/env bash
# The forty-fifth session's GPU plan. One call (carries .ab/k_old: gem_kernels at 531dc4d,
# before the 32-bit row offsets), whatever GPU comes:
#   on an H100: gpu_s44.sh's PART=d (the kernel A/B, 2 runs a tree; the kernels' GPU tests of
#     the changed code; GDPA's one-pass A/B).
#   on an H200: one run a tree of the kernel A/B ("ab_*"), then issue 16's command without
#     flash-attn-4 (`--steps 300`, empty caches: "long0") and the model's local-MFU bench ("mfu"):
#     the first figures of gem-model 0.6.3 on the target GPU.
# PART=h200b (same H200, no carry): the A/B's second runs, the kernels' GPU tests, GDPA's
# one-pass A/B.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if ! echo "$GPU" | grep -q H200; then PART=d exec bash tools/gpu/gpu_s44.sh; fi
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  [ -f "$OUT/long0.log" ] && { printf 'long0 '; last_summary "$OUT/long0.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps data_wait_frac | cut -c1-420; }
  ls "$OUT"/ab_*.log >/dev/null 2>&1 && python3 tools/kernel_ab.py --summarize $(ls "$OUT"/ab_*.log)
  [ -f "$OUT/kt.log" ] && tail -3 "$OUT/kt.log"
  [ -f "$OUT/gab.log" ] && sed -n '/^case/,$p' "$OUT/gab.log" | grep -v '^{' | cut -c1-200
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
gpu_begin "${WATCH:-520}"
KP=$(echo "$PYTHONPATH" | tr : '\n' | grep -v '^kernels$' | paste -sd:)
if [ "${PART:-a}" = h200b ]; then
  st ab_new_2 45 env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new
  st ab_old_2 45 env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old
  st kt 200 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py kernels/tests/test_jfa_qkv.py -k "gpu and not window"
  [ "$(gpu_left)" -gt 60 ] && st gab "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.schedule --gdpa-bwd-ab 3 --iters 7"
else
  st ab_new_1 100 env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new
  st ab_old_1 100 env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old
  st long0 200 python3 $H200_TR --steps 300
  st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
fi
gpu_end
