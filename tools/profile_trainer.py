"""Profiles a short gem_trainer run on the GPU: top CUDA kernels and GPU-busy fraction.

    python3 tools/profile_trainer.py [--preset h200] [--steps 12] [--batch-tokens N]

Prints the 30 kernels with the most CUDA time over the whole run (warm-up included) and the
sum of kernel time per step against the steps' wall time (how much the GPU idles).
"""
import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from gem_trainer import config as tc
from gem_trainer._loop import train

p = argparse.ArgumentParser()
p.add_argument("--preset", default="h200")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--batch-tokens", type=int)
p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
               help="override the preset's compile setting")
p.add_argument("--rows", type=int, default=30, help="rows of the kernel table")
a = p.parse_args()
over: dict[str, object] = {"steps": a.steps, "eval_batches": 0, "progress": False}
if a.batch_tokens:
    over["batch_tokens"] = a.batch_tokens
if a.compile is not None:
    over["compile"] = a.compile
cfg = tc.PRESETS[a.preset](**over)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    s = train(cfg)
ka = prof.key_averages()
print(ka.table(sort_by="self_cuda_time_total", row_limit=a.rows, max_name_column_width=70))
gpu_us = sum(e.self_device_time_total for e in ka)
print(json.dumps({"kernel_s_total": gpu_us / 1e6, "step_s_median": s.get("step_s_median"),
                  "steps": s["steps"], "mfu_steady": s.get("mfu_steady")}))
