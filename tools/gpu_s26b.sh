#!/usr/bin/env bash
# Twenty-sixth session, second plan (one H200; it never ran: no device time was left):
#   the h200 preset's new default (`--compile-aot auto`: ~/.cache/gem/aot) from nothing, then
#   warm under cProfile: where the warm start's ~5 s of loading the blocks goes (issue #16's
#   5 s warm start); then a checkpointed run that ends on its interval (--steps 100
#   --ckpt-every 50): the end of the run must wait for one write (~5 s), not two (14.9 s
#   before gem-trainer 0.2.16 saved the last step once).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  for f in auto_cold auto_warm ckpt_end; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s startup_s compile_aot ckpt_saves ckpt_stall_per_save_s ckpt_final_wait_s; }; done
  [ -f "$OUT/warm.prof" ] && python3 - "$OUT/warm.prof" <<'PY' > "$OUT/prof.txt" 2>&1
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("cumulative").print_stats(70)
s.sort_stats("tottime").print_stats(30)
PY
  [ -f "$OUT/prof.txt" ] && grep -E "load_compiled|deserialize|post_compile|_reload_python|triton|cubin|launcher|static|LoadData|module_load|async_compile|precompile|make_launcher|_compile|cumtime" "$OUT/prof.txt" | head -45 | cut -c1-200
}
gpu_begin "${WATCH:-400}"
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 2"
st auto_cold 200 $TR
st auto_warm 60 python3 -m cProfile -o "$OUT/warm.prof" -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 2
ls -laR ~/.cache/gem > "$OUT/cache_files.log" 2>&1
st ckpt_end 120 python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress --steps 100 --ckpt-every 50 --ckpt-dir /tmp/gem_ck_end
gpu_end
