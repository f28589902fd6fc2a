#!/usr/bin/env bash
# Thirty-third session, one Hopper box per call (the reply names the card), gem-model 0.4.0:
# the last layer attends from the rows it reads only (GEMConfig.last_layer_rows_only) and the
# interaction from its feature tokens only.
#   PART=a  the GPU test of the slot attention; the h200 trainer, 60 steps, A/B/A on one box:
#           default (rows only), `last_layer_rows_only=false` (every row, 0.3.9's attention),
#           default again; then the local-MFU bench, rows only and every row, while time is
#           left (no FlashAttention-4 in either call).
#   PART=b  the quality bench's GEM row (1,000 steps, the same samples and held-out set as
#           every earlier row), then issue 16's command `--steps 300`. (Ran as `PART=b
#           WATCH=425`, then the local-MFU bench rows only, on the box PART=a had used.)
#   PART=c  issue 16's command `--steps 300`, rows only then every row (the same box again).
#   PART=d  PART=a's three 60-step trainer runs alone (a second box).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/gputest.log" ] && { echo "=== gpu test"; tail -n 2 "$OUT/gputest.log" | cut -c1-200; }
  for f in rows1 every rows2 tr_300 r300 e300; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" steps loss mfu_steady step_s_median tokens_per_s time_to_first_step_s recompiles_per_100_steps | cut -c1-600; }; done
  for f in mfu_rows mfu_every; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(GEM local|seq_attention|interaction|weighted|model e2e|e2e, layers)" "$OUT/$f.log" | cut -c1-160; }; done
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220; }
}
gpu_begin "${WATCH:-560}"
TR="-m gem_trainer --preset h200 --eval-batches 0 --no-progress"
T0=$(date +%s)
left() { local l=$(( ${WATCH:-560} - 15 - $(date +%s) + T0 )); echo $(( l > 1 ? l : 1 )); }
if [ "${PART:-a}" = a ]; then
  st gputest 90 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "gpu"
  st rows1 200 python3 $TR --steps 60
  st every 170 python3 tools/with_model.py last_layer_rows_only=false -- $TR --steps 60
  st rows2 90 python3 $TR --steps 60
  st mfu_rows $(( $(left) / 2 )) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  st mfu_every $(left) python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph --last-layer-every-row
elif [ "${PART:-a}" = c ]; then
  st r300 140 python3 $TR --steps 300
  st e300 140 python3 tools/with_model.py last_layer_rows_only=false -- $TR --steps 300
elif [ "${PART:-a}" = d ]; then
  st rows1 170 python3 $TR --steps 60
  st every 80 python3 tools/with_model.py last_layer_rows_only=false -- $TR --steps 60
  st rows2 60 python3 $TR --steps 60
else
  st quality 420 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality"
  st tr_300 $(left) python3 $TR --steps 300
fi
gpu_end
