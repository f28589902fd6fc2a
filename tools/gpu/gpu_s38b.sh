#!/usr/bin/env bash
# Thirty-eighth session, second box: gem-kernels 0.3.6's packed-kv attention and gem-model
# 0.5.2's pooling on it (the pooling's kv gradient written by the attention's backward, no
# `torch.stack` of dK/dV). 0.5.1 for the A/B is the previous commit's model/gem_model, unpacked by
#   mkdir -p .ab/model051 && git archive <0.5.1 commit> model/gem_model | tar x -C .ab/model051 --strip-components=1
# (git-ignored; carried with .fa4b).
#   PART=a  (carries .fa4a; first copies .fa4a/ir.so.xz to /tmp/fa4a) the GPU tests without
#           FlashAttention-4: kernels/tests/test_jfa_kv.py, the model's pooling tests.
#   PART=b  (carries .fa4b and .ab; installs FlashAttention-4) the model's pooling GPU test
#           with it (the kernels' FlashAttention-4 tests ran on another box); then the trainer, 0.5.1 against 0.5.2, each from
#           its own empty caches, then warm, alternating (`--preset h200 --steps 100`).
#   PART=c  (the same box after b) issue 16's command `--preset h200 --steps 300` under 0.5.2,
#           over b's caches; then the model's local-MFU bench while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in testsk testsm tests4k tests4m; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error" "$OUT/$f.log" | tail -n 3 | cut -c1-300; }; done
  for f in old1 new1 old2 new2 old3 new3 long; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }; done
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(GEM local|seq_attention|pooling|interaction|weighted|model e2e|e2e, layers|attention)" "$OUT/mfu.log" | cut -c1-160; }
}
gputests() {  # $1: the log's name; $2: extra kernels test files (each folder in its own pytest)
  st $1k 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_kv.py $2 -k "gpu or flash4"
  st $1m 90 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "gpu or pooling"; }
gpu_begin "${WATCH:-560}"
if [ "${PART:-a}" = a ]; then
  gputests tests ""
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  if [ "$PART" = b ]; then
    st tests4m 90 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "pooling and gpu"
    arm() { local pp=$PYTHONPATH; [ "$1" = old ] && pp=.ab/model051:$pp
      env PYTHONPATH=$pp GEM_CACHE_DIR=/tmp/c_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/c_$1/ind TRITON_CACHE_DIR=/tmp/c_$1/tri \
        python3 $H200_TR --steps ${STEPS:-100}; }
    export -f arm; export H200_TR
    st old1 170 bash -c "arm old"; st new1 170 bash -c "arm new"
    for i in 2 3; do
      [ "$(gpu_left)" -gt 50 ] && st old$i 50 bash -c "arm old"
      [ "$(gpu_left)" -gt 50 ] && st new$i 50 bash -c "arm new"
    done
  else
    st long 200 env GEM_CACHE_DIR=/tmp/c_new TORCHINDUCTOR_CACHE_DIR=/tmp/c_new/ind TRITON_CACHE_DIR=/tmp/c_new/tri python3 $H200_TR --steps 300
    [ "$(gpu_left)" -gt 100 ] && st mfu $(gpu_left) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  fi
fi
gpu_end
