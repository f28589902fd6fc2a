#!/usr/bin/env bash
# Thirty-ninth session: gem-kernels 0.3.7's rotary qkv attention (`jagged_flash_attention_qkv`:
# the attention's backward writes the projection's gradient, q and k rotated back in place) and
# gem-model 0.5.3's self-attention on it; plus what 0.3.6 / 0.5.2 still owed a GPU (bench.kv).
# 0.5.2 for the A/B is the previous commit's model/gem_model, unpacked by
#   mkdir -p .ab/model052 && git archive c9332d4 model/gem_model | tar x -C /tmp && cp -r /tmp/model/gem_model .ab/model052/
# (git-ignored; carried with .fa4b). FlashAttention-4 as in gpu_s38b.sh.
#   PART=a  (carries .fa4a; first copies .fa4a/ir.so.xz to /tmp/fa4a) GPU tests without
#           FlashAttention-4 (kernels: test_jfa_qkv, test_rope, test_jfa_kv; model: test_layout),
#           then `gem_kernels.bench.kv` (packed kv and rotary qkv vs composed; torch's
#           FlashAttention-2 backward here, where the qkv op saves only the forward's nothing).
#   PART=b  (carries .fa4b and .ab; installs FlashAttention-4) its tests, bench.kv with it, then
#           the trainer, 0.5.2 against 0.5.3, each from its own empty caches, then warm,
#           alternating (`--preset h200 --steps 100`), while time is left.
#   PART=c  (the same box after b) the model's local-MFU bench under 0.5.3, then issue 16's
#           command `--steps 300` over b's caches while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in testsk testsm tests4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error|FAILED" "$OUT/$f.log" | tail -n 6 | cut -c1-300; }; done
  for f in kv kv4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -v "^{" "$OUT/$f.log" | tail -n 9 | cut -c1-200; }; done
  for f in old1 new1 old2 new2 old3 new3 long; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }; done
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(GEM local|seq_attention|pooling|interaction|weighted|model e2e|e2e, layers|whole)" "$OUT/mfu.log" | cut -c1-160; }
}
KV="python3 -m gem_kernels.bench.kv --iters 15 --rounds 4"
gpu_begin "${WATCH:-560}"
if [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/
  st testsk 200 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_qkv.py kernels/tests/test_rope.py kernels/tests/test_jfa_kv.py -k "gpu or rotate"
  st testsm 150 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "gpu"
  st kv 150 $KV
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  if [ "$PART" = b ]; then
    st tests4 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_qkv.py kernels/tests/test_jfa_kv.py kernels/tests/test_rope.py -k "flash4 or rotate"
    st kv4 100 $KV
    AB_OLD=.ab/model052 ab_runs
  else
    st mfu 240 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
    [ "$(gpu_left)" -gt 100 ] && st long $(gpu_left) env GEM_CACHE_DIR=/tmp/c_new TORCHINDUCTOR_CACHE_DIR=/tmp/c_new/ind \
      TRITON_CACHE_DIR=/tmp/c_new/tri python3 $H200_TR --steps 300
  fi
fi
gpu_end
