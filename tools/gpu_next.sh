#!/usr/bin/env bash
# What the eighth and ninth sessions left to check on the GPU, in one call (~8 minutes, one
# H200; on an x2 box the two halves run side by side):
#   GPU 0: the issue-#16 command on today's tree, uncut (`--steps 300`: a cold compile ~65 s
#          + 300 x ~0.24 s; the eighth session measured the tree only in a 60-step A/B:
#          0.2400 s, 34.9 %); its first step is the cold start (a fresh machine's caches), and
#          a 3-step `tools/ttfs.py` right after it the warm one: gem-parallel 0.3.2 (ninth
#          session, no GPU time) traces each block kind once and loads every block graph
#          from AOTAutograd's cache (CPU tiny warm 25.9 -> 7.0 s; the H200 warm start was
#          17.1 s); its JSON line must show no "autograd_cache_bypass" and dynamo_restarts 0;
#   GPU 1 (or after it): the kernels' GPU tests changed after the last GPU run (test_gdpa.py:
#          the GDPA cleanup, the deterministic short-kv routing; the short kernels' _short_kv
#          helper), the short-kv tile sweep with 16 q tiles per program (`bench.gdpa --short`),
#          and the model's local MFU compiled on the full bench batch and on the trainer's
#          batch (`--compile`, new; the issue's 40 % target is for this bench).
# A watchdog writes the summary and the archive at WATCH seconds (default 560).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  echo "=== warm start"; [ -f "$OUT/ttfs_warm.log" ] && tail -n 1 "$OUT/ttfs_warm.log" | cut -c1-400
  echo "=== kernel tests"; grep -E "passed|failed|Error" "$OUT/kernel_tests.log" | tail -n 3 | cut -c1-300
  echo "=== gdpa short"; grep -E "^default|^BM=" "$OUT/gdpa_short.log" | cut -c1-120
  for r in local_mfu local_mfu_trainer; do echo "=== $r"; grep -E "^weighted|^model e2e" "$OUT/$r.log"; done
}
gpu_begin "${WATCH:-560}"
second=0; [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && second=1
( export CUDA_VISIBLE_DEVICES=0
  st tr_300 240 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress
  st ttfs_warm 60 python3 tools/ttfs.py --preset h200 --steps 3 ) & P0=$!
[ "$second" = 0 ] && wait "$P0"
( export CUDA_VISIBLE_DEVICES=$second
  st kernel_tests 80 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_gdpa.py -k "gpu or short or deterministic"
  st gdpa_short 60 python3 -m gem_kernels.bench.gdpa --short
  st local_mfu 80 python3 -m gem_model.bench.local_mfu --compile --no-reference
  st local_mfu_trainer 90 python3 -m gem_model.bench.local_mfu --compile --no-reference --tokens 262144 --cap 16384
  ) & P1=$!
wait "$P0" "$P1"
gpu_end
