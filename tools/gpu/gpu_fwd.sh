#!/usr/bin/env bash
# One H200 (~3 minutes): the FlashAttention-2 forward for short mixes (kernels 0.2.1).
#   Its GPU tests (and the Triton forward's real-size tests, pinned to our forward), then the
#   backward bench, which also times both forwards on full and causal mixes.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== kernel gpu tests"; grep -E "passed|failed|Error" "$OUT/kernel_tests.log" | tail -n 8 | cut -c1-300
  echo "=== bwd bench"; grep -A14 "^JFA backward paths" "$OUT/bwd.log" | cut -c1-260
}
gpu_begin "${WATCH:-200}"
st kernel_tests 110 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_jfa_flash2.py kernels/tests/test_jfa.py -k "gpu or flash or rule"
st bwd 70 python3 -m gem_kernels.bench.bwd --iters 5 --out "$OUT"
gpu_end
