#!/usr/bin/env bash
# Thirteenth session's GPU work on one H200 (~8-9 minutes a call):
#   PART=ckpt  the checkpoint writer process on the GPU (its CUDA-registered shared-memory
#              staging was untested there): the stall bench with `--writer process` at the
#              trainer's state size, then the issue's command with `--ckpt-every 50` with each
#              writer on the same box (does the process writer keep a save every 50 steps?),
#              and the steady step's full kernel table (the glue kernels left to fuse).
#   PART=ab    model 0.3.4's rope_qkv (tree B = this tree) against tree A = ./snap_a (an
#              untracked `git archive` of the commit before it): the h200 trainer 100 steps, A
#              then B on one GPU, B's steady-step profile, the inductor output code of B's
#              compiled blocks (for the next fusions), then B with the issue's command uncut.
#              (Run: tree A failed to start, a $PWD slip in its PYTHONPATH, fixed below; the code
#              dump found nothing: torch 2.11's output code has `def call(self, args)`.)
#   PART=final the GPU tests of rope_qkv_grad (kernels 0.2.3, model 0.3.4's backward), the
#              issue's command uncut, `--ckpt-every 50` with the default (auto: process)
#              writer, our one-pass JFA backward instead of FlashAttention-2's (100 steps, the
#              A/B), and the steady step's kernel table.
#   PART=next  for the next session (not run: device time spent): rope_qkv_grad's launch sweep
#              with the head-loop variant (tables read once per row) and its GPU tests; then
#              the issue's command (set `_rope.HEAD_LOOP` by the bench's verdict first).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="-m gem_trainer --preset h200 --steps 300 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== rope"; [ -f "$OUT/rope.log" ] && grep -A20 "^rope_qkv_grad at" "$OUT/rope.log" | cut -c1-120
  echo "=== tests"; [ -f "$OUT/tests.log" ] && tail -n 4 "$OUT/tests.log" | cut -c1-300
  for r in ckpt_process ckpt_thread a b 300 ckpt_auto one_pass; do echo "=== $r"; [ -f "$OUT/tr_$r.log" ] && python3 tools/trainer_summary.py "$OUT/tr_$r.log" | head -1 | cut -c1-1200; done
  for r in process thread; do echo "=== stall_$r"; [ -f "$OUT/stall_$r.log" ] && grep '^{' "$OUT/stall_$r.log" | tail -1 | cut -c1-700; done
  for r in ckpt_process ckpt_thread; do echo "=== warn_$r"; [ -f "$OUT/tr_$r.log" ] && grep -i "warn\|error\|Traceback" "$OUT/tr_$r.log" | head -5 | cut -c1-300; done
  echo "=== profile"; [ -f "$OUT/prof.log" ] && grep -E "triton_|nvjet|flash|jfa|gdpa|Self CUDA time|kernel_s_total|aten::(copy_|mm|addmm|index|cat|fill_)" "$OUT/prof.log" | awk 'NR%1==0' | cut -c1-72,165-200 | head -90
}
gpu_begin "${WATCH:-570}"
T100="-m gem_trainer --preset h200 --steps 100 --eval-batches 0 --no-progress"
case "${PART:-ckpt}" in
ab)
  PA=$(cd snap_a && ls -d */gem_* | xargs -n1 dirname | sed "s|^|$(pwd)/|" | paste -sd:):$PWD/snap_a/tests
  (cd snap_a && PYTHONPATH=$PA st tr_a 150 python3 $T100)
  st tr_b 130 python3 $T100
  st prof 60 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 140
  mkdir -p "$OUT/code"; grep -rl --include=*.py "def call(self, args)" /tmp/torchinductor_$(whoami) 2>/dev/null | while read f; do
    [ "$(stat -c %s "$f")" -gt 20000 ] && cp "$f" "$OUT/code/"; done; ls "$OUT/code" | wc -l > "$OUT/code_count.txt"
  st tr_300 150 python3 $TR ;;
final)
  st tests 80 python3 -m pytest -q -p no:cacheprovider -rf kernels/tests/test_rope.py model/tests/test_layout.py -k "rope"
  st tr_300 200 python3 $TR
  rm -rf /tmp/gem_ck
  st tr_ckpt_auto 140 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck
  GEM_JFA_BWD=one_pass st tr_one_pass 70 python3 $T100
  st prof 60 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 140 ;;
ckpt)
  st stall_process 60 python3 -m gem_checkpoint.bench.stall --size-gb 3.3 --saves 3 --writer process --dir /tmp/gem_st1
  rm -rf /tmp/gem_st1
  st tr_ckpt_process 240 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck --ckpt-writer process
  rm -rf /tmp/gem_ck
  st tr_ckpt_thread 130 python3 $TR --ckpt-every 50 --ckpt-dir /tmp/gem_ck
  rm -rf /tmp/gem_ck
  st prof 75 python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 140 ;;
esac
gpu_end
