#!/usr/bin/env bash
# Nineteenth session's GPU work on one H200, FlashAttention-4 installed (tools/fa4_setup.sh; a
# first call copies .fa4a/ir.so.xz to /tmp/fa4a; this call carries .fa4b):
#   PART=a  the compiled h200 trainer with fp8_block_wgrad_bf16, 60 steps per run, one box:
#           GEM_FP8_QUANT=torch (inductor traces the quantization into the blocks' graphs and
#           can fuse it with the ops around it) against bf16, then each quantizer with the 24
#           per-sample linears kept in bf16 (--keep-bf16). Only the last run finished (the
#           triton quantizer, per-sample linears in bf16: 0.1982 s, 40.43 %, first step 102 s);
#           the others were cut while compiling (160 s, 130 s, 101 s limits).
#   PART=b  the same box after a: GEM_FP8_QUANT=torch (per-sample kept) and bf16, 60 steps.
#   PART=c  the same box after b: the compiled step's profile, fp8 (per-sample kept) and bf16.
#   PART=d  (a fresh box) gem-precision 0.3.5's cost model: the hopper bench at the model's
#           stream shapes (1024 -> 1024 / 2048 / 3072) beside its predictions, then the compiled
#           trainer with fp8_block_wgrad_bf16 at the trainer's new defaults (per-sample linears
#           kept, --fp8-min-speedup 1.05: 10 of 27 linears) against bf16, 60 steps each.
#   PART=e  (a fresh box) the same fp8 run with inductor's two features on (GEM_INDUCTOR_OFF=""),
#           then bf16: plain if the fp8 run trained, else with the two features off (what
#           they cost a bf16 step).
#   PART=f  (not run yet: the session's device time was spent) what the nineteenth session left
#           unmeasured: the fp8 run at the defaults again (does gem-precision 0.3.5's unspecialised
#           token count close the gap between its steady MFU and its median step?), bf16 beside
#           it, then every eligible linear in FP8 with inductor's features on (does that compile?).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
KEEP="heads*,*interaction.*,*summary.glu"
RUNS="fp8t bf16 bf16off fp8tk fp8k fp8 fp8c prof"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== setup"; tail -n 3 "$OUT/setup.log" 2>/dev/null | cut -c1-300
  for r in $RUNS; do [ -f "$OUT/tr_$r.log" ] && { echo "--- $r"; python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-520; grep -iE "error|Traceback" "$OUT/tr_$r.log" | head -3 | cut -c1-300; tail -n 2 "$OUT/tr_$r.log" | cut -c1-300; }; done
  [ -f "$OUT/hopper.log" ] && { echo "=== hopper"; grep -vE "^\{" "$OUT/hopper.log" | tail -n 8 | cut -c1-400; }
  for f in prof_fp8k prof_bf16; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(Self CUDA|\{)" "$OUT/$f.log" | cut -c1-300; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
st setup 40 bash tools/fa4_setup.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
case "${PART:-a}" in
a)
  GEM_FP8_QUANT=torch st tr_fp8t 160 $TR --steps 60 --precision fp8_block_wgrad_bf16
  st tr_bf16 130 $TR --steps 60
  GEM_FP8_QUANT=torch st tr_fp8tk $(left 430) $TR --steps 60 --precision fp8_block_wgrad_bf16 --keep-bf16 "$KEEP"
  st tr_fp8k $(left 560) $TR --steps 60 --precision fp8_block_wgrad_bf16 --keep-bf16 "$KEEP" ;;
b)  # the same box after PART=a (its caches warm for what finished compiling there)
  GEM_FP8_QUANT=torch st tr_fp8t 330 $TR --steps 60 --precision fp8_block_wgrad_bf16 --keep-bf16 "$KEEP"
  st tr_bf16 $(left 560) $TR --steps 60 ;;
c)  # the same box after PART=b: the compiled step's profile, fp8 (per-sample linears in bf16) and bf16
  P="python3 tools/profile_trainer.py --preset h200 --steps 22 --skip 10 --rows 60"
  st prof_fp8k 200 $P --precision fp8_block_wgrad_bf16 --keep-bf16 "$KEEP"
  st prof_bf16 $(left 400) $P ;;
d)
  (cd precision && PYTHONPATH=.:$PYTHONPATH st hopper 100 python3 -m gem_precision.bench.hopper --model-shapes --no-mxfp8)
  st tr_fp8c 230 $TR --steps 60 --precision fp8_block_wgrad_bf16
  st tr_bf16 $(left 560) $TR --steps 60 ;;
e)
  GEM_INDUCTOR_OFF="" st tr_fp8c 200 $TR --steps 60 --precision fp8_block_wgrad_bf16
  if grep -q '"stop_reason": "steps"' "$OUT/tr_fp8c.log"; then st tr_bf16 $(left 385) $TR --steps 60
  else GEM_INDUCTOR_OFF=coalesce_tiling_analysis,mix_order_reduction st tr_bf16off $(left 385) $TR --steps 60; fi ;;
f)
  st tr_fp8c 200 $TR --steps 60 --precision fp8_block_wgrad_bf16
  st tr_bf16 120 $TR --steps 60
  st tr_fp8 $(left 560) $TR --steps 60 --precision fp8_block_wgrad_bf16 --fp8-min-speedup 0 --keep-bf16 'heads*' ;;
esac
gpu_end
