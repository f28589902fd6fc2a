#!/usr/bin/env bash
# What this session's changes left to check on the GPU, in one 2-GPU call (~9 minutes):
#   GPU 0: the quality bench's GEM row at 1,000 steps with the new default one-pass JFA
#          backward, against the two-pass figures in model/BENCHMARKS.md (click / conversion /
#          engagement AUC 0.7537 / 0.7642 / 0.7820, +-0.01; the data are deterministic, so the
#          samples are the same);
#   GPU 1: the fp8 GPU tests (the quant="auto" default fuses on CUDA), then the h200 trainer
#          with --precision fp8_block (its compile ran past 150 s last time: 330 s here).
# A watchdog writes the summary and the archive at WATCH seconds (default 560).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== quality (one-pass default)"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  echo "=== fp8 gpu tests"; tail -n 4 "$OUT/fp8_tests.log" | cut -c1-260
  echo "=== fp8_block trainer"; [ -f "$OUT/tr_fp8.log" ] && python3 tools/trainer_summary.py "$OUT/tr_fp8.log" | head -1
}
gpu_begin "${WATCH:-560}"
( export CUDA_VISIBLE_DEVICES=0
  st quality 540 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st fp8_tests 120 python3 -m pytest -q -p no:cacheprovider precision/tests/test_fp8_block.py \
     precision/tests/test_fp8_block_triton.py -k "gpu or opaque"
  st tr_fp8 330 python3 -m gem_trainer --preset h200 --steps 120 --eval-batches 0 --no-progress \
     --precision fp8_block ) & P1=$!
wait "$P0" "$P1"
gpu_end
