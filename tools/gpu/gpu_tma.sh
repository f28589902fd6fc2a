#!/usr/bin/env bash
# One 2-GPU call for the Hopper TMA variants of the JFA kernels (issues #15, #16), and the
# trainer's headline step with today's defaults (one-pass backward from 8,192 keys):
#   GPU 0: GPU tests (one-pass + TMA backward, TMA forward, the fp8 quantizer fixes), the
#          backward bench's TMA rows, the TMA forward bench;
#   GPU 1: `--preset h200 --steps 300` (the issue's command, defaults), then 60-step runs with
#          GEM_JFA_TMA=reduce|loads and GEM_JFA_FWD=tma on warm caches.
# Every stage runs under `timeout -k` (tools/stage.sh); a watchdog writes the summary and the
# archive at WATCH seconds (default 540) so a call cut at the device limit still returns logs.
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
TR="python3 -m gem_trainer --preset h200 --eval-batches 0 --no-progress"
summary() { echo "=== stages"; cat "$OUT/rcs.txt"
  echo "=== gpu tests"; grep -E "passed|failed|FAILED|Error" "$OUT/k_gpu_tests.log" | tail -n 25 | cut -c1-260
  echo "=== bwd"; grep -A14 "^JFA backward, two-pass" "$OUT/k_bwd.log" | cut -c1-200
  echo "=== fwd tma"; grep -v '^{' "$OUT/k_fwd.log" | tail -n 60 | cut -c1-220
  for r in tr_base tr_tma_reduce tr_tma_loads tr_fwd_tma; do echo "=== $r"
    [ -f "$OUT/$r.log" ] && { python3 tools/trainer_summary.py "$OUT/$r.log" | head -1; grep -iE "error|illegal" "$OUT/$r.log" | tail -n 3 | cut -c1-300; }; done
}
gpu_begin "${WATCH:-540}"
( export CUDA_VISIBLE_DEVICES=0
  st k_gpu_tests 170 python3 -m pytest -q -p no:cacheprovider kernels/tests/test_jfa_one_pass.py \
     kernels/tests/test_jfa_tma_fwd.py precision/tests/test_fp8_block_triton.py -k gpu
  st k_bwd 120 python3 -m gem_kernels.bench.table --bwd-compare --bwd-cases trainer,issue --no-bwd-sweep --out "$OUT/kbwd"
  st k_fwd 200 python3 -m gem_kernels.bench.fwd_tma --out "$OUT/fwd_tma.json" ) & P0=$!
( export CUDA_VISIBLE_DEVICES=1
  st tr_base 220 $TR --steps 300
  st tr_tma_reduce 80 env GEM_JFA_TMA=reduce $TR --steps 60
  st tr_tma_loads 80 env GEM_JFA_TMA=loads $TR --steps 60
  st tr_fwd_tma 90 env GEM_JFA_FWD=tma $TR --steps 60 ) & P1=$!
wait "$P0" "$P1"
gpu_end
