#!/usr/bin/env bash
# One 2-GPU call (~9 minutes): the re-checks the fifth session owed, and the profile of
# today's default compiled step (one-pass JFA backward), to decide where the step's time goes.
#   GPU 0: the quality bench's GEM row at 1,000 steps with the one-pass default, against the
#          two-pass figures in model/BENCHMARKS.md (AUC 0.7537 / 0.7642 / 0.7820, +-0.01).
#   GPU 1: the JFA GPU tests (after the review refactor), the fp8 GPU tests (quant="auto"),
#          then the compiled h200 step under the profiler (8 steps after the warm-up).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== quality (one-pass default)"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  echo "=== jfa gpu tests"; tail -n 3 "$OUT/jfa_tests.log" | cut -c1-300
  echo "=== fp8 gpu tests"; tail -n 3 "$OUT/fp8_tests.log" | cut -c1-300
  echo "=== profile"; grep -E "^-|Name|kernel_s_total" "$OUT/profile.log" | head -3
}
gpu_begin "${WATCH:-560}"
( export CUDA_VISIBLE_DEVICES=0
  st quality 540 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st jfa_tests 150 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_one_pass.py \
     kernels/tests/test_jfa.py kernels/tests/test_jfa_tma_fwd.py -k "gpu or real"
  st fp8_tests 90 python3 -m pytest -q -p no:cacheprovider precision/tests/test_fp8_block.py \
     precision/tests/test_fp8_block_triton.py -k "gpu or opaque"
  st profile 280 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 \
     --trace "$OUT/trace.json"
  [ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json" ) & P1=$!
wait "$P0" "$P1"
gpu_end
