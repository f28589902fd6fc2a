#!/usr/bin/env bash
# The next session's H200 plan (written in the thirty-eighth session, not run yet): what
# gem-model 0.5.2 / gem-kernels 0.3.6 / gem-trainer 0.2.21 owe an H200. FlashAttention-4 as in
# gpu_s38b.sh: the first call carries .fa4a and copies .fa4a/ir.so.xz to /tmp/fa4a (PART=a),
# the next ones carry .fa4b (and .ab for PART=b: 0.5.1's model/gem_model at .ab/model051, see
# gpu_s38b.sh's header).
#   PART=a  (no FlashAttention-4) the packed-kv bench `gem_kernels.bench.kv` (packed vs unbind
#           at the trainer's self-attention and pooling shapes; FlashAttention-2's backward,
#           where packing saves nothing) and the kernels' kv GPU tests.
#   PART=b  (FlashAttention-4) bench.kv again (its backward writes the halves), then issue 16's
#           command `--preset h200 --steps 300` under 0.5.2 from empty caches, then 0.5.1 and
#           0.5.2 warm, alternating, 100 steps each, while time is left.
#   PART=c  (FlashAttention-4, the same box) the model's local-MFU bench (full batch, compiled,
#           replayed) under 0.5.2.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in kv kv4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -v "^{" "$OUT/$f.log" | tail -n 8 | cut -c1-200; }; done
  [ -f "$OUT/tests.log" ] && { echo "=== tests"; grep -E "passed|failed" "$OUT/tests.log" | tail -n 1; }
  for f in long old1 new1 old2 new2; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s | cut -c1-400; }; done
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(GEM local|seq_attention|pooling|interaction|weighted|model e2e|e2e, layers)" "$OUT/mfu.log" | cut -c1-160; }
}
gpu_begin "${WATCH:-560}"
KV="python3 -m gem_kernels.bench.kv --iters 15 --rounds 4"
if [ "${PART:-a}" = a ]; then
  st tests 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_kv.py -k gpu
  st kv 150 $KV
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  if [ "$PART" = b ]; then
    st kv4 120 $KV
    arm() { local pp=$PYTHONPATH; [ "$1" = old ] && pp=.ab/model051:$pp
      env PYTHONPATH=$pp GEM_CACHE_DIR=/tmp/c_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/c_$1/ind TRITON_CACHE_DIR=/tmp/c_$1/tri \
        python3 $H200_TR --steps $2; }
    export -f arm; export H200_TR
    st long 230 bash -c "arm new 300"
    [ "$(gpu_left)" -gt 150 ] && st old1 150 bash -c "arm old 100"
    for i in 1 2; do
      [ "$(gpu_left)" -gt 45 ] && st new$i 45 bash -c "arm new 100"
      [ "$i" = 2 ] && [ "$(gpu_left)" -gt 45 ] && st old2 45 bash -c "arm old 100"
    done
  else
    st mfu $(gpu_left) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  fi
fi
gpu_end
