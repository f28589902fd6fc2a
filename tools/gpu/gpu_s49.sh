#!/usr/bin/env bash
# The forty-ninth session's GPU plan (tools/stage.sh: summary.txt + all.tgz), for an H200
# (runs on what comes). gem-model 0.6.4 and gem-parallel 0.3.15 have not run on a GPU before.
# PART=h (carries .fa4a): copies the compiler library to /tmp/fa4a, then issue 16's figures
#   without flash-attn-4: "cold" 100 steps from empty inductor/Triton/--compile-aot folders,
#   "ckpt" 300 steps with --ckpt-every 50 over them, "steady" 300 steps, "warmfg" with time left
#   (--no-compile-background: the kept variants load before the first step; none compiles).
# PART=m (carries .fa4b, on the same warm box): installs flash-attn-4 (tools/fa4_setup.sh);
#   "mfu": `python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph`;
#   "fa4": issue 16's command, 300 steps, over PART=h's caches, with flash-attn-4.
# PART=t (carries .fa4a; then PART=m2 on the same box): copies the compiler library, then issue
#   15's table without flash-attn-4 (our kernels). PART=m2 (carries .fa4b): flash-attn-4, "mfu" only.
# PART=w: which JFA backward is fastest now (gem-kernels 0.3.8's faster Triton backwards against
#   torch's FlashAttention-2 backward, the default without flash-attn-4 since the seventh
#   session): `gem_kernels.bench.bwd` (all three on 11 cases, one process), then the h200
#   trainer eager (--no-compile, 60 steps) with GEM_JFA_BWD=flash / two_pass / one_pass,
#   alternating, two rounds.
# PART=k (next session; not yet run): the compiled h200 trainer under gem-kernels 0.3.9's
#   default backward against GEM_JFA_BWD=flash (0.3.8's): "cold" 100 steps to fill the caches,
#   then 300-step runs alternating default / flash while time is left (the backward is chosen
#   at run time inside the custom op, so both arms load the same compiled blocks).
# PART=b: issue 15's table (`gem_kernels.bench.table`), then every kernel GPU test.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; echo "$GPU"
  for f in cold ckpt steady warmfg fa4; do [ -f "$OUT/$f.log" ] && { printf '%s ' $f; last_summary "$OUT/$f.log" steps loss step_s_median mfu_steady time_to_first_step_s startup_s warmup_steps compiled_from_step recompiles_per_100_steps ckpt_saves ckpt_stall_frac ckpt_stall_per_save_s ckpt_final_wait_s ckpt_state_gb | cut -c1-700; grep -o '"compile_aot": {[^}]*}' "$OUT/$f.log" | tail -1 | sed 's/"rejected": \[[^]]*\], //' | cut -c1-300; }; done
  for f in "$OUT"/e_*.log "$OUT"/k_*.log; do [ -f "$f" ] && { printf '%s ' "$(basename "$f" .log)"; last_summary "$f" steps loss step_s_median step_gpu_s_median mfu_steady; }; done
  [ -f "$OUT/bwd.log" ] && sed -n '/^JFA backward paths/,$p' "$OUT/bwd.log" | grep -v '^{' | cut -c1-250
  [ -f "$OUT/mfu.log" ] && grep -E "^(GEM local|seq_attention|seq_ffn|pooling|interaction|weighted|model e2e|e2e, layers|whole)" "$OUT/mfu.log" | cut -c1-160
  [ -f "$OUT/table.log" ] && sed -n '/^case/,$p' "$OUT/table.log" | grep -v '^{' | cut -c1-250
  [ -f "$OUT/kt.log" ] && { grep -E "FAILED|ERROR" "$OUT/kt.log" | head -20; tail -3 "$OUT/kt.log"; }; }
# The flash-attn-4 wheels come in two calls on one box: `fa4a` (a call carrying .fa4a) keeps
# the compiler library in /tmp/fa4a; `fa4b` (a later call carrying .fa4b) installs the package.
fa4a() { mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/; }
fa4b() { st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1; }
gpu_begin "${WATCH:-530}"
export GEM_CACHE_DIR=/tmp/gemc TORCHINDUCTOR_CACHE_DIR=/tmp/gemc/ind TRITON_CACHE_DIR=/tmp/gemc/tri
case ${PART:-h} in
h) fa4a
   st cold 170 python3 $H200_TR --steps 100
   rm -rf /tmp/ck; st ckpt 110 python3 $H200_TR --steps 300 --ckpt-every 50 --ckpt-dir /tmp/ck
   st steady 100 python3 $H200_TR --steps 300
   [ "$(gpu_left)" -gt 35 ] && st warmfg "$(gpu_left)" python3 $H200_TR --steps 60 --no-compile-background;;
m) fa4b
   st mfu 260 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
   [ "$(gpu_left)" -gt 60 ] && st fa4 "$(gpu_left)" python3 $H200_TR --steps 300;;
t) fa4a
   st table "$(gpu_left)" bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7";;
m2) fa4b
   st mfu "$(gpu_left)" python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph;;
w) st bwd 150 bash -c "cd kernels && python3 -m gem_kernels.bench.bwd --iters 7"
   for r in 1 2; do for a in flash two_pass one_pass; do
     [ "$(gpu_left)" -gt 40 ] && st e_${a}_$r 40 env GEM_JFA_BWD=$a python3 $H200_TR --steps 60 --no-compile; done; done;;
k) st cold 170 python3 $H200_TR --steps 100
   for r in 1 2; do for a in default flash; do
     [ "$(gpu_left)" -gt 90 ] && st k_${a}_$r 90 env $([ $a = flash ] && echo GEM_JFA_BWD=flash) python3 $H200_TR --steps 300; done; done;;
b) st table 220 bash -c "cd kernels && python3 -m gem_kernels.bench.table --iters 7"
   st kt "$(gpu_left)" python3 -m pytest -q -p no:cacheprovider kernels/tests -k gpu;;
esac
gpu_end
