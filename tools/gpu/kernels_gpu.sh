#!/usr/bin/env bash
# The kernels' GPU check in one go (~140 s): the issue-#15 table and length-mix sweep, the GDPA
# GPU tests (both sigmoid paths), the narrow-tile GDPA backward under CUDA_LAUNCH_BLOCKING.
export PYTHONPATH=kernels PYTHONUNBUFFERED=1; mkdir -p "$OUT"
P="python3 -m pytest -v -p no:cacheprovider"
timeout 70 python3 -m gem_kernels.bench.table --iters 5 --out "$OUT" > "$OUT/k_table.log" 2>&1; echo "rc=$?" >> "$OUT/k_table.log"
timeout 42 $P kernels/tests/test_gdpa_narrow_tiles.py kernels/tests/test_gdpa.py -k "gpu and not narrow_tiles_real" > "$OUT/k_gdpa_gpu.log" 2>&1; echo "rc=$?" >> "$OUT/k_gdpa_gpu.log"
CUDA_LAUNCH_BLOCKING=1 timeout 20 $P kernels/tests/test_gdpa_narrow_tiles.py -k gpu_narrow > "$OUT/k_narrow.log" 2>&1; echo "rc=$?" >> "$OUT/k_narrow.log"
timeout 10 python3 -m gem_kernels.bench.table --narrow-bwd --iters 3 >> "$OUT/k_narrow.log" 2>&1; echo "rc=$?" >> "$OUT/k_narrow.log"
tail -32 "$OUT/k_table.log"
grep -hE "PASSED|FAILED|ERROR|rc=|passed|failed|bwd_tiles" "$OUT/k_gdpa_gpu.log" "$OUT/k_narrow.log" | tail -40
