#!/usr/bin/env bash
# Thirty-seventh session, one Hopper box (the reply names the card), gem-model 0.5.1 /
# gem-precision 0.3.6 / gem-trainer 0.2.19, FlashAttention-4 installed (tools/fa4_setup.sh; the
# call before PART=b copies .fa4a/ir.so.xz to /tmp/fa4a; b and c carry .fa4b):
#   PART=b  issue 16's command `--preset h200 --steps 300` from empty caches (cold start,
#           then the steady step), the same with `--ckpt-every 50` (warm), then 3 pairs of warm
#           2-step starts, alternating: as shipped, and with TORCHINDUCTOR_COMPILE_THREADS=1
#           (no compile-worker pool: the blocks load from the store, nothing compiles; the
#           setting is outside inductor's cache key, so both load the same files).
#   PART=c  the model's local-MFU bench (compiled, CUDA-graph replay, full batch); then
#           inductor's dynamic_scale_rblock off (TORCHINDUCTOR_DYNAMIC_SCALE_RBLOCK=0, read
#           when a kernel is compiled and baked into its metadata): a 60-step run compiling
#           into its own store and caches, then warm 2-step starts alternating with the
#           shipped store's while time is left.
# Ran as `WATCH=230 bash tools/gpu/gpu_s35.sh` (with .fa4a and .ab carried; it first copied
# .fa4a/ir.so.xz to /tmp/fa4a), then `PART=b WATCH=570` and `PART=c WATCH=540`, one H200 box,
# 2026-12-06 (trainer/BENCHMARKS.md, model/BENCHMARKS.md).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
warm_line() { python3 -c "
import json; s = [json.loads(l) for l in open('$1') if l.startswith('{') and 'mfu_steady' in l][-1]
p = s['startup_s']; a = s['compile_aot']
print('ttfs %.2f setup %.2f before_first_step %.3f first_fb %.2f load_s %.2f loaded %d compiled %d' % (s['time_to_first_step_s'], p['setup'], p['before_first_step'], p['first_forward_backward'], a['load_s'], a['loaded'], a['compiled']))" 2>&1 | tail -1; }
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/setup.log" ] && tail -n 2 "$OUT/setup.log" | cut -c1-200
  for f in long ckpt rb0; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; python3 tools/trainer_summary.py "$OUT/$f.log" | head -1 | cut -c1-1200
    last_summary "$OUT/$f.log" model_version jfa_backward precision_effective compile_aot | cut -c1-600; grep -iE "warn|Traceback|Error" "$OUT/$f.log" | head -3 | cut -c1-250; }; done
  for f in d1 t1 d2 t2 d3 t3 r1 s1 r2 s2; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; warm_line "$OUT/$f.log"; }; done
  [ -f "$OUT/mfu.log" ] && { echo "=== mfu"; grep -E "^(GEM local|seq_attention|interaction|weighted|model e2e|e2e, layers|attention)" "$OUT/mfu.log" | cut -c1-160; }
}
gpu_begin "${WATCH:-575}"
st setup 60 bash tools/fa4_setup.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
TR=$H200_TR
if [ "${PART:-b}" = b ]; then
  st long 250 python3 $TR --steps 300
  st ckpt 130 python3 $TR --steps 300 --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  for i in 1 2 3; do
    [ "$(gpu_left)" -gt 40 ] && st d$i 40 python3 $TR --steps 2
    [ "$(gpu_left)" -gt 40 ] && TORCHINDUCTOR_COMPILE_THREADS=1 st t$i 40 python3 $TR --steps 2
  done
else
  RB="env GEM_CACHE_DIR=/tmp/rb0 TORCHINDUCTOR_CACHE_DIR=/tmp/rb0/ind TRITON_CACHE_DIR=/tmp/rb0/tri TORCHINDUCTOR_DYNAMIC_SCALE_RBLOCK=0"
  st mfu 230 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  st rb0 170 $RB python3 $TR --steps 60
  for i in 1 2; do  # (25 s: 3 of the 4 were cut at exit, after printing their summary)
    [ "$(gpu_left)" -gt 30 ] && st r$i 25 $RB python3 $TR --steps 2
    [ "$(gpu_left)" -gt 30 ] && st s$i 25 python3 $TR --steps 2
  done
fi
gpu_end
