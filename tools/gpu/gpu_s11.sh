#!/usr/bin/env bash
# Eleventh session's GPU work on one H200 (~9 minutes a call):
#   PART=base  the issue-#16 command uncut (`--steps 300`, room for the cold start), the
#              compiled steady step's profile (40 rows), and `--ckpt-every 50` twice: to
#              /dev/shm (if its writes still outlast 50 steps, the writer contends with the
#              loop, not with the disk) and to /tmp with Python's thread switch interval at
#              0.5 ms (the CPU box's GIL finding, tools/bench_ckpt_gil.py).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
SW="import sys, runpy; sys.setswitchinterval(0.0005); sys.argv = ['gem_trainer', *sys.argv[1:]]; runpy.run_module('gem_trainer', run_name='__main__')"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in 300 ckpt_shm ckpt_switch ckpt_disk; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-900; done
  echo "=== profile"; [ -f "$OUT/prof.log" ] && tail -n 44 "$OUT/prof.log" | cut -c1-150
}
gpu_begin "${WATCH:-560}"
case "${PART:-base}" in
base)
  st tr_300 240 python3 $TR
  st prof 80 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 40
  rm -rf /dev/shm/gem_ck
  st tr_ckpt_shm 110 python3 $TR --ckpt-every 50 --ckpt-dir /dev/shm/gem_ck
  rm -rf /dev/shm/gem_ck /tmp/gem_ck
  st tr_ckpt_switch 110 python3 -c "$SW" --preset h200 --steps 300 --eval-batches 0 --no-progress --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck ;;
esac
gpu_end
