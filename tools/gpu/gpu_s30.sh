#!/usr/bin/env bash
# Thirtieth session's plan for one H200 (or whichever Hopper card comes; the reply names it).
#   PART=a  (first call; a warm machine keeps /tmp and ~/.cache for PART=b)
#     fa4a      copies .fa4a/ir.so.xz to /tmp/fa4a for PART=b's flash-attn-4 set-up;
#     cold      the h200 default (--compile-aot auto) from nothing, 2 steps;
#     long      the same folder, 60 steps: the store's later variants are compiled here, and
#               the summary's compile_aot.rejected names the guard each stored one failed;
#     warm      2 steps with the filled folder;
#     pyc1/pyc2 the same with Python bytecode written (PYTHONDONTWRITEBYTECODE unset,
#               PYTHONPYCACHEPREFIX=/tmp/pyc), the second under cProfile: where a warm start's
#               time goes, function by function (prof.txt: the top of the cumulative table).
#   PART=b  (the next call, .fa4b carried) flash-attn-4's set-up, then the model's local MFU
#           twice (--cuda-graph), issue 16's 40 % on more than one sample.
#   PART=c  long (60 steps) again, from an empty folder on a fresh box, after gem-parallel 0.3.9: PART=a's
#           compile_aot.rejected printed the first parts of dynamo's one multi-part size guard
#           (cut at 300 characters), not the part the batch broke; now it names that part.
#   PART=d  the warm start sampled by py-spy (wall clock, unlike cProfile, which dynamo's frame
#           hook confuses): `.whl` carried with the py-spy wheel, built here by
#           `python3 -m pip download --no-deps --only-binary=:all: --platform manylinux1_x86_64
#           -d .whl py-spy==0.4.3`; a 2-step run fills the store, then two sampled warm runs
#           (as the box is; with bytecode written to /tmp/pyc), each summarised by
#           tools/stacks.py (the seconds under train(), the share importing modules).
#   PART=cd (thirty-first session, one call on a fresh box, `.fa4a` and `.whl` carried) PART=c's
#           long run, then PART=d's sampled warm starts over the store it filled; also copies
#           .fa4a for a PART=b call that follows at once on the same warm machine.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  for f in mfu1 mfu2; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; grep -E "^(GEM local|weighted|whole|model e2e|e2e, layers)" "$OUT/$f.log" | cut -c1-160; }; done
  for f in cold long warm pyc1 pyc2 fill pyc_fill spy_box spy_pyc; do [ -f "$OUT/$f.log" ] && { echo "=== $f"; last_summary "$OUT/$f.log" steps loss time_to_first_step_s startup_s compile_aot recompiles_per_100_steps mfu_steady step_s_median | cut -c1-1500; }; done
  [ -f "$OUT/long.log" ] && { echo "=== long: rejected"; python3 -c "
import json; s = [json.loads(l) for l in open('$OUT/long.log') if l.startswith('{') and 'mfu_steady' in l][-1]
print(*s['compile_aot']['rejected'], sep='\n')" 2>&1 | cut -c1-400; }
  for f in spy_box spy_pyc; do [ -f "$OUT/$f.txt" ] && { echo "=== $f"; python3 tools/stacks.py "$OUT/$f.txt" --top 15 | cut -c1-150; }; done
  [ -f "$OUT/prof.txt" ] && { echo "=== prof"; head -n 45 "$OUT/prof.txt" | cut -c1-150; }
}
gpu_begin "${WATCH:-550}"
TR="-m gem_trainer --preset h200 --eval-batches 0 --no-progress"
if [ "${PART:-a}" = cd ]; then
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/ 2>/dev/null
  st long "${LIM:-280}" python3 $TR --steps "${STEPS:-60}"
fi
if [ "${PART:-a}" = d ] || [ "${PART:-a}" = cd ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy-*.whl || exit 2
  [ "${PART:-a}" = d ] && st fill 200 python3 $TR --steps 2
  st pyc_fill 60 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 $TR --steps 2
  st spy_box 90 /tmp/spy/bin/py-spy record -r 200 -f raw -o "$OUT/spy_box.txt" -- python3 $TR --steps 2
  st spy_pyc 90 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc /tmp/spy/bin/py-spy record -r 200 -f raw -o "$OUT/spy_pyc.txt" -- python3 $TR --steps 2
elif [ "${PART:-a}" = c ]; then
  st long "${LIM:-280}" python3 $TR --steps "${STEPS:-60}"  # from an empty folder: 2 + 2 variants (on the H100 the later ones came by step 6)
elif [ "${PART:-a}" = b ]; then
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
  for i in 1 2; do st mfu$i 240 python3 -m gem_model.bench.local_mfu --compile --no-reference --cuda-graph; done
else
  mkdir -p /tmp/fa4a && cp .fa4a/ir.so.xz /tmp/fa4a/ 2>/dev/null
  st cold 200 python3 $TR --steps 2
  st long 200 python3 $TR --steps 60
  st warm 60 python3 $TR --steps 2
  st pyc1 60 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 $TR --steps 2
  st pyc2 90 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m cProfile -o "$OUT/prof.out" $TR --steps 2
  [ -f "$OUT/prof.out" ] && python3 -c "import pstats,sys; pstats.Stats('$OUT/prof.out', stream=sys.stdout).sort_stats('cumulative').print_stats(80)" > "$OUT/prof.txt" 2>&1
fi
gpu_end
