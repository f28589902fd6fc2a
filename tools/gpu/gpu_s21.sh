#!/usr/bin/env bash
# Twenty-first session's GPU work on one H200, no FlashAttention-4:
#   PART=a  issue 15's kernels under Nsight Compute (`gem_kernels.bench.ncu_cases`, `--set full`,
#           one launch of each kernel per case; `tools/ncu_summary.py` prints the table), then the
#           one-pass backward's dK/dV order on the trainer batch (`bench.schedule --onepass-ab`).
#   PART=b  the Block forward's host time per layer of the call (`tools/probe_launch.py`), then
#           the JFA backward on issue 15's batch with the one-pass and two-pass dK/dV tile
#           sweeps (`bench.table --bwd-compare --bwd-cases issue`).
#   PART=c  after the cached Block launch (gem_kernels._launch) and the one-pass backward in batch
#           order: the host-time probe again, the two-pass dK/dV tiles interleaved
#           (`bench.schedule --twopass-ab 5`), the issue's table, the Block / launch tests and the
#           JFA schedule and GPU tests.
#   PART=d  the cached launch fixed (Triton 3.6's empty hook chain had sent every call through
#           Triton's path): the host-time probe, the issue's table, the Block and launch tests.
#   PART=e  the final launch code (u64 flag in the key, the interpreter read once): the probe and
#           the Block and launch tests again.
#   PART=f  (ran at commit 309450e; the experiment was reverted after it, so this PART needs that
#           commit) the pipelined JFA forward (`JfaConfig.fwd_pipe_qk`): interleaved A/B
#           (`bench.schedule --pipe-ab 4`), then its GPU tests.
#   PART=g  (issue 16, the nineteenth session's open question, without FlashAttention-4) the h200
#           trainer with fp8_block_wgrad_bf16 from cold, then bf16 on the same box: does
#           gem-precision 0.3.5 close the gap between fp8's steady MFU and its median step?
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/ncu_table.md" ] && { echo "=== ncu"; cat "$OUT/ncu_table.md" | cut -c1-330; }
  [ -f "$OUT/ncu.log" ] && { echo "=== ncu log"; grep -vE "^==PROF==" "$OUT/ncu.log" | tail -n 8 | cut -c1-200; }
  [ -f "$OUT/probe.log" ] && { echo "=== host time"; tail -n 11 "$OUT/probe.log"; }
  [ -f "$OUT/bwd.log" ] && { echo "=== bwd"; grep -vE "^(\{|\[)" "$OUT/bwd.log" | grep -A80 "JFA backward, two-pass" | cut -c1-230; }
  for f in tr_fp8c tr_bf16; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'mfu_steady' in l]
keys = ('steps', 'loss', 'mfu', 'mfu_steady', 'step_s_median', 'time_to_first_step_s', 'compile_graphs',
        'recompiles_per_100_steps', 'compute_s', 'data_wait_frac')
print({k: rows[-1].get(k) for k in keys} if rows else 'no summary line')" "$OUT/$f.log"; tail -n 2 "$OUT/$f.log" | cut -c1-200; }; done
  [ -f "$OUT/pab.log" ] && { echo "=== pipe a/b"; grep -vE "^(\{|\[)" "$OUT/pab.log" | tail -n 20 | cut -c1-200; grep -iE "error|Traceback" "$OUT/pab.log" | head -5; }
  [ -f "$OUT/tab.log" ] && { echo "=== two-pass a/b"; grep -vE "^(\{|\[)" "$OUT/tab.log" | tail -n 9 | cut -c1-200; }
  [ -f "$OUT/table.log" ] && { echo "=== table"; grep -vE "^\{" "$OUT/table.log" | tail -n 24 | cut -c1-220; }
  for f in t_block t_jfa; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error" "$OUT/$f.log" | tail -n 4 | cut -c1-300; }; done
  [ -f "$OUT/jab.log" ] && { echo "=== one-pass a/b"; grep -vE "^(\{|\[)" "$OUT/jab.log" | tail -n 12 | cut -c1-200; }
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  ncu --version > "$OUT/ncu_version.txt" 2>&1
  mkdir -p /tmp/ncu
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st ncu 330 ncu --profile-from-start off --clock-control none --nvtx \
      --set full --import-source no -f -o /tmp/ncu/k python3 -m gem_kernels.bench.ncu_cases)
  st ncusum 60 sh -c "python3 tools/ncu_summary.py /tmp/ncu/k.ncu-rep --json $OUT/ncu.json > $OUT/ncu_table.md"
  ncu -i /tmp/ncu/k.ncu-rep --page details --csv > "$OUT/ncu_details.csv" 2>&1
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st jab $(left 560) python3 -m gem_kernels.bench.schedule --onepass-ab 5 --iters 5) ;;
b)
  st probe 120 python3 tools/probe_launch.py
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st bwd $(left 560) python3 -m gem_kernels.bench.table --bwd-compare --bwd-cases issue --iters 7) ;;
c)
  st probe 60 python3 tools/probe_launch.py
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st tab 130 python3 -m gem_kernels.bench.schedule --twopass-ab 5 --iters 7)
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st table 170 python3 -m gem_kernels.bench.table --iters 7)
  st t_block 60 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_block.py kernels/tests/test_launch.py
  st t_jfa $(left 565) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py -k "gpu or schedule" ;;
d)
  st probe 60 python3 tools/probe_launch.py
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st table 170 python3 -m gem_kernels.bench.table --iters 7)
  st t_block 90 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_block.py kernels/tests/test_launch.py ;;
e)
  st probe 60 python3 tools/probe_launch.py
  st t_block 90 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_block.py kernels/tests/test_launch.py ;;
f)
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st pab 200 python3 -m gem_kernels.bench.schedule --pipe-ab 4 --iters 10)
  st t_jfa $(left 300) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py -k "pipelined" ;;
g)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60"
  st tr_fp8c 215 $TR --precision fp8_block_wgrad_bf16
  st tr_bf16 $(left 360) $TR ;;
esac
gpu_end
