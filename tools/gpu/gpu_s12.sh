#!/usr/bin/env bash
# Twelfth session's GPU work on one H200 (~8 minutes a call):
#   PART=base  the issue-#16 command uncut (`--steps 300`), then `--ckpt-every 50` to the
#              machine's disk with gem-checkpoint 0.3.x's writes (torch.save's per-record zip
#              crc32 off; the manifest's whole-file crc32 kept), the compiled steady step's
#              profile, and the checkpoint stall bench at the trainer's state size twice in
#              one process tree: record crc32 on (the old writer, patched back) and off.
#   PART=cudnn torch's cuDNN ragged attention as JFA's backward/forward: tools/probe_cudnn.py
#              (correctness vs the fp32 reference, kernel timings). It ran with 100 trainer steps
#              behind a GEM_JFA_BWD=cudnn switch (removed after: wrong gradients, see
#              kernels/BENCHMARKS.md) and the default.
#   PART=final the issue command uncut and `--ckpt-every 50` to disk with gem-checkpoint
#              0.1.3 (record crc off, Python's switch interval at 0.5 ms while a write runs),
#              then the same with the writes at the default 5 ms interval (the A/B).
#   PART=next  for the next session (not run here: the device budget was spent): the stall
#              bench with each writer at the trainer's state size, then `--ckpt-every 50` with
#              `--ckpt-writer process` (keeps it a save every 50 steps?) and the thread writer.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
CRC_ON="import contextlib, runpy, sys; import gem_checkpoint._checkpointer as c; c.without_zip_crc = contextlib.nullcontext; sys.argv = ['stall', *sys.argv[1:]]; runpy.run_module('gem_checkpoint.bench.stall', run_name='__main__')"
# the same run with the writes at Python's default 5 ms switch interval (gem-checkpoint before 0.1.3's change)
SW5="import runpy, sys; import gem_checkpoint._checkpointer as c; c.WRITE_SWITCH_INTERVAL_S = 0.005; sys.argv = ['gem_trainer', *sys.argv[1:]]; runpy.run_module('gem_trainer', run_name='__main__')"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in 300 ckpt_disk ckpt_5ms default ckpt_process ckpt_thread; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-1000; done
  for r in crc_on crc_off process thread; do echo "=== stall_$r"; [ -f "$OUT/stall_$r.log" ] && grep '^{' "$OUT/stall_$r.log" | tail -1 | cut -c1-600; done
  echo "=== probe"; [ -f "$OUT/probe.log" ] && sed -n '/=== table/,$p' "$OUT/probe.log" | cut -c1-220
  echo "=== profile"; [ -f "$OUT/prof.log" ] && tail -n 44 "$OUT/prof.log" | cut -c1-150
}
gpu_begin "${WATCH:-570}"
case "${PART:-base}" in
base)
  st tr_300 230 python3 $TR
  rm -rf /tmp/gem_ck
  st tr_ckpt_disk 120 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck
  st prof 70 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 40
  st stall_crc_on 60 python3 -c "$CRC_ON" --size-gb 3.3 --saves 2 --dir /tmp/gem_st1
  rm -rf /tmp/gem_st1
  st stall_crc_off 60 python3 -m gem_checkpoint.bench.stall --size-gb 3.3 --saves 2 --dir /tmp/gem_st2
  rm -rf /tmp/gem_st2 ;;
cudnn)
  T100="-m gem_trainer --preset h200 --steps 100 --eval-batches 0 --no-progress"
  st probe 150 python3 tools/probe_cudnn.py
  st tr_default 90 python3 $T100 ;;
final)
  st tr_300 240 python3 $TR
  rm -rf /tmp/gem_ck
  st tr_ckpt_disk 130 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck
  st tr_ckpt_5ms 130 python3 -c "$SW5" --preset h200 --steps 300 --eval-batches 0 --no-progress --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck ;;
next)
  st stall_process 60 python3 -m gem_checkpoint.bench.stall --size-gb 3.3 --saves 3 --writer process --dir /tmp/gem_st1
  rm -rf /tmp/gem_st1
  st stall_thread 60 python3 -m gem_checkpoint.bench.stall --size-gb 3.3 --saves 3 --dir /tmp/gem_st2
  rm -rf /tmp/gem_st2
  st tr_ckpt_process 240 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck --ckpt-writer process
  rm -rf /tmp/gem_ck
  st tr_ckpt_thread 130 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck ;;
esac
gpu_end
