"""How long does a checkpoint block training? Async (staging only) vs synchronous save.

Builds a model + AdamW state of `--size-gb` (params + two moments, fp32) on the GPU when
there is one (2 GB default) or on the CPU (0.25 GB default, a toy run), then:

- sync: `Checkpointer(async_save=False).save()` wall time (= what a blocking save costs);
- async: a training loop that saves every few steps; the stall is the time save() blocks
  (host staging; the first save also allocates the pinned buffers and is reported apart);
  the loop keeps stepping while the write runs, so step-time interference is measured too;
- write_GBps: bytes on disk / background write time (dcp.save + fsync + crc32 + commit);
- correctness: the last async checkpoint is loaded into the trained-on model and must equal
  a snapshot taken at save time.

    python3 -m gem_checkpoint.bench.stall [--size-gb 2] [--saves 3] [--dir /path] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time

import torch

from gem_checkpoint import Checkpointer, RNGState


def build(size_gb: float, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    d = 4096 if device.type == "cuda" else 2048
    n_params = int(size_gb * 1e9 / 12)  # fp32 param + exp_avg + exp_avg_sq
    layers = max(1, math.ceil(n_params / (d * d)))
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)]).to(device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step(model, optim, device)
    nbytes = sum(p.numel() * p.element_size() * 3 for p in model.parameters())
    return model, optim, nbytes


def step(model: torch.nn.Module, optim: torch.optim.Optimizer, device: torch.device) -> None:
    first = next(iter(model.parameters()))
    x = torch.randn(64 if device.type == "cuda" else 8, first.shape[1], device=device)
    model(x).square().mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=None, help="model+optimizer state (default 2 on GPU, 0.25 on CPU)")
    ap.add_argument("--saves", type=int, default=None, help="async saves (default 3, quick 2)")
    ap.add_argument("--dir", default=None, help="checkpoint directory (default: a fresh temp dir, removed after)")
    ap.add_argument("--quick", action="store_true", help="smaller state, fewer saves")
    ap.add_argument("--writer", choices=["thread", "process"], default="thread",
                    help="the async saves' writer (process: a child with its own GIL)")
    args = ap.parse_args()
    size_gb = args.size_gb if args.size_gb is not None else ((0.5 if args.quick else 2.0) if cuda else (0.1 if args.quick else 0.25))
    saves = args.saves if args.saves is not None else (2 if args.quick else 3)
    device = torch.device("cuda" if cuda else "cpu")
    root = args.dir or tempfile.mkdtemp(prefix="gem_ckpt_bench_")
    owns_root = args.dir is None

    model, optim, nbytes = build(size_gb, device)
    state = {"model": model, "optim": optim, "rng": RNGState(), "step": 0}
    for _ in range(2):  # warm up
        step(model, optim, device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(5):
        step(model, optim, device)
    sync(device)
    step_base = (time.perf_counter() - t0) / 5

    # Synchronous saves: the cost async saving hides.
    ckpt_sync = Checkpointer(os.path.join(root, "sync"), keep_last=1, async_save=False)
    sync_times, sync_write = [], []
    for i in range(max(1, saves - 1)):
        sync(device)
        t0 = time.perf_counter()
        ckpt_sync.save(i, state)
        sync_times.append(time.perf_counter() - t0)
        sync_write.append(ckpt_sync.last_write_s)
    disk_bytes = ckpt_sync.last_bytes
    shutil.rmtree(os.path.join(root, "sync"), ignore_errors=True)

    # Async saves inside a training loop.
    ckpt = Checkpointer(os.path.join(root, "async"), keep_last=2, async_save=True, writer=args.writer)
    stalls, writes, steps_during = [], [], []
    snapshot: dict[str, torch.Tensor] = {}
    for i in range(saves):
        for _ in range(2):
            step(model, optim, device)
        sync(device)
        if i == saves - 1:
            snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        t0 = time.perf_counter()
        ckpt.save(100 + i, state)
        stalls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = 0
        while ckpt.pending is not None:  # training continues while the write runs
            step(model, optim, device)
            n += 1
        sync(device)
        ckpt.wait()
        writes.append(ckpt.last_write_s)
        if n:
            steps_during.append((time.perf_counter() - t0) / n)
    loaded = ckpt.load(state)
    ckpt.close()
    verified = loaded == 100 + saves - 1 and all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())
    if owns_root:
        shutil.rmtree(root, ignore_errors=True)

    steady = stalls[1:] or stalls
    stall_s = statistics.median(steady)
    sync_save_s = statistics.median(sync_times)
    write_s = statistics.median(writes)
    res = {
        "bench": "checkpoint_stall",
        "writer": args.writer,
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "cpu_run": not cuda,
        "torch": torch.__version__,
        "state_GB": round(nbytes / 1e9, 3),
        "disk_GB": round(disk_bytes / 1e9, 3),
        "saves": saves,
        "stall_s": round(stall_s, 4),
        "first_stall_s": round(stalls[0], 4),
        "sync_save_s": round(sync_save_s, 4),
        "stall_ratio": round(stall_s / sync_save_s, 4),
        "write_s": round(write_s, 3),
        "write_GBps": round(disk_bytes / 1e9 / write_s, 3),
        "sync_GBps": round(disk_bytes / 1e9 / statistics.median(sync_write), 3),
        "step_ms": round(step_base * 1e3, 2),
        "step_ms_during_write": round(statistics.median(steps_during) * 1e3, 2) if steps_during else None,
        "verified": verified,
    }
    print(f"{'what':<34}{'value':>12}")
    for label, key in [("state (params+AdamW, GB)", "state_GB"), ("on disk (GB)", "disk_GB"),
                       ("sync save (s)", "sync_save_s"), ("async stall, steady (s)", "stall_s"),
                       ("async stall, first save (s)", "first_stall_s"), ("stall ratio", "stall_ratio"),
                       ("background write (s)", "write_s"), ("write bandwidth (GB/s)", "write_GBps"),
                       ("train step (ms)", "step_ms"), ("train step during write (ms)", "step_ms_during_write"),
                       ("loaded == snapshot", "verified")]:
        print(f"{label:<34}{str(res[key]):>12}")
    if not cuda:
        print("NOTE: CPU run (no CUDA): toy size, staging is a host memcpy, figures are not H200 figures.")
    print(json.dumps(res))
    if not verified:
        raise SystemExit("checkpoint loaded back does not match the snapshot")


if __name__ == "__main__":
    main()
