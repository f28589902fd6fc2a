"""Names what a slow steady step of the trainer spends: profiles a window of steps and prints,
per profiler step, the wall time, the GPU kernel time, the CUDA runtime calls that can stall the
host (allocations, frees, synchronisations) and the CPU ops with the most self time; plus the
caching allocators' counters per booked step.

    python3 tools/slow_step_probe.py [--preset h200] [--steps 20] [--first 12] [--last 18]

(Issue #16: steps 15 and 46 of every h200 run take ~0.43 s against a ~0.235 s median, with or
without a garbage-collector freeze; the batches at those steps are not heavier.)
"""
import argparse
import collections
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from gem_trainer import config as tc
from gem_trainer._loop import train

p = argparse.ArgumentParser()
p.add_argument("--preset", default="h200")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--first", type=int, default=12, help="first booked step inside the profile")
p.add_argument("--last", type=int, default=18, help="last booked step inside the profile")
p.add_argument("--json", default=None, help="also write the per-window records here")
a = p.parse_args()

cfg = tc.PRESETS[a.preset](steps=a.steps, eval_batches=0, progress=False)
mem: list[dict[str, float]] = []
KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams",
        "reserved_bytes.all.current")


def counters() -> dict[str, float]:
    out = {}
    if torch.cuda.is_available():
        s = torch.cuda.memory_stats()
        out = {k: float(s.get(k, 0)) for k in KEYS}
        h = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
        out["host_allocs"] = float(h.get("num_host_alloc", 0))
    return out


sched = schedule(wait=a.first - 1, warmup=1, active=a.last - a.first + 1, repeat=1)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched) as prof:
    def hook(n: int) -> None:
        mem.append({"booked": n, **counters()})
        prof.step()
    summary = train(cfg, step_hook=hook)

STALLS = ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cudaDeviceSynchronize",
          "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cuMemAlloc", "cuMemFree",
          "cudaStreamWaitEvent", "cudaLaunchKernel", "cuLaunchKernel", "cudaMemsetAsync")
events = prof.events()
# (torch names the windows "ProfilerStep*"; the first active one opens when step `first` is booked)
windows = sorted((e for e in events if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start)
rows = []
for i, w in enumerate(windows):
    lo, hi = w.time_range.start, w.time_range.end
    inside = [e for e in events if lo <= e.time_range.start < hi and not e.name.startswith("ProfilerStep")]
    kern = [e for e in inside if e.device_type == torch.autograd.DeviceType.CUDA]
    cpu = [e for e in inside if e.device_type == torch.autograd.DeviceType.CPU]
    stall = collections.Counter()
    count = collections.Counter()
    for e in cpu:
        for s in STALLS:
            if e.name.startswith(s):
                stall[s] += e.cpu_time_total
                count[s] += 1
    selfcpu = collections.Counter()
    for e in cpu:
        selfcpu[e.name] += e.self_cpu_time_total
    kt = collections.Counter()
    for e in kern:
        kt[e.name[:60]] += e.time_range.end - e.time_range.start
    rows.append({"window": f"booked {a.first + i}..{a.first + i + 1}", "wall_ms": (hi - lo) / 1e3,
                 "kernel_ms": sum(kt.values()) / 1e3, "kernels": len(kern),
                 "stall_ms": {k: round(v / 1e3, 2) for k, v in stall.most_common()},
                 "stall_n": dict(count),
                 "top_self_cpu_ms": [(k[:60], round(v / 1e3, 2)) for k, v in selfcpu.most_common(8)],
                 "top_kernels": kt})
# Kernels whose time differs most from the median window: what the slow window spends more on.
med_k = {}
names = set().union(*(r["top_kernels"].keys() for r in rows)) if rows else set()
for n in names:
    med_k[n] = statistics.median(r["top_kernels"].get(n, 0) for r in rows)
for r in rows:
    diff = {n: r["top_kernels"].get(n, 0) - med_k[n] for n in names}
    r["kernel_excess_ms"] = [(n, round(d / 1e3, 2)) for n, d in sorted(diff.items(), key=lambda x: -x[1])[:5]]
    del r["top_kernels"]
if a.json:
    with open(a.json, "w") as f:
        json.dump({"windows": rows, "mem": mem, "slow_steps": summary.get("slow_steps")}, f, indent=1)
print("slow_steps", summary.get("slow_steps"))
print("mem per booked step (deltas):")
for prev, cur in zip(mem, mem[1:]):
    d = {k: cur[k] - prev[k] for k in cur if k != "booked" and cur[k] != prev[k]}
    print(" ", cur["booked"], d)
for r in rows:
    print(f"{r['window']}: wall {r['wall_ms']:.1f} ms, kernels {r['kernel_ms']:.1f} ms ({r['kernels']})")
    print("   stalls", r["stall_ms"], r["stall_n"])
    print("   self cpu", r["top_self_cpu_ms"])
    print("   kernel excess", r["kernel_excess_ms"])
