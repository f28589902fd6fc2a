#!/usr/bin/env bash
# Fifteenth session's GPU work on one H200: FlashAttention-4's Hopper kernels (the optional
# flash-attn-4 package, gem_kernels._flash4) as the JFA forward / backward.
#   PART=fa4   set-up (tools/fa4_setup.sh; a first call copies .fa4a/ir.so.xz to /tmp/fa4a),
#              its GPU tests, the issue's trainer command (300 steps) with FlashAttention-4's
#              forward and backward, then with the default, on one box; then the flash4 bench
#              beside the JFA default paths.
#   PART=final (FlashAttention-4 the default where it runs) the trainer's 300 steps with the
#              held-out evaluation (cold: inductor and FlashAttention-4's JIT), --ckpt-every 50,
#              the old default (our forward + FlashAttention-2's backward) with evaluation on
#              the same box, and the model's local-MFU bench compiled.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== setup"; tail -n 5 "$OUT/setup.log" 2>/dev/null | cut -c1-300
  echo "=== import"; tail -n 8 "$OUT/import.log" 2>/dev/null | cut -c1-400
  echo "=== tests"; [ -f "$OUT/tests.log" ] && tail -n 12 "$OUT/tests.log" | cut -c1-300
  echo "=== flash4"; [ -f "$OUT/flash4.log" ] && grep -v '^{' "$OUT/flash4.log" | tail -n 16 | cut -c1-260
  echo "=== mfu"; [ -f "$OUT/mfu.log" ] && grep -v '^{' "$OUT/mfu.log" | tail -n 30 | cut -c1-200
  for r in fa4 def new ckpt old; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && { python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -2 | cut -c1-900; grep -iE "error|Traceback" "$OUT/tr_$r.log" | head -3 | cut -c1-300; }; done
}
gpu_begin "${WATCH:-570}"
TR="-m gem_trainer --preset h200 --eval-batches 0 --no-progress"
case "${PART:-fa4}" in
fa4)
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st import 60 python3 -c "import flash_attn.cute.interface as i, torch; print('flash_attn.cute ok', torch.__version__)"
  st tests 100 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_jfa_flash4.py
  GEM_JFA_FWD=flash4 GEM_JFA_BWD=flash4 st tr_fa4 190 python3 $TR --steps 300
  st tr_def 110 python3 $TR --steps 300
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st flash4 100 python3 -m gem_kernels.bench.flash4 --iters 5) ;;
final)
  st setup 40 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
  # (as run on 2026-12-03 with limits 190/100/105/60 every stage was cut: a cold inductor and
  # FlashAttention-4 compile plus 300 steps plus the evaluation outlast 190 s; these limits
  # fit one 600 s call without the local-MFU bench, which is PART=mfu)
  st tr_new 280 python3 -m gem_trainer --preset h200 --steps 300 --no-progress
  st tr_ckpt 120 python3 $TR --steps 300 --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  GEM_JFA_FWD=pointer GEM_JFA_BWD=flash st tr_old 120 python3 -m gem_trainer --preset h200 --steps 300 --no-progress ;;
mfu)
  st setup 40 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
  st mfu 300 python3 -m gem_model.bench.local_mfu --compile --no-reference ;;
esac
gpu_end
