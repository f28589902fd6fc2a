#!/usr/bin/env bash
# Thirty-seventh session, second box: issue 16's command without flash-attn-4 (a fresh box,
# nothing installed: our JFA forward, torch's FlashAttention-2 backward), gem-model 0.5.1,
# from empty caches: `--preset h200 --steps 300`, compiled, the default settings. Not run yet:
# three calls this session found no machine (the plan for the next H200 call; ~230 s).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/long.log" ] && { python3 tools/trainer_summary.py "$OUT/long.log" | head -1 | cut -c1-900
    last_summary "$OUT/long.log" model_version jfa_backward step_gpu_s_median | cut -c1-400; }
}
gpu_begin "${WATCH:-230}"
st long $(gpu_left) python3 $H200_TR --steps ${STEPS:-300}
gpu_end
