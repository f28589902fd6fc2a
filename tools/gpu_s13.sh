#!/usr/bin/env bash
# Thirteenth session's GPU work on one H200 (~8-9 minutes a call):
#   PART=ckpt  the checkpoint writer process on the GPU (its CUDA-registered shared-memory
#              staging was untested there): the stall bench with `--writer process` at the
#              trainer's state size, then the issue's command with `--ckpt-every 50` with each
#              writer on the same box (does the process writer keep a save every 50 steps?),
#              and the steady step's full kernel table (the glue kernels left to fuse).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in ckpt_process ckpt_thread 300 final; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-1200; done
  for r in process thread; do echo "=== stall_$r"; [ -f "$OUT/stall_$r.log" ] && grep '^{' "$OUT/stall_$r.log" | tail -1 | cut -c1-700; done
  for r in ckpt_process ckpt_thread; do echo "=== warn_$r"; [ -f "$OUT/tr_$r.log" ] && grep -i "warn\|error\|Traceback" "$OUT/tr_$r.log" | head -5 | cut -c1-300; done
  echo "=== profile"; [ -f "$OUT/prof.log" ] && grep -E "triton_|nvjet|flash|jfa|gdpa|Self CUDA time|kernel_s_total|aten::(copy_|mm|addmm|index|cat|fill_)" "$OUT/prof.log" | awk 'NR%1==0' | cut -c1-72,165-200 | head -90
}
gpu_begin "${WATCH:-570}"
case "${PART:-ckpt}" in
ckpt)
  st stall_process 60 python3 -m gem_checkpoint.bench.stall --size-gb 3.3 --saves 3 --writer process --dir /tmp/gem_st1
  rm -rf /tmp/gem_st1
  st tr_ckpt_process 240 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck --ckpt-writer process
  rm -rf /tmp/gem_ck
  st tr_ckpt_thread 130 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck
  st prof 75 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 140 ;;
esac
gpu_end
