#!/usr/bin/env bash
# What the tenth session left to measure on the GPU, in one call (~8 minutes, one H200):
#   1. the issue-#16 command uncut (`--steps 300`, a limit of 240 s: the tenth session's run
#      was cut at step 294 by a 200 s limit after an 80 s cold start); then the same with
#      `--ckpt-every 50` twice: to /tmp (the machine's disk: 0.42 GB/s idle, and the
#      tenth session's saves kept one per ~150 steps, not 50) and to /dev/shm (memory: if
#      its writes still outlast 50 steps, the writer thread contends with the loop, not with
#      the disk), and to /tmp again with Python's thread switch interval at 0.5 ms instead
#      of 5 ms (`sys.setswitchinterval`; on the CPU box a GIL-hungry thread beside a save of
#      400 tensors stretched its write 0.75 -> 6.2 s, and 2.0 s / 1.1 s at 1 ms / 0.2 ms; a
#      busy *process* left it at 0.84 s: the writer's per-tensor torch.save waits for the
#      GIL); `ckpt_steps_between_saves` (gem-trainer 0.2.4) gives the cadence kept;
#   2. the short-kv GDPA tile sweep (`bench.gdpa --short`, 16 q tiles per program) and the
#      model's local MFU compiled on the trainer's batch (`--tokens 262144 --cap 16384`;
#      the full bench batch compiled: 14.5 %, tenth session).
# A watchdog writes the summary and the archive at WATCH seconds (default 560).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in 300 ckpt_disk ckpt_shm ckpt_switch; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1; done
  echo "=== gdpa short"; [ -f "$OUT/gdpa_short.log" ] && grep -E "^default|^BM=" "$OUT/gdpa_short.log" | cut -c1-120
  echo "=== local_mfu_trainer"; [ -f "$OUT/local_mfu_trainer.log" ] && grep -E "^weighted|^model e2e" "$OUT/local_mfu_trainer.log"
}
gpu_begin "${WATCH:-560}"
st tr_300 240 python3 $TR
rm -rf /tmp/gem_ck /dev/shm/gem_ck
st tr_ckpt_disk 110 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
rm -rf /tmp/gem_ck
st tr_ckpt_shm 110 python3 $TR --ckpt-every 50 --ckpt-dir /dev/shm/gem_ck
rm -rf /dev/shm/gem_ck
st tr_ckpt_switch 110 python3 -c "import sys, runpy; sys.setswitchinterval(0.0005); sys.argv = ['gem_trainer', *sys.argv[1:]]; runpy.run_module('gem_trainer', run_name='__main__')" \
   --preset h200 --steps 300 --eval-batches 0 --no-progress --ckpt-every 50 --ckpt-dir /tmp/gem_ck
rm -rf /tmp/gem_ck
st gdpa_short 40 python3 -m gem_kernels.bench.gdpa --short
st local_mfu_trainer 60 python3 -m gem_model.bench.local_mfu --compile --no-reference --tokens 262144 --cap 16384
gpu_end
