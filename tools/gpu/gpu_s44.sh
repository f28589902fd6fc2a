#!/usr/bin/env bash
# The forty-fourth session's GPU plan: issue 15's table with flash-attn-4 installed (never run
# so: its JFA and dense rows then take FlashAttention-4's kernels, and 0.3.x's table names the
# path and times the path without it in the same run), and on an H200 the figures of gem-model
# 0.6.3 that gpu_s43.sh planned. Two calls on one warm box (flash-attn-4 is carried in two parts,
# tools/fa4_setup.sh):
#   PART=a  (carries .fa4a) any GPU: copies the compiler library to /tmp/fa4a.
#   PART=b  (carries .fa4b, same box): installs flash-attn-4; the FlashAttention-4 GPU tests;
#           `bench.table` ("table"); on an H200 only, issue 16's command with it ("long", empty
#           caches) and the model's local-MFU bench (the 40 % target).
#   PART=ac does a's and c's work in one call (carries .fa4a).
#   PART=d  (carries .ab/k_old: gem_kernels at 531dc4d, before the 32-bit offsets) the kernel A/B
#           (`tools/kernel_ab.py`, the two trees alternating, 2 runs each: "ab"), then the
#           kernels' GPU tests of the changed code ("kt"), and PART=c's one-pass A/B ("gab").
#   PART=e  (carries .ab/k_old) PART=d's A/B on the trainer-shape cases only (a short call).
#   PART=c  (no carry, any GPU) GDPA's one-pass backward (gem-kernels 0.3.8): its GPU tests and
#           the tanh-sigmoid ones ("gt"), then `bench.schedule --gdpa-bwd-ab` ("gab").
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  [ -f "$OUT/t4.log" ] && tail -3 "$OUT/t4.log"
  [ -f "$OUT/table.log" ] && sed -n '/^length-mix sweep/,/^{/p' "$OUT/table.log" | grep -v '^{' | cut -c1-250
  [ -f "$OUT/long.log" ] && { printf 'long '; last_summary "$OUT/long.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps data_wait_frac | cut -c1-420; }
  ls "$OUT"/ab_*.log >/dev/null 2>&1 && python3 tools/kernel_ab.py --summarize $(ls "$OUT"/ab_*.log)
  [ -f "$OUT/kt.log" ] && tail -3 "$OUT/kt.log"
  [ -f "$OUT/gt.log" ] && tail -3 "$OUT/gt.log"
  [ -f "$OUT/gab.log" ] && sed -n '/^case/,$p' "$OUT/gab.log" | grep -v '^{' | cut -c1-200
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }; }
gpu_begin "${WATCH:-400}"
if [ "${PART:-a}" = e ]; then  # PART=d's A/B on three cases only, for a short call (carries .ab/k_old)
  KP=$(echo "$PYTHONPATH" | tr : '\n' | grep -v '^kernels$' | paste -sd:)
  for i in 1 2; do
    st ab_new_$i 40 env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new --only "trainer FFN" "jfa fwd causal, trainer"
    st ab_old_$i 40 env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old --only "trainer FFN" "jfa fwd causal, trainer"
  done
elif [ "${PART:-a}" = d ]; then
  KP=$(echo "$PYTHONPATH" | tr : '\n' | grep -v '^kernels$' | paste -sd:)
  for i in 1 2; do  # the first run of each tree also compiles its kernels
    st ab_new_$i $([ $i = 1 ] && echo 100 || echo 45) env PYTHONPATH=kernels:$KP python3 tools/kernel_ab.py --tag new
    st ab_old_$i $([ $i = 1 ] && echo 100 || echo 45) env PYTHONPATH=.ab/k_old:$KP python3 tools/kernel_ab.py --tag old
  done
  st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py kernels/tests/test_jfa_qkv.py -k "gpu and not window"
  [ "$(gpu_left)" -gt 60 ] && st gab "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.schedule --gdpa-bwd-ab 3 --iters 7"
elif [ "${PART:-a}" != b ]; then  # a, c, ac
  case $PART in *a*) mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/ && echo "fa4a copied" > "$OUT/copy.log";; esac
  case $PART in *c*)
    st gt 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py kernels/tests/test_gdpa_narrow_tiles.py -k "one_pass or tanh"
    st gab "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.schedule --gdpa-bwd-ab 5 --iters 7";; esac
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st t4 90 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_flash4.py
  st table 240 bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7"
  if echo "$GPU" | grep -q H200; then
    st long 200 python3 $H200_TR --steps 300
    st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  fi
fi
gpu_end
