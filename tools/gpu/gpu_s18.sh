#!/usr/bin/env bash
# Eighteenth session's GPU work on one H200, FlashAttention-4 installed (tools/fa4_setup.sh; a
# first call copies .fa4a/ir.so.xz to /tmp/fa4a), so its kernels are the JFA default:
#   PART=a  gem-precision 0.3.4 (the quantizer's short path for tiles without NaN/Inf, the bias
#           gradient's column sums from dY's quantization): its GPU tests, the Hopper bench
#           (--quick --no-mxfp8 --profile), then, if the tests passed, the trainer
#           command with --precision fp8_block_wgrad_bf16 (gem-parallel 0.3.3's inductor flags).
#           Tests 13 passed; quantizer 1,838-2,690 GB/s (w4 best); the column sums fused into dY's
#           quantization cost +0.96 ms (the separate sum 0.52: dropped); the trainer was cut
#           at 290 s, still before its first step (cold inductor + FlashAttention-4 compiles).
#   PART=b  0.3.4 with 128x128 w4 the default tile: the Hopper bench, then the fp8_block_wgrad_bf16
#           trainer with a longer stage (recompiles logged), then bf16 beside if time is left.
#           Linear fwd+bwd 1.07-1.12x bf16 at the trainer's shapes, 1.31x at 8192^3; the trainer
#           recompiled its blocks each time a batch's token count crossed a multiple of 128
#           (a guard on the fp8_block pad), ~80-100 s per compile, and was cut before step 1.
#   PART=c  with that guard gone (gem-precision 0.3.4): the h200 trainer eager (--no-compile),
#           bf16 then fp8_block_wgrad_bf16, 60 steps each; then the compiled fp8_block_wgrad_bf16
#           run for what is left of the call (recompiles logged). Eager: bf16 0.2436 s per
#           step, fp8 0.2418; compiled fp8: 0.1995 s, 41.56 %, 3 graphs, 0 recompiles.
#   PART=d  the compiled bf16 run beside it (run by hand on the same warm box that day, 80 steps:
#           0.1847 s, 45.17 %).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== setup"; tail -n 3 "$OUT/setup.log" 2>/dev/null | cut -c1-300
  for f in gpu_test prec_tests; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "FAILED|Error" "$OUT/$f.log" | head -5 | cut -c1-300; tail -n 2 "$OUT/$f.log" | cut -c1-300; }; done
  [ -f "$OUT/hopper.log" ] && { echo "=== hopper"; grep -v "^{" "$OUT/hopper.log" | tail -n 45 | cut -c1-260; }
  for r in bf16e fp8e fp8 fp8w bf16; do [ -f "$OUT/tr_$r.log" ] && { echo "--- $r"; python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-500; grep -iE "error|Traceback" "$OUT/tr_$r.log" | head -3 | cut -c1-300; tail -n 3 "$OUT/tr_$r.log" | cut -c1-300; }; done
  for f in mfu_graph; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -v '^{' "$OUT/$f.log" | tail -n 24 | cut -c1-200; }; done
}
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
st setup 40 bash tools/fa4_setup.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
case "${PART:-a}" in
a)
  st prec_tests 100 python3 -m pytest -q -p no:cacheprovider -rf precision/tests/test_fp8_block_triton.py precision/tests/test_fp8_block.py -k "gpu or opaque or bias_grad or column or finite"
  (cd precision && PYTHONPATH=.:$PYTHONPATH st hopper 130 python3 -m gem_precision.bench.hopper --quick --no-mxfp8 --profile)
  grep -q "prec_tests rc=0" "$OUT/rcs.txt" && st tr_fp8w 290 $TR --steps 150 --precision fp8_block_wgrad_bf16 ;;
b)
  (cd precision && PYTHONPATH=.:$PYTHONPATH st hopper 80 python3 -m gem_precision.bench.hopper --quick --no-mxfp8 --profile)
  TORCH_LOGS=recompiles st tr_fp8w 400 $TR --steps 120 --precision fp8_block_wgrad_bf16
  st tr_bf16 $(( 560 - $(date +%s) + T0 )) $TR --steps 120 ;;
c)
  st tr_bf16e 80 $TR --steps 60 --no-compile
  st tr_fp8e 80 $TR --steps 60 --no-compile --precision fp8_block_wgrad_bf16
  TORCH_LOGS=recompiles st tr_fp8w $(( ${END:-410} - $(date +%s) + T0 )) $TR --steps 80 --precision fp8_block_wgrad_bf16 ;;
d)
  st tr_bf16 190 $TR --steps 80 ;;
esac
gpu_end
