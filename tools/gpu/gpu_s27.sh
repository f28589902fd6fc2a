#!/usr/bin/env bash
# Twenty-seventh session (one H200). PART=a: session 26's unrun plan (its gpu_s26b.sh, folded in here and removed), the
# background loading A/B and the GPU's recompile reasons; it carries .fa4a (`run` carry) and
# copies it to /tmp/fa4a for PART=b on the same box. PART=b (carrying .fa4b): FlashAttention-4
# installed (tools/fa4_setup.sh), the model's local MFU (`--compile --cuda-graph`) with the new
# "layers compiled whole" row (issue #16: >= 40 %). PART=a's stages:
#   auto_cold   the h200 preset's default (`--compile-aot auto`: ~/.cache/gem/aot) from nothing;
#   auto_warm   the same again (gem-parallel 0.3.7 loads a variant file only when a call needs it);
#   ab_*        (ran at cfc0c5d; the preload was then removed) tools/ttfs.py warm, the blocks' files loaded in a background thread from the
#               end of parallelize (gem-trainer's new default) or lazily (--no-preload), twice;
#   eager_warm  --no-compile, warm Triton cache: what an eager first step costs;
#   warm_prof   the same under cProfile: where the warm start's loading time goes;
#   recompiles  plain --compile (no AOT store) for 40 steps with TORCH_LOGS=recompiles: which
#               guards make the h200 store's 4 variants of the one block kind;
#   ckpt_end    --steps 100 --ckpt-every 50: the end of the run waits for one write (~5 s), not
#               two (14.9 s before gem-trainer 0.2.16 saved the last step once).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for f in auto_cold auto_warm eager_warm warm_prof recompiles ckpt_end; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s startup_s compile_aot recompiles_per_100_steps mfu_steady ckpt_saves ckpt_stall_per_save_s ckpt_final_wait_s; }; done
  echo "=== preload A/B (tools/ttfs.py: ttfs, first fwd+bwd, load, waited)"
  for f in ab_pre1 ab_lazy1 ab_pre2 ab_lazy2; do [ -f "$OUT/$f.log" ] && tail -n 1 "$OUT/$f.log" | python3 -c "
import json, sys
try:
    d = json.loads(sys.stdin.read()); a = d.get('compile_aot') or {}
    print('$f', d['ttfs_s'], d['startup_s'], a.get('loaded'), a.get('load_s'), a.get('load_wait_s'))
except Exception as e: print('$f', 'no line', e)"; done
  [ -f "$OUT/recompiles.log" ] && { echo "=== recompile reasons"; grep -iE "recompil|triggered by|guard" "$OUT/recompiles.log" | cut -c1-220 | sort | uniq -c | sort -rn | head -30; }
  [ -f "$OUT/mfu.log" ] && { echo "=== local MFU"; grep -vE "^\{" "$OUT/mfu.log" | tail -n 18 | cut -c1-200; }
  [ -f "$OUT/fa4.log" ] && { echo "=== fa4 setup"; tail -n 3 "$OUT/fa4.log"; cat "$OUT/fa4_check.log"; }
  [ -f "$OUT/warm.prof" ] && python3 - "$OUT/warm.prof" <<'PY' > "$OUT/prof.txt" 2>&1
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("cumulative").print_stats(90)
s.sort_stats("tottime").print_stats(40)
PY
  [ -f "$OUT/prof.txt" ] && grep -E "_load_one|load_compiled|deserialize|post_compile|_reload_python|cubin|launcher|LoadData|module_load|precompile|make_launcher|aot|cumtime" "$OUT/prof.txt" | head -40 | cut -c1-200
}
gpu_begin "${WATCH:-420}"
if [ "${PART:-a}" = b ]; then
  st fa4 120 bash tools/fa4_setup.sh
  [ -f /tmp/site/.fa4_ok ] && export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
  python3 -c "from gem_kernels._flash4 import _import_error as e; print('flash4 import error:', e())" > "$OUT/fa4_check.log" 2>&1
  st mfu 400 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph
  gpu_end; exit 0
fi
[ -f .fa4a/ir.so.xz ] && { mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/; }
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
st auto_cold 200 $TR --steps 2
st auto_warm 60 $TR --steps 2
for i in 1 2; do st ab_pre$i 60 python3 tools/ttfs.py --preset h200 --steps 2; st ab_lazy$i 60 python3 tools/ttfs.py --preset h200 --steps 2 --no-preload; done
st eager_warm 60 $TR --steps 2 --no-compile
st warm_prof 60 python3 -m cProfile -o "$OUT/warm.prof" -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 2
ls -laR ~/.cache/gem > "$OUT/cache_files.log" 2>&1
st recompiles 120 env TORCH_LOGS=recompiles $TR --steps 40 --compile-aot ''
st ckpt_end 120 $TR --steps 100 --ckpt-every 50 --ckpt-dir /tmp/gem_ck_end
gpu_end
