#!/usr/bin/env bash
# Twentieth session's GPU work (issue 15) on one H200, no FlashAttention-4 (the JFA "default
# path" rows are then our forward or torch's FlashAttention-2 by the mean-length rule):
#   PART=a  the tile order of the GDPA long-kv kernels (gem-kernels 0.3.2: heaviest first) and
#           a forward tile sweep (`bench.schedule`), then the GDPA GPU tests, every one run.
#   PART=b  batch order (the default after a): two runs of it for the spread, forward and
#           backward tile sweeps, JFA's Triton path in batch order; the JFA GPU tests.
#   PART=c  the final state: the issue's table (`bench.table`), the schedule bench again, and
#           every GDPA and JFA GPU test.
#   PART=d  JFA's schedules interleaved over 7 rounds (medians), then the JFA GPU tests.
#   PART=e  the q-side tiles last to first in batch order: JFA's and GDPA's orders interleaved.
#   PART=f  (not run) the GPU tests of the final defaults (GDPA, JFA).
#   PART=g  JFA's orders again (the forward in batch order by default then) with the pooling
#           shape's forward, then the schedule tests on the GPU.
#   PART=h  (not run: too little device time was left to start a box) the one-pass backward's
#           dK/dV order (grid vs batch order) on the trainer batch.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/table.log" ] && { echo "=== table"; grep -vE "^\{" "$OUT/table.log" | tail -n 32 | cut -c1-220; }
  [ -f "$OUT/jab.log" ] && { echo "=== jfa a/b"; grep -vE "^(\{|\[)" "$OUT/jab.log" | tail -n 16 | cut -c1-200; }
  [ -f "$OUT/sched.log" ] && { echo "=== schedule"; grep -vE "^(\{|\[)" "$OUT/sched.log" | grep -v "^sweep" | tail -n 40 | cut -c1-200; grep "failed" "$OUT/sched.log" | head -5 | cut -c1-200; }
  for f in t_gdpa t_narrow t_jfa t_sched; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error" "$OUT/$f.log" | tail -n 4 | cut -c1-300; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
e)  # q-side tiles last to first in batch order (JfaConfig.reverse_q, GdpaTiles "in_order_rev"),
    # interleaved A/Bs of JFA's and GDPA's orders over 7 rounds
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st jab 300 python3 -m gem_kernels.bench.schedule --jfa-ab 7 --gdpa-ab 7 --iters 15) ;;
g)  # the forward in batch order by default: JFA's orders again on another box, plus the
    # trainer's pooling forward (grid vs batch order); the schedule tests on the GPU
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st jab 200 python3 -m gem_kernels.bench.schedule --jfa-ab 7 --iters 15)
  st t_sched $(left 330) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py kernels/tests/test_gdpa.py -k schedule ;;
h)  # the one-pass backward's dK/dV order on the trainer batch (the last "not measured")
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st jab 150 python3 -m gem_kernels.bench.schedule --onepass-ab 5 --iters 5) ;;
f)  # the final defaults' GPU tests
  st t_gdpa 250 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py kernels/tests/test_gdpa_narrow_tiles.py -k "gpu or schedule"
  st t_jfa $(left 400) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py -k "gpu or schedule" ;;
d)  # after c: JFA's schedules interleaved over 7 rounds (the forward's A/B was inside the spread),
    # with the backward alone in batch order (the new default); the JFA GPU tests again
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st jab 200 python3 -m gem_kernels.bench.schedule --jfa-ab 7 --iters 15)
  st t_jfa $(left 420) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py -k "gpu or schedule" ;;
c)  # the final state (gem-kernels 0.3.2: JFA's two-pass default in batch order too): the issue's
    # table, the schedule bench again (a second sample of each A/B), every GDPA and JFA GPU test
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st table 170 python3 -m gem_kernels.bench.table --iters 7)
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st sched $(left 300) python3 -m gem_kernels.bench.schedule --iters 7)
  st t_gdpa $(left 450) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py kernels/tests/test_gdpa_narrow_tiles.py -k "gpu or schedule"
  st t_jfa $(left 570) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py -k "gpu or schedule" ;;
b)  # gem-kernels 0.3.2 in batch order (the new default): spread, sweeps, JFA in batch order
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st sched 330 python3 -m gem_kernels.bench.schedule --iters 7)
  st t_jfa $(left 540) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_jfa_one_pass.py -k "gpu or schedule" ;;
a)
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st sched 240 python3 -m gem_kernels.bench.schedule --iters 7)
  st t_gdpa $(left 480) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa.py -k "gpu or schedule"
  st t_narrow $(left 560) python3 -m pytest -q -p no:cacheprovider kernels/tests/test_gdpa_narrow_tiles.py -k gpu ;;
esac
gpu_end
