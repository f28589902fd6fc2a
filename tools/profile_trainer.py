"""Profiles a short gem_trainer run on the GPU: top CUDA kernels and GPU-busy fraction.

    python3 tools/profile_trainer.py [--preset h200] [--steps 12] [--skip 0] [--batch-tokens N]
                                     [--precision fp8_block_wgrad_bf16] [--keep-bf16 PATTERNS]
                                     [--table-grads sparse|dense] [--who N]

Prints the kernels with the most CUDA time and the sum of kernel time per profiled step
against the steps' wall time (how much the GPU idles). `--skip N` starts the profiler after
the N-th completed step (through train's `step_hook`), so a compiled run's warm-up
(compiling, autotuning) stays out of the profile and out of its overhead.
"""
import argparse
import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from gem_trainer import config as tc
from gem_trainer._loop import train

p = argparse.ArgumentParser()
p.add_argument("--preset", default="h200")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--skip", type=int, default=0, help="completed steps before profiling starts")
p.add_argument("--batch-tokens", type=int)
p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
               help="override the preset's compile setting")
p.add_argument("--precision", default=None,
               help="override the preset's precision (e.g. fp8_block_wgrad_bf16: what its compiled step spends)")
p.add_argument("--keep-bf16", default=None,
               help="override the preset's keep_bf16 (fnmatch patterns a low-precision recipe leaves in bf16)")
p.add_argument("--table-grads", default=None, help="override table_grads (sparse or dense)")
p.add_argument("--rows", type=int, default=30, help="rows of the kernel table")
p.add_argument("--trace", default=None, help="also write a Chrome trace here")
p.add_argument("--shapes", action="store_true",
               help="record input shapes; print the matrix products' CUDA time per shape")
p.add_argument("--who", type=int, default=0, metavar="N",
               help="for the N device kernels and copies with the most time outside the GEMMs and "
                    "FlashAttention, print which ops launched them (the op and its callers)")
a = p.parse_args()
if a.skip >= a.steps:
    raise SystemExit(f"--skip={a.skip} must be below --steps={a.steps}")
over: dict[str, object] = {"steps": a.steps, "eval_batches": 0, "progress": False}
if a.batch_tokens:
    over["batch_tokens"] = a.batch_tokens
if a.compile is not None:
    over["compile"] = a.compile
if a.precision is not None:
    over["precision"] = a.precision
if a.keep_bf16 is not None:
    over["keep_bf16"] = a.keep_bf16
if a.table_grads is not None:
    over["table_grads"] = a.table_grads
cfg = tc.PRESETS[a.preset](**over)
# The settled step n is booked one step late, so profile [skip, steps - 1): the last queued
# step still runs inside the window.
active = max(1, a.steps - a.skip - 2)
sched = schedule(wait=max(0, a.skip - 1), warmup=1 if a.skip else 0, active=active, repeat=1)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched,
             record_shapes=a.shapes) as prof:
    s = train(cfg, step_hook=lambda n: prof.step())
ka = prof.key_averages()
print(ka.table(sort_by="self_cuda_time_total", row_limit=a.rows, max_name_column_width=70))
if a.shapes:
    # Which matrix products cost what, by (op, m, k, n): a dimension over 65,536 is the step's
    # token count, which changes every step, so it is folded to "T" (grouping by exact shapes
    # would give every step its own row). Calls and CUDA ms per profiled step, TFLOP/s = 2mkn / time.
    agg: dict[tuple[object, ...], list[float]] = {}
    for e in prof.events():
        if e.name not in ("aten::mm", "aten::addmm") or not e.input_shapes:
            continue
        sh = e.input_shapes[1:] if e.name == "aten::addmm" else e.input_shapes
        if len(sh) < 2 or len(sh[0]) != 2 or len(sh[1]) != 2:
            continue
        (m, k), n = sh[0], sh[1][1]
        row = agg.setdefault((e.name, *("T" if x > 65536 else x for x in (m, k, n))), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += e.device_time_total
        row[2] += 2.0 * m * k * n
    print(f"{'op':12s} {'m':>7s} {'k':>7s} {'n':>7s} {'calls':>6s} {'ms/step':>8s} {'TFLOP/s':>8s}")
    for key, (calls, us, flop) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.rows]:
        tf = f"{flop / us / 1e6:8.0f}" if us else f"{'-':>8s}"
        print(f"{key[0]:12s} {key[1]!s:>7s} {key[2]!s:>7s} {key[3]!s:>7s} {calls / active:6.1f} "
              f"{us / 1e3 / active:8.2f} {tf}")
if a.who:
    # Each CPU op's event lists the device work it launched (`kernels`: the kernels, copies and
    # memsets tied to it by the profiler's correlation ids). Keyed by kernel, then by the
    # launching op and up to three of its callers ("aten::copy_ < aten::clone < ..."): where a
    # glue kernel or a device-to-device copy comes from, without reading a trace.
    # cuBLAS and CUTLASS GEMMs, and flash-attn-4's kernels (kernel_cutlass_kernel_flash_attn...)
    skip = ("nvjet", "gemm", "splitKreduce", "flash_")
    who: dict[str, dict[str, list[float]]] = {}
    for e in prof.events():
        for k in getattr(e, "kernels", []):
            if any(t in k.name for t in skip):
                continue
            chain, op = [], e
            while op is not None and len(chain) < 4:
                chain.append(op.name[:60])
                op = op.cpu_parent
            row = who.setdefault(k.name, {}).setdefault(" < ".join(chain), [0, 0.0])
            row[0] += 1
            row[1] += k.duration
    top = sorted(who.items(), key=lambda kv: -sum(r[1] for r in kv[1].values()))[:a.who]
    print(f"=== who launched the top {len(top)} kernels outside the GEMMs and FlashAttention "
          f"(calls and ms per profiled step)")
    for name, chains in top:
        print(f"{sum(r[1] for r in chains.values()) / 1e3 / active:8.2f} ms  {name[:100]}")
        for chain, (calls, us) in sorted(chains.items(), key=lambda kv: -kv[1][1])[:3]:
            print(f"    {calls / active:6.1f} x {us / 1e3 / active:7.2f} ms  {chain}")
if a.trace:
    prof.export_chrome_trace(a.trace)
# The device's own records (kernels, copies, memsets) only: an op's row (aten::mm, a custom op,
# ProfilerStep*) also carries its kernels' time as its self device time, so summing every row
# counted each kernel two or three times (0.53 s "per step" for 0.18 s steps on an H100). The
# ProfilerStep* range is also recorded on the device as a user annotation (device type CUDA):
# left out too (with it, 0.357 s "per step" for 0.175 s steps on an H100, thirty-ninth session).
gpu_us = sum(e.self_device_time_total for e in ka
             if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
             and not e.key.startswith("ProfilerStep"))
print(json.dumps({"kernel_s_total": gpu_us / 1e6, "kernel_s_per_step": gpu_us / 1e6 / active,
                  "profiled_steps": active, "step_s_median": s.get("step_s_median"),
                  "steps": s["steps"], "mfu_steady": s.get("mfu_steady")}))
