"""Copy-engine collectives against NCCL on several GPUs of one host: results, bandwidth, and
what each costs a matmul running beside it.

    torchrun --nproc-per-node 2 -m gem_comms.bench.multi_gpu [--quick]

One GPU per rank. Rows:
  1. all-gather at FSDP sizes (bf16, MiB per rank): copy_engine result == NCCL's, bus
     bandwidth of each (busbw = (world-1)/world x output bytes / time, nccl-tests' rule);
  2. all-to-all with uneven splits (the embedding exchange): result == NCCL's, bandwidth;
  3. reduce-scatter through copy_engine (copies + one SM sum) close to NCCL's;
  4. lanes sweep at the largest size (side streams a transfer is split over);
  5. host time per call, 4 KiB, steady state (no store round trip is left in it);
  6. an 8192^3 bf16 matmul stream alone and beside back-to-back all-gathers of each backend.
Prints a table, a final JSON line, and writes $OUT/multi_gpu.json when OUT is set. Exits 1 if
any copy_engine result differs from NCCL's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import gem_comms as gc
from gem_comms import _peer

# FSDP all-gather sizes of the GEM `h200` preset (d_model 1024, ffn_mult 4, 4 layers; comms is
# a leaf, so they are written here): one block ~ 12 d^2 (attention 4 d^2 + FFN 8 d^2) plus the
# interaction / cross arch ~ 4 M parameters ~ 16.8 M bf16 parameters ~ 32 MiB gathered, i.e.
# ~16 MiB per rank on 2 GPUs; the root unit (heads, dense embeddings) a few MiB. 64 and 256 MiB
# per rank are the bandwidth target sizes (>= 64 MiB per rank).
SIZES_MIB = (1, 4, 16, 64, 256)


def _timeit(fn: Callable[[], object], iters: int, reps: int = 3) -> float:
    """Median seconds per call over `reps` windows of `iters` back-to-back calls (CUDA events)."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.current_stream().synchronize()  # not the device: see `_BROKEN`
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return float(statistics.median(times))


def _all_ranks(ok: bool) -> bool:
    t = torch.tensor([1 if ok else 0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


_BROKEN: list[str] = []  # first copy_engine error: later copy_engine rows are skipped, since a
# GPU stream stuck on a flag would hang any device-wide synchronize


def _safe(fn: Callable[[], Any]) -> tuple[Any, str]:
    if _BROKEN:
        return None, "skipped after: " + _BROKEN[0]
    try:
        return fn(), ""
    except Exception as e:  # reported, the NCCL rows still run
        _BROKEN.append(f"{type(e).__name__}: {e}"[:300])
        return None, _BROKEN[0]


def bench_all_gather(rank: int, world: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)
    for mib in SIZES_MIB[:-1] if quick else SIZES_MIB:
        n = (mib << 20) // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = torch.empty(world * n, device="cuda", dtype=torch.bfloat16)
        out = torch.full_like(ref, -1)
        dist.all_gather_into_tensor(ref, x)
        _, err = _safe(lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=60))
        equal = _all_ranks(not err and torch.equal(out, ref))
        iters = max(3, min(50, (2048 // mib)))
        t_nccl = _timeit(lambda: dist.all_gather_into_tensor(ref, x), iters)
        t_ce = _timeit(lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine"), iters) if not err else math.nan
        bus = (world - 1) / world * world * n * 2 / 1e9
        rows.append({"op": "all_gather", "mib_per_rank": mib, "equal_to_nccl": equal, "error": err,
                     "ce_busbw_gbs": bus / t_ce, "nccl_busbw_gbs": bus / t_nccl,
                     "ce_ms": t_ce * 1e3, "nccl_ms": t_nccl * 1e3})
    return rows


def bench_all_to_all(rank: int, world: int, quick: bool) -> dict[str, Any]:
    # uneven splits: rank p sends (1 + (p + 2q) % 3) x base rows of 128 bf16 (an embedding row)
    base = (8 if quick else 32) * 1024
    m = [[base * (1 + (p + 2 * q) % 3) for q in range(world)] for p in range(world)]
    ins, outs = m[rank], [m[q][rank] for q in range(world)]
    gen = torch.Generator(device="cuda").manual_seed(7 + rank)
    x = torch.randn(sum(ins), 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = torch.empty(sum(outs), 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(ref, -1)
    dist.all_to_all_single(ref, x, outs, ins)
    _, err = _safe(lambda: gc.all_to_all_single(out, x, outs, ins, backend="copy_engine", timeout=60))
    equal = _all_ranks(not err and torch.equal(out, ref))
    t_nccl = _timeit(lambda: dist.all_to_all_single(ref, x, outs, ins), 20)
    t_ce = _timeit(lambda: gc.all_to_all_single(out, x, outs, ins, backend="copy_engine"), 20) if not err else math.nan
    moved = (sum(ins) - ins[rank]) * 128 * 2 / 1e9  # bytes this rank sends to others
    return {"op": "all_to_all_uneven", "mib_sent": sum(ins) * 256 / 2**20, "equal_to_nccl": equal,
            "error": err, "ce_gbs": moved / t_ce, "nccl_gbs": moved / t_nccl,
            "ce_ms": t_ce * 1e3, "nccl_ms": t_nccl * 1e3}


def bench_reduce_scatter(rank: int, world: int) -> dict[str, Any]:
    n = 4 << 20
    gen = torch.Generator(device="cuda").manual_seed(11 + rank)
    x = torch.randn(world * n, device="cuda", generator=gen)
    ref, out = torch.empty(n, device="cuda"), torch.full((n,), -1.0, device="cuda")
    dist.reduce_scatter_tensor(ref, x)
    _, err = _safe(lambda: gc.reduce_scatter_tensor(out, x, backend="copy_engine", timeout=60))
    close = _all_ranks(not err and torch.allclose(out, ref, rtol=1e-5, atol=1e-5))
    return {"op": "reduce_scatter_f32_16MiB", "close_to_nccl": close, "error": err}


def bench_lanes(rank: int, world: int, quick: bool) -> list[dict[str, Any]]:
    mib = 64 if quick else 256
    n = (mib << 20) // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(world * n, device="cuda", dtype=torch.bfloat16)
    rows = []
    for lanes in (1, 2, 4, 8):
        gc.release_buffers()
        _peer.configure(lanes=lanes)
        t, err = _safe(lambda: _timeit(lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine"), 10))
        bus = (world - 1) * n * 2 / 1e9
        rows.append({"lanes": lanes, "mib_per_rank": mib, "ce_busbw_gbs": bus / t if t else math.nan, "error": err})
    gc.release_buffers()
    _peer.configure(lanes=_peer.Config().lanes)
    return rows


def bench_host_cost(rank: int, world: int) -> dict[str, Any]:
    x = torch.ones(1024, device="cuda")
    out = torch.empty(world * 1024, device="cuda")
    res: dict[str, Any] = {"op": "host_us_per_call_4KiB"}
    for name, fn in (("ce", lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine")),
                     ("nccl", lambda: dist.all_gather_into_tensor(out, x))):
        _, err = _safe(fn)
        if err:
            res[name] = math.nan
            continue
        torch.cuda.current_stream().synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        res[name] = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.current_stream().synchronize()
    return res


def bench_interference(rank: int, world: int, quick: bool) -> list[dict[str, Any]]:
    """Matmul TFLOP/s alone and while back-to-back all-gathers (256 MiB per rank) run beside."""
    size, mm_iters = 8192, 30 if quick else 60
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    n = (256 << 20) // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(world * n, device="cuda", dtype=torch.bfloat16)
    mm_s, comm_s = torch.cuda.Stream(), torch.cuda.Stream()  # type: ignore[no-untyped-call]
    flops = 2 * size**3 * mm_iters

    def window(comm: Callable[[], object] | None, count: int) -> tuple[float, float, bool]:
        torch.cuda.current_stream().synchronize()
        dist.barrier()
        e0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        e_mm, e_comm = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        e0.record()
        mm_s.wait_event(e0)
        comm_s.wait_event(e0)
        if comm is not None:
            with torch.cuda.stream(comm_s):
                for _ in range(count):
                    comm()
                e_comm.record()
        with torch.cuda.stream(mm_s):
            for _ in range(mm_iters):
                torch.mm(a, b, out=c)
            e_mm.record()
        mm_s.synchronize()
        comm_s.synchronize()
        t_mm = e0.elapsed_time(e_mm) / 1e3
        t_comm = e0.elapsed_time(e_comm) / 1e3 if comm is not None else 0.0
        return t_mm, t_comm, comm is None or t_comm >= t_mm

    alone = statistics.median(window(None, 0)[0] for _ in range(3))
    rows = [{"scenario": "matmul alone", "tflops": flops / alone / 1e12, "slowdown_pct": 0.0}]
    for name, fn in (("beside copy_engine all-gather", lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine")),
                     ("beside NCCL all-gather", lambda: dist.all_gather_into_tensor(out, x))):
        _, err = _safe(fn)
        if err:
            rows.append({"scenario": name, "error": err})
            continue
        t_one = _timeit(fn, 5, reps=1)
        count = max(2, math.ceil(1.3 * alone / t_one))
        runs = [window(fn, count) for _ in range(3)]
        t_mm = statistics.median(r[0] for r in runs)
        rows.append({"scenario": name, "tflops": flops / t_mm / 1e12,
                     "slowdown_pct": 100 * (t_mm / alone - 1), "covered": all(r[2] for r in runs),
                     "comm_busbw_during_gbs": (world - 1) * n * 2 * count / 1e9 / statistics.median(r[1] for r in runs)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer matmuls")
    args = ap.parse_args(argv)
    if "LOCAL_RANK" not in os.environ or not torch.cuda.is_available():
        print("multi_gpu: run under torchrun with one CUDA GPU per rank, e.g. "
              "`torchrun --nproc-per-node 2 -m gem_comms.bench.multi_gpu`; nothing to do here")
        return 0
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.monotonic()
    probe = torch.empty(1, device="cuda")
    res: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "auto_picks": gc.resolve_backend(probe),  # type: ignore[no-untyped-call]
        "lanes_default": _peer.Config().lanes,
    }
    res["all_gather"] = bench_all_gather(rank, world, args.quick)
    res["all_to_all"] = bench_all_to_all(rank, world, args.quick)
    res["reduce_scatter"] = bench_reduce_scatter(rank, world)
    res["lanes"] = bench_lanes(rank, world, args.quick)
    res["host"] = bench_host_cost(rank, world)
    res["interference"] = bench_interference(rank, world, args.quick)
    ok = all(r["equal_to_nccl"] for r in res["all_gather"]) and res["all_to_all"]["equal_to_nccl"] \
        and res["reduce_scatter"]["close_to_nccl"]
    res["ok"] = ok
    res["seconds"] = time.monotonic() - t0
    if rank == 0:
        _report(res)
    if _BROKEN:  # leave without touching the (possibly stuck) copy-engine streams
        sys.stdout.flush()
        os._exit(1)
    gc.release_buffers()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def _report(res: dict[str, Any]) -> None:
    print(f"# {res['gpu']} x{res['world']}, torch {res['torch']}, NCCL {res['nccl']}, auto -> {res['auto_picks']}")
    print("| collective | size | equal | copy_engine GB/s | NCCL GB/s | ratio |")
    print("|---|---|---|---|---|---|")
    for r in res["all_gather"]:
        print(f"| all_gather (busbw) | {r['mib_per_rank']} MiB/rank | {r['equal_to_nccl']} | "
              f"{r['ce_busbw_gbs']:.1f} | {r['nccl_busbw_gbs']:.1f} | {r['ce_busbw_gbs'] / r['nccl_busbw_gbs']:.2f} |"
              + (f" {r['error']}" if r["error"] else ""))
    a = res["all_to_all"]
    print(f"| all_to_all uneven (sent) | {a['mib_sent']:.0f} MiB | {a['equal_to_nccl']} | {a['ce_gbs']:.1f} | "
          f"{a['nccl_gbs']:.1f} | {a['ce_gbs'] / a['nccl_gbs']:.2f} |" + (f" {a['error']}" if a["error"] else ""))
    print(f"reduce_scatter copy_engine close to NCCL: {res['reduce_scatter']['close_to_nccl']} {res['reduce_scatter']['error']}")
    print("lanes sweep: " + ", ".join(f"{r['lanes']}: {r['ce_busbw_gbs']:.1f} GB/s" for r in res["lanes"]))
    print(f"host us/call (4 KiB): copy_engine {res['host']['ce']:.1f}, NCCL {res['host']['nccl']:.1f}")
    print("| matmul 8192^3 bf16 | TFLOP/s | slowdown | covered | comm busbw during |")
    print("|---|---|---|---|---|")
    for r in res["interference"]:
        if "error" in r:
            print(f"| {r['scenario']} | error: {r['error']} |")
            continue
        print(f"| {r['scenario']} | {r['tflops']:.1f} | {r['slowdown_pct']:.1f} % | {r.get('covered', '-')} | "
              f"{r.get('comm_busbw_during_gbs', float('nan')):.1f} |")
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "multi_gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
    big = [r for r in res["all_gather"] if r["mib_per_rank"] >= 64]
    mm = {r["scenario"]: r.get("slowdown_pct") for r in res["interference"]}
    print(json.dumps({"bench": "comms_multi_gpu", "ok": res["ok"], "world": res["world"],
                      "ag_ce_over_nccl_ge64MiB": min((r["ce_busbw_gbs"] / r["nccl_busbw_gbs"] for r in big), default=None),
                      "mm_slowdown_ce_pct": mm.get("beside copy_engine all-gather"),
                      "mm_slowdown_nccl_pct": mm.get("beside NCCL all-gather"),
                      "seconds": round(res["seconds"], 1)}))


if __name__ == "__main__":
    sys.exit(main())
