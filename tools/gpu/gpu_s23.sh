#!/usr/bin/env bash
# Twenty-third session's GPU plan on one H200 (not run in that session: it had no device time left;
# the next session with device time runs it):
#   PART=a  the GPU tests of what landed without a GPU run: offsets as strided views (JFA, GDPA,
#           BlockAttention), the sparse row-wise Adagrad (bf16 reference now sums in float32);
#           then the h200 trainer, 60 steps, --gc-freeze, then without it (the default), then
#           --gc-freeze again (warm) on one box: do steps 15 and 46 (0.41-0.43 s against a ~0.24 s
#           median in every earlier run) carry a full garbage collection (summary gc.worst_step,
#           slow_steps[].gc_s), and does the freeze remove it?
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "=== probe"; tail -n 3 "$OUT/probe.log" 2>/dev/null | cut -c1-300
  [ -f "$OUT/t_kernels.log" ] && { echo "=== t_kernels"; grep -E "passed|failed|error|Error" "$OUT/t_kernels.log" | tail -n 6 | cut -c1-300; }
  for f in tr_freeze tr_nofreeze tr_freeze2; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'mfu_steady' in l]
keys = ('steps', 'loss', 'mfu_steady', 'step_s_median', 'time_to_first_step_s', 'gc', 'slow_steps')
print({k: rows[-1].get(k) for k in keys} if rows else 'no summary line')" "$OUT/$f.log"; tail -n 2 "$OUT/$f.log" | cut -c1-200; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  st probe 30 python3 -c "import torch, torch._dynamo.aot_compile as a; print(torch.__version__, hasattr(torch.compiler, 'load_compiled_function'), hasattr(a, 'aot_compile_fullgraph'), hasattr(a, 'aot_compile_module'))"
  st t_kernels 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa.py kernels/tests/test_gdpa.py \
      kernels/tests/test_block.py kernels/tests/test_rowwise_adagrad.py -k "strided or sparse"
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60"
  st tr_freeze 200 $TR --gc-freeze
  st tr_nofreeze 130 $TR
  st tr_freeze2 $(left 565) $TR --gc-freeze ;;  # (the first run on a box is cold: compare the warm two with it)
esac
gpu_end
