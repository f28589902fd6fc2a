#!/usr/bin/env bash
# Twenty-fourth session's GPU plan on one H200:
#   PART=a  what the slow steady steps 15 and 46 of the h200 trainer spend (session 24's first
#           call showed no garbage collection in them, with or without a freeze): the profile
#           of the windows around step 15 (cold box: includes the compile) and around step 46
#           (warm), with the CUDA runtime stalls, CPU self time, kernel excess and the caching
#           allocators' counters per step (tools/slow_step_probe.py).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for f in probe15 probe46; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -v "^W1\|is_fx\|USDT\|warn" "$OUT/$f.log" | sed -n '/^slow_steps/,$p' | cut -c1-400; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  st probe15 300 python3 tools/slow_step_probe.py --steps 20 --first 12 --last 17 --json "$OUT/probe15.json"
  st probe46 $(left 560) python3 tools/slow_step_probe.py --steps 50 --first 43 --last 48 --json "$OUT/probe46.json" ;;
esac
gpu_end
