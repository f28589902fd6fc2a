#!/usr/bin/env bash
# Tenth session's GPU work on one H200, two calls (~9 minutes each):
#   PART=ab    the issue-#16 command uncut (`--steps 300`), GEMConfig.merged_stream_reads off
#              (today's default; its first step is the cold start) then on (one GPU, one run
#              after the other), a warm 3-step start of the default (tools/ttfs.py: must show
#              no "autograd_cache_bypass" and dynamo_restarts 0), the no-host-sync GPU test
#              (incl. the compiled merged case), and `--steps 300 --ckpt-every 50` with the
#              switch on (the checkpointed target, against the run without saves);
#   PART=quality  the quality bench's GEM row with the switch on (1,000 steps, the eighth
#              session's samples and held-out set: 0.7536 / 0.7627 / 0.7819 with it off) while
#              the kernels' GPU tests run beside it (correctness only: nothing timed shares the
#              GPU with it), then the model's local MFU compiled (`--compile`, the 40 % target);
#   PART=final after gem-model 0.3.3 (merged_stream_reads on by default) and gem-trainer 0.2.4
#              (a step read at its end keeps its wait for the device; delayed saves stay
#              pipelined): the issue's command uncut, `--steps 300` cold, then with
#              `--ckpt-every 50`, the warm start, and a profile of the steady step.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
W="python3 tools/with_model.py merged_stream_reads=true --"
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for r in off on ckpt_on; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1; done
  echo "=== warm start"; [ -f "$OUT/ttfs_warm.log" ] && tail -n 1 "$OUT/ttfs_warm.log" | cut -c1-500
  echo "=== no-sync test"; [ -f "$OUT/nosync.log" ] && tail -n 2 "$OUT/nosync.log" | cut -c1-200
  echo "=== quality (on)"; [ -f "$OUT/quality_on.log" ] && grep -E " lr=[0-9.e+-]+: mean AUC|Error|^ *[a-z_]+ \||Bayes" "$OUT/quality_on.log" | cut -c1-220
  echo "=== kernel tests"; [ -f "$OUT/kernel_tests.log" ] && grep -E "passed|failed|Error" "$OUT/kernel_tests.log" | tail -n 3 | cut -c1-300
  echo "=== profile"; [ -f "$OUT/prof_on.log" ] && tail -n 32 "$OUT/prof_on.log" | cut -c1-160
  echo "=== local_mfu"; [ -f "$OUT/local_mfu.log" ] && grep -E "^weighted|^model e2e" "$OUT/local_mfu.log"
}
gpu_begin "${WATCH:-560}"
case "${PART:-ab}" in
ab)
  st tr_off 200 python3 $TR
  st tr_on 170 $W $TR
  st ttfs_warm 50 python3 tools/ttfs.py --preset h200 --steps 3
  st nosync 70 python3 -m pytest -q -p no:cacheprovider -rf tests/test_no_sync_model.py
  rm -rf /tmp/gem_ck10
  st tr_ckpt_on 130 $W $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck10 ;;
quality)
  ( st kernel_tests 120 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_gdpa.py -k "gpu or short or deterministic" ) & K=$!
  st quality_on 400 $W -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
     --eval-at 100,250,500,750,1000 --out "$OUT/quality"
  wait $K
  st local_mfu 90 python3 -m gem_model.bench.local_mfu --compile --no-reference ;;
final)
  st tr_off 200 python3 $TR
  rm -rf /tmp/gem_ck10
  st tr_ckpt_on 130 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck10
  st ttfs_warm 50 python3 tools/ttfs.py --preset h200 --steps 3
  st prof_on 70 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 30 ;;
esac
gpu_end
