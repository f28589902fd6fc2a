#!/usr/bin/env bash
# Thirty-fourth session, one Hopper box per call (the reply names the card), gem-model 0.5.0:
# the rows-only last layer projects q for its slot rows only; no bias on the three token-mix
# linears. The 0.4.0 model for the A/B is commit b04921e's model/gem_model, unpacked by
#   mkdir -p .ab/model040 && git archive b04921e model/gem_model | tar x -C .ab/model040 --strip-components=1
# (git-ignored; the call carries `.ab`), put first on PYTHONPATH.
#   PART=a  the model's GPU tests (the slot attention at the h200 layer's size); the h200
#           trainer, 60 steps, A/B/A on one box: 0.5.0, 0.4.0, 0.5.0.
#   PART=b  the quality bench's GEM row (1,000 steps, the same samples and held-out set as
#           every earlier row), then issue 16's command `--steps 300` while time is left.
#   PART=c  issue 16's command `--steps 300`, 0.5.0 then 0.4.0 (the same box as PART=b).
#   PART=d  the local-MFU bench (compiled, CUDA-graph replay), 0.5.0 then 0.4.0.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
OLD="env PYTHONPATH=.ab/model040:$PYTHONPATH"
[ "${PART:-a}" = b ] || [ -f .ab/model040/gem_model/__init__.py ] || { echo "gpu_s34: no .ab/model040: unpack 0.4.0 (header) and carry .ab" >&2; exit 2; }
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/gputest.log" ] && { echo "=== gpu test"; tail -n 2 "$OUT/gputest.log" | cut -c1-200; }
  for f in new1 old new2 tr_300 n300 o300; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" steps loss mfu_steady step_s_median tokens_per_s time_to_first_step_s recompiles_per_100_steps model_version | cut -c1-600; }; done
  for f in mfu_new mfu_old; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(GEM local|seq_attention|interaction|weighted|model e2e|e2e, layers)" "$OUT/$f.log" | cut -c1-160; }; done
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220; }
}
gpu_begin "${WATCH:-560}"
TR=$H200_TR
if [ "${PART:-a}" = a ]; then
  st gputest 100 python3 -m pytest -q -p no:cacheprovider model/tests/test_layout.py -k "gpu"
  st new1 200 python3 $TR --steps 60
  st old 170 $OLD python3 $TR --steps 60
  st new2 $(gpu_left) python3 $TR --steps 60
elif [ "${PART:-a}" = d ]; then
  st mfu_new 270 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  st mfu_old $(gpu_left) $OLD python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
elif [ "${PART:-a}" = c ]; then
  st n300 140 python3 $TR --steps 300
  st o300 $(gpu_left) $OLD python3 $TR --steps 300
else
  st quality 420 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality"
  st tr_300 $(gpu_left) python3 $TR --steps 300
fi
gpu_end
