#!/usr/bin/env bash
# Twenty-second session's GPU work on one H200, no FlashAttention-4:
#   PART=a  sparse table gradients (gem-kernels 0.3.4's sparse row-wise Adagrad, gem_model.sparse_table_grads):
#           the Adagrad GPU tests (item-table size, no host sync), the trainer's no-sync GPU tests,
#           the model's local MFU compiled with CUDA graphs, sparse then dense table gradients.
#   PART=b  (issue 16) the h200 trainer, 60 steps: table_grads auto (sparse) then dense on one
#           box, then fp8_block_wgrad_bf16 (its summary's slow_steps name the slow steady steps).
#           Carries .fa4a (`run` carry) and copies it to /tmp/fa4a for PART=c on the same box.
#   PART=c  (the box of PART=b, carrying .fa4b) FlashAttention-4 installed (tools/fa4_setup.sh): the
#           local MFU, sparse then dense table gradients, then the quality bench's GEM row.
#   PART=d  the sparse Adagrad (rows not specialised on) and its bench (tables' backward + update,
#           dense vs sparse gradients); BlockAttention's eager plan (gem_kernels._block._Plan): its
#           GPU tests, the host-time probe and the issue table's Block row (5 rounds); then the h200
#           trainer 40 steps dense, sparse, dense, sparse on one box (the first from cold).
#   PART=e  where the sparse step's extra ~2 ms goes: the compiled h200 step profiled
#           (tools/profile_trainer.py, 8 steps after 8), sparse table gradients (cold), then dense.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for f in t_adagrad t_nosync t_block; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "passed|failed|error|Error" "$OUT/$f.log" | tail -n 6 | cut -c1-300; }; done
  for f in mfu_sparse mfu_dense; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -vE "^\{" "$OUT/$f.log" | tail -n 16 | cut -c1-200; }; done
  [ -f "$OUT/probe.log" ] && { echo "=== host time"; tail -n 14 "$OUT/probe.log"; }
  [ -f "$OUT/table.log" ] && { echo "=== table"; grep -vE "^\{" "$OUT/table.log" | tail -n 8 | cut -c1-220; }
  [ -f "$OUT/quality.log" ] && { echo "=== quality"; grep -vE "^\{" "$OUT/quality.log" | tail -n 14 | cut -c1-220; }
  [ -f "$OUT/adagrad.log" ] && { echo "=== adagrad"; grep -vE "^\{" "$OUT/adagrad.log" | tail -n 10 | cut -c1-200; }
  for f in prof_sparse prof_dense; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(Self CUDA|\{)|embedding|sort|scatter|cumsum|adagrad|index|ne_|fill|Memset|copy|zeros|radix|segment|cub|compute_grad|sum_and_scatter|krn|partial" "$OUT/$f.log" | awk '/^\{/ {print; next} {printf "%-62s %10s %7s %6s\n", substr($0,1,62), $(NF-4), $(NF-3), $NF}' | head -36; }; done
  for f in tr_sparse tr_dense tr_fp8 tr_dense2 tr_sparse2; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'mfu_steady' in l]
keys = ('table_grads', 'steps', 'loss', 'mfu', 'mfu_steady', 'step_s_median', 'time_to_first_step_s', 'compile_graphs',
        'recompiles_per_100_steps', 'compute_s', 'optimizer_s', 'slow_steps')
print({k: rows[-1].get(k) for k in keys} if rows else 'no summary line')" "$OUT/$f.log"; tail -n 2 "$OUT/$f.log" | cut -c1-200; }; done
}
left() { echo $(( ${1} - $(date +%s) + T0 )); }
T0=$(date +%s)
gpu_begin "${WATCH:-575}"
case "${PART:-a}" in
a)
  st t_adagrad 90 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_rowwise_adagrad.py
  st t_nosync 150 python3 -m pytest -q -p no:cacheprovider trainer/tests/test_no_sync_step.py -k cuda
  M="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
  st mfu_sparse 150 $M --table-grads sparse
  st mfu_dense $(left 565) $M --table-grads dense ;;
b)
  [ -f .fa4a/ir.so.xz ] && { mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/; }
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 60"
  st tr_sparse 200 $TR
  st tr_dense 130 $TR --table-grads dense
  st tr_fp8 $(left 565) $TR --precision fp8_block_wgrad_bf16 ;;
c)
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  M="python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph"
  st mfu_sparse 120 $M --table-grads sparse
  st mfu_dense 100 $M --table-grads dense
  st quality $(left 570) python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --models gem \
      --eval-at 100,250,500,750,1000 ;;
d)
  st t_adagrad 60 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_rowwise_adagrad.py
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st adagrad 60 python3 -m gem_kernels.bench.adagrad --sparse)
  st t_block 120 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_block.py kernels/tests/test_launch.py
  st probe 60 python3 tools/probe_launch.py
  (cd kernels && PYTHONPATH=.:$PYTHONPATH st table 60 python3 -m gem_kernels.bench.table --block 5 --iters 7)
  TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 40"
  st tr_dense $(left 330) $TR --table-grads dense
  st tr_sparse $(left 390) $TR
  st tr_dense2 $(left 450) $TR --table-grads dense
  st tr_sparse2 $(left 565) $TR ;;
e)
  P="python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --rows 70"
  st prof_sparse 200 $P --table-grads sparse
  st prof_dense $(left 300) $P --table-grads dense ;;
esac
gpu_end
