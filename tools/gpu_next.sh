#!/usr/bin/env bash
# What the seventh session left to check on the GPU, in one 2-GPU call (~8 minutes):
#   both GPUs first: the two-GPU trainer test (HSDP: the Adagrad kernel on FSDP2 row shards,
#          the FlashAttention-2 backward in the eager multi preset);
#   then GPU 0: the issue-#16 command uncut (`--steps 300`: a cold compile ~68 s + 300 x ~0.25 s;
#          the seventh session's runs were cut at 223 and 290 steps by their stage limits);
#   and GPU 1: the kernels' GPU tests changed after the last GPU run (test_jfa_flash2.py's shared
#          check, test_rowwise_adagrad.py's lr-0 test; both CPU-checked), then a profile of the
#          compiled step with the matrix products' shapes (tools/profile_trainer.py --shapes).
# A watchdog writes the summary and the archive at WATCH seconds (default 560).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
# NVLink multicast stays off on the lent machines (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== trainer --steps 300"; [ -f "$OUT/tr_300.log" ] && python3 tools/trainer_summary.py "$OUT/tr_300.log" | head -1
  for t in kernel_tests multi_gpu; do echo "=== $t"; grep -E "passed|failed|Error" "$OUT/$t.log" | tail -n 4 | cut -c1-300; done
  echo "=== profile"; [ -f "$OUT/profile.log" ] && grep -E "^aten::|kernel_s_per_step" "$OUT/profile.log" | head -n 30
}
gpu_begin "${WATCH:-560}"
st multi_gpu 200 python3 -m pytest -q -p no:cacheprovider -rf trainer/tests/test_multi_gpu.py
( export CUDA_VISIBLE_DEVICES=0
  st tr_300 240 python3 -m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st kernel_tests 120 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_jfa_flash2.py \
     kernels/tests/test_rowwise_adagrad.py
  st profile 170 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --shapes \
     --rows 60 --trace "$OUT/trace.json.gz" ) & P1=$!
wait "$P0" "$P1"
gpu_end
