#!/usr/bin/env bash
# Thirty-eighth session, one Hopper box (the reply names the card), gem-trainer 0.2.20 (train()
# in phases), gem-model 0.5.1:
#   PART=a  (nothing installed; the call carries .fa4a and first copies .fa4a/ir.so.xz to
#           /tmp/fa4a for PART=b): the trainer's GPU tests (no host sync after warm-up, NaN
#           steps skipped on the device, device time per step: the CUDA-only lines that
#           0.2.20 moved), then issue 16's command without FlashAttention-4 from empty caches,
#           `--preset h200 --steps 300` (owed since the thirty-seventh session).
#   PART=b  (carries .fa4b; installs FlashAttention-4): the compiled h200 step's profile,
#           `tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 60`:
#           where the 0.5.1 step's device time goes, with FlashAttention-4.
#   PART=c  (nothing carried) GEMConfig.select_stream_rows (gem-model 0.3.5, never measured in
#           the trainer) off / on, each from its own empty caches (the AOT store keeps compiled
#           blocks by name), then each again warm: `tools/with_model.py select_stream_rows=...
#           -- -m gem_trainer --preset h200 --steps 100`, no FlashAttention-4 (the glue kernels it
#           changes are the same with it).
export PYTHONPATH=$(ls -d */gem_* | xargs -n1 dirname | paste -sd:):tests PYTHONUNBUFFERED=1
. tools/stage.sh
summary() { echo "=== stages"; cat "$OUT/rcs.txt"; nvidia-smi --query-gpu=name --format=csv,noheader
  [ -f "$OUT/gputest.log" ] && { echo "=== gpu tests"; tail -n 3 "$OUT/gputest.log" | cut -c1-300; }
  [ -f "$OUT/long.log" ] && { echo "=== long"; python3 tools/trainer_summary.py "$OUT/long.log" | head -1 | cut -c1-900
    last_summary "$OUT/long.log" model_version jfa_backward step_gpu_s_median time_to_first_step_s | cut -c1-400; }
  for f in off1 on1 off2 on2 off3 on3; do [ -f "$OUT/$f.log" ] && { printf '%s ' "$f"; last_summary "$OUT/$f.log" steps loss step_s_median step_gpu_s_median mfu_steady time_to_first_step_s recompiles_per_100_steps | cut -c1-400; }; done
  [ -f "$OUT/prof.log" ] && { echo "=== profile"; grep -v "^{" "$OUT/prof.log" | tail -n 75 | cut -c1-170; }
}
gpu_begin "${WATCH:-400}"
if [ "${PART:-a}" = a ]; then
  st gputest 120 python3 -m pytest -q -p no:cacheprovider trainer/tests/test_no_sync_step.py \
    trainer/tests/test_slow_steps.py trainer/tests/test_startup.py -k "cuda or late_batch or loader"
  st long $(gpu_left) python3 $H200_TR --steps ${STEPS:-300}
elif [ "$PART" = c ]; then
  arm() { env GEM_CACHE_DIR=/tmp/c_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/c_$1/ind TRITON_CACHE_DIR=/tmp/c_$1/tri \
    python3 tools/with_model.py select_stream_rows=$2 -- $H200_TR --steps ${STEPS:-100}; }
  export -f arm; export H200_TR
  st off1 150 bash -c "arm off false"; st on1 150 bash -c "arm on true"
  for i in 2 3; do
    [ "$(gpu_left)" -gt 60 ] && st off$i 60 bash -c "arm off false"
    [ "$(gpu_left)" -gt 60 ] && st on$i 60 bash -c "arm on true"
  done
else
  st setup 60 bash tools/fa4_setup.sh
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  st prof $(gpu_left) python3 tools/profile_trainer.py --preset h200 --steps 18 --skip 8 --compile --rows 60
fi
gpu_end
