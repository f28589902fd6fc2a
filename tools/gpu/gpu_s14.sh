#!/usr/bin/env bash
# Fourteenth session's GPU work on one H200 (~8 minutes a call):
#   PART=rope  rope_qkv_grad's launch sweep with the head-loop variant (the fp32 tables read
#              once per row instead of once per head) and its GPU tests; the steady step's
#              kernel table (the glue left to fuse); the issue's command twice on one box,
#              the kernels' default launch then the head-loop launch (`_rope.HEAD_LOOP=True`
#              set before the trainer starts: the op reads it at each call, nothing recompiles).
#   PART=prof  (kernels 0.2.4: the head-loop launch the default) the issue's command (cold
#              compile), then the steady step's kernel table (warm), the inductor output code
#              of the compiled blocks (which glue kernels are what), and 150 steps with
#              inductor's coordinate-descent tuning of its kernels' launch configs (recompiles).
#   (PART=rope's profile stage was cut: profiling right after a cold compile outlasted 145 s.)
#   PART=final model 0.3.5 (the CLS rows replaced by a per-row select, the stream reads'
#              gradient gathered per row: inductor fuses both with their neighbours): its GPU
#              tests, an A/B on one box (tree A = ./snap_a, an untracked `git archive` of the
#              commit before it, 100 steps; then this tree with the issue's command uncut), the
#              steady step's kernel table, `--ckpt-every 50`.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
T60="-m gem_trainer --preset h200 --steps 60 --eval-batches 0 --no-progress"
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
HL="import runpy, sys, gem_kernels._rope as r; r.HEAD_LOOP = True; sys.argv[0] = 'gem_trainer'; runpy.run_module('gem_trainer', run_name='__main__')"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== rope"; [ -f "$OUT/rope.log" ] && grep -A24 "^rope_qkv_grad at" "$OUT/rope.log" | cut -c1-120
  echo "=== tests"; [ -f "$OUT/tests.log" ] && tail -n 4 "$OUT/tests.log" | cut -c1-300
  for r in a 300 300_hl cd ckpt; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-1200; done
  echo "=== code"; cat "$OUT/code_count.txt" 2>/dev/null
  echo "=== profile"; [ -f "$OUT/prof.log" ] && grep -E "triton_|nvjet|flash|jfa|gdpa|rope|Self CUDA time|kernel_s_total|busy|aten::(copy_|mm|addmm|index|cat|fill_|add|mul)" "$OUT/prof.log" | cut -c1-72,165-200 | head -110
}
gpu_begin "${WATCH:-560}"
case "${PART:-rope}" in
rope)
  (cd kernels && PYTHONPATH=. st rope 90 python3 -m gem_kernels.bench.rope --iters 10)
  st tests 80 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_rope.py
  st prof 130 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 160
  st tr_300 110 python3 $TR
  st tr_300_hl 110 python3 -c "$HL" --preset h200 --steps 300 --eval-batches 0 --no-progress ;;
prof)
  st tr_300 200 python3 $TR
  st prof 80 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 200
  mkdir -p "$OUT/code"; grep -rl --include=*.py "def call(self, args)" /tmp/torchinductor_$(whoami) 2>/dev/null | while read f; do
    [ "$(stat -c %s "$f")" -gt 20000 ] && cp "$f" "$OUT/code/"; done; ls "$OUT/code" | wc -l > "$OUT/code_count.txt"
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 st tr_cd 170 python3 -m gem_trainer --preset h200 --steps 150 --eval-batches 0 --no-progress ;;
final)
  st tests 35 python3 -m pytest -q -p no:cacheprovider -rf model/tests/test_layout.py kernels/tests/test_rope.py
  st tr_300 190 python3 $TR
  PA=$(cd snap_a && ls -d */gem_* | xargs -n1 dirname | sed "s|^|$(pwd)/|" | paste -sd:):$PWD/snap_a/tests
  (cd snap_a && PYTHONPATH=$PA st tr_a 90 python3 $T60)
  st prof 50 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 200 ;;
esac
gpu_end
