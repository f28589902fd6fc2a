#!/usr/bin/env bash
# Re-check after fixes, on a 2-GPU box (~6 minutes): GPU 0: the GDPA GPU tests (default
# backward tiles) and the transfer bench on the GEM preset; GPU 1: the no-sync GPU tests and
# the h200 trainer with its defaults (compiled) and --ckpt-every 50. One archive comes back.
TOP=${OUT:-/tmp/out}; OUT=$TOP/r/a/b; mkdir -p "$OUT"; export OUT
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
st() { local name=$1 lim=$2; shift 2; local t=$(date +%s)
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? wall=$(( $(date +%s) - t ))s" >> "$OUT/rcs.txt"; }
( export CUDA_VISIBLE_DEVICES=0
  st gdpa_gpu 60 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py -k "gpu_real_sizes and not window"
  st transfer_gem 330 python3 -m gem_transfer.bench.transfer --preset gem --time-budget "${TRANSFER_BUDGET:-300}" ) &
( export CUDA_VISIBLE_DEVICES=1
  st gpu_tests 110 python3 -m pytest -q -p no:cacheprovider tests/test_no_sync_model.py trainer/tests/test_no_sync_step.py
  st trainer 190 python3 -m gem_trainer --preset h200 --steps 250 --eval-batches 0 --no-progress \
     --ckpt-dir /tmp/ck_r --ckpt-every 50 ) &
wait
{ echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== gdpa"; tail -n 3 "$OUT/gdpa_gpu.log"
  echo "=== gpu tests"; grep -E "^FAILED|^E  .*Error|passed|failed" "$OUT/gpu_tests.log" | tail -8
  echo "=== trainer"; grep '^{' "$OUT/trainer.log" | tail -1 | python3 -c "import json,sys; s=json.loads(sys.stdin.read()); print({k: (round(v,4) if isinstance(v,float) else v) for k,v in s.items() if k.startswith(('mfu','step_s','tokens_per','ckpt','compile','recompiles','time_to','optimizer_s','compute_s','steps'))})"
  grep -i "warning" "$OUT/trainer.log" | head -3
  echo "=== transfer"; grep -E "teacher|TARGET|target|^\{" "$OUT/transfer_gem.log" | cut -c1-700 | tail -12 ; } 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
