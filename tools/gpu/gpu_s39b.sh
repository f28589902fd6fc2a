#!/usr/bin/env bash
# Thirty-ninth session, second pair of calls: gem-model 0.5.4's rows-only last layer on
# gem-kernels 0.3.7's rotary keys (`jagged_flash_attention_kv(..., rope=)`: dk rotated back in
# place in kv's gradient), against 0.5.3 (commit dd6acbe's model/gem_model, unpacked by
#   mkdir -p .ab/model053 && git archive dd6acbe model/gem_model | tar x -C /tmp && cp -r /tmp/model/gem_model .ab/model053/
# git-ignored; carried with .fa4b). FlashAttention-4 as in gpu_s38b.sh.
#   PART=a  (carries .fa4a; copies .fa4a/ir.so.xz to /tmp/fa4a) GPU tests without
#           FlashAttention-4: kernels test_jfa_kv.py (gpu, rope), test_jfa_qkv.py (gpu); model test_layout.py (gpu).
#   PART=b  (carries .fa4b and .ab; installs FlashAttention-4) its kernels tests, then the
#           trainer, 0.5.3 against 0.5.4, each from its own empty caches, then warm, alternating
#           (`--preset h200 --steps 100`), while time is left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in testsk testsm tests4; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error|FAILED" "$OUT/$f.log" | tail -n 6 | cut -c1-300; }; done
  for f in old1 new1 old2 new2 old3 new3; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }; done
}
gpu_begin "${WATCH:-560}"
if [ "${PART:-a}" = a ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/
  st testsk 200 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_kv.py kernels/tests/test_jfa_qkv.py -k "gpu or rope"
  st testsm 150 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "gpu"
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st tests4 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_kv.py kernels/tests/test_jfa_qkv.py model/tests/test_layout.py -k "flash4 or gpu"
  AB_OLD=.ab/model053 ab_runs
fi
gpu_end
