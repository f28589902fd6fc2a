#!/usr/bin/env bash
# One GPU call: time to first step cold and warm (compiled h200 preset, own cache dirs), a
# profile of the compiled step, and the model's local-MFU bench on its full batch.
OUT=${OUT:-/tmp/out}; TOP=$OUT; OUT=$TOP/r/a/b; mkdir -p "$OUT"
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh; export OUT
export TORCHINDUCTOR_CACHE_DIR=/tmp/gem_ic TRITON_CACHE_DIR=/tmp/gem_tc
rm -rf /tmp/gem_ic /tmp/gem_tc
st ttfs_cold 170 python3 tools/ttfs.py --preset h200 --steps 3
st ttfs_warm 90 python3 tools/ttfs.py --preset h200 --steps 3
st profile_compiled 120 python3 tools/profile_trainer.py --preset h200 --steps 30 --compile --rows 40
st local_mfu 120 python3 -m gem_model.bench.local_mfu ${LOCAL_MFU_ARGS:-}
{ echo "=== stages"; cat "$OUT/rcs.txt"
for r in ttfs_cold ttfs_warm; do echo "=== $r"; tail -n 25 "$OUT/$r.log" | cut -c1-200; done
echo "=== profile"; tail -n 48 "$OUT/profile_compiled.log" | cut -c1-170
echo "=== local_mfu"; tail -n 30 "$OUT/local_mfu.log" | cut -c1-200; } 2>&1 | tee "$TOP/summary.txt"
tar -czf "$TOP/all.tgz" -C "$OUT" . 2>/dev/null
