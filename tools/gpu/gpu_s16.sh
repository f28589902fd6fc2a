#!/usr/bin/env bash
# Sixteenth session's GPU work on one H200, FlashAttention-4 installed (tools/fa4_setup.sh; a
# first call copies .fa4a/ir.so.xz to /tmp/fa4a), so its kernels are the JFA default:
#   PART=b  time to first step cold (empty inductor / Triton / FlashAttention-4 caches) with
#           dynamo's compile-time table (tools/ttfs.py), the quality bench's GEM row (1,000 steps,
#           the same samples and held-out set as every earlier row), the trainer command
#           with --ckpt-every 50, then the warm start again.
#   PART=c  the quality bench's GEM row (the b call's 250 s limit cut it: it needs ~400 s), then
#           the model's local-MFU bench compiled on its full batch.
#   PART=d  the local-MFU bench compiled on the trainer's batch.
#   PART=f  (for the next session; not run yet) gem-precision 0.3.2's quantizer that pads
#           inside: its GPU tests, the Hopper bench (--quick: 262,144 and 262,100 tokens and
#           8192^3), then the trainer command with --precision fp8_block beside bf16.
#   PART=e  time to first step cold with the kernel prewarm child (gem_trainer._prewarm), then
#           without it, each with its own empty inductor / Triton / FlashAttention-4 cache
#           folders (with first: the box's first run pays the imports' disk reads), the warm
#           start with it, its GPU test, then PART=d's bench. Run at commit ae744ff: the child
#           made the start slower (trainer/BENCHMARKS.md) and was removed; at later commits
#           tools/ttfs.py has no --no-prewarm.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== setup"; tail -n 3 "$OUT/setup.log" 2>/dev/null | cut -c1-300
  for r in ttfs_cold ttfs_warm ttfs_on ttfs_off ttfs_on_warm; do echo "=== $r"; [ -f "$OUT/$r.log" ] && { grep -E "^\{" "$OUT/$r.log" | tail -n 1 | cut -c1-700
    grep -E "compile_inner|call_user_compiler|compile_fx|_compile|inductor|codegen|aot" "$OUT/$r.log" | head -n 12 | cut -c1-160; }; done
  echo "=== gpu_test"; [ -f "$OUT/gpu_test.log" ] && tail -n 4 "$OUT/gpu_test.log" | cut -c1-300
  echo "=== quality"; [ -f "$OUT/quality.log" ] && grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality.log" | cut -c1-220
  echo "=== precision"; for f in prec_tests hopper; do [ -f "$OUT/$f.log" ] && grep -v "^{" "$OUT/$f.log" | tail -n 50 | cut -c1-200; done
  for r in fp8 bf16; do [ -f "$OUT/tr_$r.log" ] && { echo "--- $r"; python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-500; }; done
  for f in mfu_full mfu_trainer; do echo "=== $f"; [ -f "$OUT/$f.log" ] && grep -v '^{' "$OUT/$f.log" | tail -n 22 | cut -c1-200; done
  for r in ckpt; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && { python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -2 | cut -c1-1200; grep -iE "warn|error|Traceback" "$OUT/tr_$r.log" | head -4 | cut -c1-300; }; done
}
gpu_begin "${WATCH:-575}"
st setup 40 bash tools/fa4_setup.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
case "${PART:-b}" in
b)
  st ttfs_cold 130 python3 tools/ttfs.py --preset h200 --steps 3
  st quality 250 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem --eval-at 100,250,500,750,1000
  st tr_ckpt 110 python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 300 --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  st ttfs_warm 40 python3 tools/ttfs.py --preset h200 --steps 3 ;;
c)
  st quality 390 python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem --eval-at 100,250,500,750,1000
  st mfu_full 170 python3 -m gem_model.bench.local_mfu --compile --no-reference ;;
e)
  cold() { local d=/tmp/cache_$1; mkdir -p $d; TORCHINDUCTOR_CACHE_DIR=$d/ind TRITON_CACHE_DIR=$d/tri FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$d/fa4 "${@:2}"; }
  cold on st ttfs_on 130 python3 tools/ttfs.py --preset h200 --steps 3
  cold off st ttfs_off 130 python3 tools/ttfs.py --preset h200 --steps 3 --no-prewarm
  cold on st ttfs_on_warm 40 python3 tools/ttfs.py --preset h200 --steps 3
  st gpu_test 80 python3 -m pytest -q -p no:cacheprovider -rf trainer/tests/test_prewarm.py
  st mfu_trainer 170 python3 -m gem_model.bench.local_mfu --compile --no-reference --tokens 262144 --cap 16384 ;;
f)
  st prec_tests 120 python3 -m pytest -q -p no:cacheprovider -rf precision/tests/test_fp8_block_triton.py precision/tests/test_fp8_block.py -k "gpu or opaque"
  (cd precision && PYTHONPATH=.:$PYTHONPATH st hopper 120 python3 -m gem_precision.bench.hopper --quick --no-mxfp8 --profile)
  st tr_fp8 150 python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 300 --precision fp8_block
  st tr_bf16 120 python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 300 ;;
d)
  st mfu_trainer 250 python3 -m gem_model.bench.local_mfu --compile --no-reference --tokens 262144 --cap 16384 ;;
esac
gpu_end
