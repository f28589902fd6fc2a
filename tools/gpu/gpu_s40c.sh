#!/usr/bin/env bash
# Fortieth session, last call: a second cold pair of gpu_s40b.sh's A/B (gem-model 0.6.0's h200
# preset against 0.5.4, `.ab/model054` carried), in the reverse order (0.5.4 first), 50 steps each:
# what the session's device time had left.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in old1 new1; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" model_version steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-420; }; done
}
gpu_begin "${WATCH:-245}"
export AB_OLD=.ab/model054 H200_TR
st old1 115 bash -c "ab_arm old 50"
st new1 $(gpu_left) bash -c "ab_arm new 50"
gpu_end
