"""Time to first step of a gem_trainer run, and where compile spent it.

    python3 tools/ttfs.py [--preset h200] [--steps 3] [--compile/--no-compile]
                          [--compile-cache FILE] [--compile-aot DIR]

Run it twice with the same TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR: the first run is cold
(empty caches), the second warm. Prints the trainer's summary keys for the first step and
torch._dynamo's compile-time table (per phase, seconds), then one JSON line (with AOTAutograd's
cache counters: a warm start should show only hits, no bypass). Dynamo is imported after the
run, as `python3 -m gem_trainer` does, so `ttfs_s` is the trainer's own figure (before
2026-12-05 this script imported it first, ~2 s less in `startup_s.setup` on the H200 box);
`before_train_s` is the process's age when `train()` started.
"""
import argparse
import json
import time

from gem_trainer import config as tc
from gem_trainer._loop import train

p = argparse.ArgumentParser()
p.add_argument("--preset", default="h200")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None)
p.add_argument("--compile-cache", default="", help="the trainer's --compile-cache file")
p.add_argument("--compile-aot", default="", help="the trainer's --compile-aot folder (blocks compiled ahead of time)")
a = p.parse_args()
over: dict[str, object] = {"steps": a.steps, "eval_batches": 0, "progress": False}
if a.compile is not None:
    over["compile"] = a.compile
if a.compile_cache:
    over["compile_cache"] = a.compile_cache
if a.compile_aot:
    over["compile_aot"] = a.compile_aot
t0 = time.perf_counter()
s = train(tc.PRESETS[a.preset](**over))
wall = time.perf_counter() - t0
import torch._dynamo.utils  # noqa: E402  (after the run: its import is part of a real start)
from torch._dynamo.utils import counters  # noqa: E402

print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))
print(json.dumps({"ttfs_s": s.get("time_to_first_step_s"), "startup_s": s.get("startup_s"),
                  "before_train_s": s.get("before_train_s"),
                  "wall_s": round(wall, 2),
                  "step_s_median": s.get("step_s_median"), "steps": s.get("steps"),
                  **{k: v for k, v in s.items() if k.startswith("compile_")},
                  # AOTAutograd's cache per block graph (hit / miss / saved / bypass) and
                  # dynamo's restarts of a whole analysis (0 since gem-parallel 0.3.2)
                  "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
                  "dynamo_restarts": sum(1 for k in torch._dynamo.utils.compilation_time_metrics
                                         if k.startswith("compile_attempt_") and k != "compile_attempt_0")}))
