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
# On a CPU (twenty-ninth session) neither torch 2.13 nor the GPU's torch 2.11 makes a third
# variant, with or without bf16 autocast, and no tensor of either layer kind comes within
# 0.42x of inductor's 2**31 index bound; so the guard is a GPU-only one.
# PART=b (a second call): the model's local MFU twice (`--cuda-graph`), to settle 39.98 %
# against issue 16's 40 % with more than one sample.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/guards.log" ] && { echo "=== guards"; grep -E "^batch .*variant|variants over" "$OUT/guards.log" | cut -c1-400; }
  for f in mfu1 mfu2; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(weighted|model e2e|e2e, layers)" "$OUT/$f.log" | cut -c1-160; }; done
  for f in cold long warm; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s compile_aot recompiles_per_100_steps mfu_steady step_s_median; }; done
}
gpu_begin "${WATCH:-560}"
if [ "${PART:-a}" = b ]; then
  for i in 1 2; do st mfu$i 250 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph; done
else
  st guards 200 python3 tools/aot_guards.py --batches 200
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
  st cold 200 $TR --steps 2
  st long 200 $TR --steps 60
  st warm 60 $TR --steps 2
fi
gpu_end
