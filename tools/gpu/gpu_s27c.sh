#!/usr/bin/env bash
# Twenty-seventh session, last call (one H200), after AotBlocks.preload was removed:
#   pyflags     does this box write Python bytecode caches (PYTHONDONTWRITEBYTECODE, a writable
#               torch folder)? tools/gpu/gpu_s27.sh's profile compiled ~2,400 .py files from source
#               in one process, and a 2-step warm run took ~29 s of wall time for 7.8 s in train();
#   imp_*       `import torch, torch._dynamo, torch._inductor.codecache` timed: as the box is, then
#               with a writable bytecode folder (PYTHONPYCACHEPREFIX), written then read;
#   cold        the h200 preset's default (--compile-aot auto) from nothing, 2 steps;
#   warm1/2     the same again: the trainer's own time to first step (the store loads on demand);
#   warm_pyc    the same with the bytecode folder filled by imp_*;
#   ckpt_end    --steps 100 --ckpt-every 50: the end of the run waits for one write, not two
#               (14.9 s before gem-trainer 0.2.16 saved the last step once).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  [ -f "$OUT/pyflags.log" ] && { echo "=== pyflags"; cat "$OUT/pyflags.log"; }
  for f in imp_box imp_pyc1 imp_pyc2; do [ -f "$OUT/$f.log" ] && echo "$f $(tail -n 1 "$OUT/$f.log")"; done
  for f in cold warm1 warm2 warm_pyc ckpt_end; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s startup_s compile_aot mfu_steady step_s_median ckpt_saves ckpt_stall_per_save_s ckpt_final_wait_s ckpt_state_gb; }; done
}
gpu_begin "${WATCH:-400}"
python3 - > "$OUT/pyflags.log" 2>&1 <<'PY'
import os, sys, torch
d = os.path.dirname(torch.__file__)
print("dont_write_bytecode", sys.flags.dont_write_bytecode, "env", os.environ.get("PYTHONDONTWRITEBYTECODE"),
      "prefix", sys.pycache_prefix, "torch dir writable", os.access(d, os.W_OK),
      "torch/__pycache__ exists", os.path.isdir(os.path.join(d, "__pycache__")),
      "_inductor/__pycache__ files", len(os.listdir(os.path.join(d, "_inductor", "__pycache__"))) if os.path.isdir(os.path.join(d, "_inductor", "__pycache__")) else 0)
PY
IMP='import time; t = time.perf_counter(); import torch, torch._dynamo, torch._inductor.codecache, torch._functorch.aot_autograd; print(round(time.perf_counter() - t, 2), "s")'
st imp_box 120 python3 -c "$IMP"
st imp_pyc1 120 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c "$IMP"
st imp_pyc2 120 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c "$IMP"
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
st cold 200 $TR --steps 2
st warm1 60 $TR --steps 2
st warm2 60 $TR --steps 2
st warm_pyc 60 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc $TR --steps 2
st ckpt_end 150 $TR --steps 100 --ckpt-every 50 --ckpt-dir /tmp/gem_ck_end
gpu_end
