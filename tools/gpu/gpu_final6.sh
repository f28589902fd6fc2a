#!/usr/bin/env bash
# One H200 (~4.5 minutes): the issue-#16 command on today's tree (cold caches), the model's GPU
# tests, and the compiled step under the profiler (the event front end's kernels in the step).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  echo "=== model gpu tests"; tail -n 1 "$OUT/model_tests.log" | cut -c1-300
  echo "=== profile"; tail -n 1 "$OUT/profile.log" | cut -c1-300
}
gpu_begin "${WATCH:-290}"
st tr_300 175 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress
st model_tests 40 python3 -m pytest -q -p no:cacheprovider model/tests/test_model.py -k gpu
st profile 70 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70 --trace "$OUT/trace.json"
[ -f "$OUT/trace.json" ] && gzip -9 "$OUT/trace.json"
gpu_end
