#!/usr/bin/env bash
# Twenty-eighth session's plan for one H200 (written without a GPU; not run yet). Question: which
# guards make the h200 trainer's store compile 2 more variants after its first steps (66.8 s
# inside a 100-step run on 2026-12-05)? On a CPU no batch shape, optimizer step or checkpoint
# does (trainer/BENCHMARKS.md, twenty-eighth session). Stages:
#   guards     tools/aot_guards.py over 200 of the preset's batches at full size, bf16: does a
#              batch shape need a new variant on the GPU (Triton code generation's guards)?
#   cold       the h200 default (--compile-aot auto) from nothing, 2 steps: the first 2 variants;
#   long       the same folder, 60 steps: the later variants are compiled here, and the summary's
#              compile_aot.rejected (gem-parallel 0.3.8) names the guard each earlier one failed;
#   warm       2 steps again, with the 4 files: the warm start after a long run.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/guards.log" ] && { echo "=== guards"; grep -E "^batch .*variant|variants over" "$OUT/guards.log" | cut -c1-400; }
  for f in cold long warm; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s compile_aot recompiles_per_100_steps mfu_steady step_s_median; }; done
}
gpu_begin "${WATCH:-560}"
st guards 200 python3 tools/aot_guards.py --batches 200
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
st cold 200 $TR --steps 2
st long 200 $TR --steps 60
st warm 60 $TR --steps 2
gpu_end
