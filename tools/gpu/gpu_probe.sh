#!/usr/bin/env bash
# One GPU call: time to first step of the compiled h200 preset (cold: empty caches, writing a
# --compile-cache file; then a fresh cache folder loading that file, as a new machine would),
# a profile of the compiled steady step, and the model's local-MFU bench on its full batch.
OUT=${OUT:-/tmp/out}; TOP=$OUT; OUT=$TOP/r/a/b; mkdir -p "$OUT"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh; export OUT
rm -rf /tmp/gem_ic* /tmp/gem_tc* /tmp/gem_cc.bin
TORCHINDUCTOR_CACHE_DIR=/tmp/gem_ic1 TRITON_CACHE_DIR=/tmp/gem_tc1 \
  st ttfs_cold 170 python3 tools/ttfs.py --preset h200 --steps 6 --compile-cache /tmp/gem_cc.bin
TORCHINDUCTOR_CACHE_DIR=/tmp/gem_ic2 TRITON_CACHE_DIR=/tmp/gem_tc2 \
  st ttfs_fresh_with_file 90 python3 tools/ttfs.py --preset h200 --steps 6 --compile-cache /tmp/gem_cc.bin
TORCHINDUCTOR_CACHE_DIR=/tmp/gem_ic2 TRITON_CACHE_DIR=/tmp/gem_tc2 \
  st ttfs_warm 90 python3 tools/ttfs.py --preset h200 --steps 6
TORCHINDUCTOR_CACHE_DIR=/tmp/gem_ic2 TRITON_CACHE_DIR=/tmp/gem_tc2 \
  st profile_compiled 150 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 45
st local_mfu 150 python3 -m gem_model.bench.local_mfu ${LOCAL_MFU_ARGS:-}
{ echo "=== stages"; cat "$OUT/rcs.txt"
for r in ttfs_cold ttfs_fresh_with_file ttfs_warm; do echo "=== $r"; grep -E "^_compile.compile_inner|compile_fx.<locals>.bw_compiler|^\{" "$OUT/$r.log" | cut -c1-400; done
echo "=== profile"; tail -n 52 "$OUT/profile_compiled.log" | cut -c1-40,100-250
echo "=== local_mfu"; tail -n 18 "$OUT/local_mfu.log" | cut -c1-200; } 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
