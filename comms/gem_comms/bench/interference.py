"""Does moving bytes slow a concurrent matmul? Copy engines vs SM kernels, on one GPU.

Why: the claim of the copy-engine collectives is that compute running beside them loses
(almost) nothing, while NCCL-style SM kernels take SMs from it. One GPU cannot run the
peer-to-peer path, but it can isolate the mechanism: a bf16 matmul loop runs on its own
stream, timed with CUDA events on that stream, alone and while another stream moves bytes
continuously for the whole timed window by

  (a) copy engines: host<->device DMA of pinned memory (cudaMemcpyAsync H2D + D2H);
  (b) SM kernels moving the same bytes: an elementwise copy kernel reading / writing mapped
      (zero-copy) pinned host memory through UVA (falls back to a device copy kernel, and
      says so, if mapped host memory cannot be aliased);
  (c) same-device D2D cudaMemcpyAsync (reference: measured earlier to cost ~12 %, like a
      copy kernel, because on one device it competes for HBM bandwidth, not for SMs);
  (d) same-device D2D copy *kernel* (reference for (c));
  (e) gem_comms.all_gather_into_tensor(backend="copy_engine") in a world of one (a D2D
      cudaMemcpyAsync on the gem_comms side stream, so it behaves like (c)).

A start gate (a sleep kernel) holds every stream until all work is queued, so the transfer
covers the matmul window; each row checks that coverage and the transferred data.

    python3 -m gem_comms.bench.interference [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import gem_comms as gc


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    n: int = 8192  # matmul is [n, n] @ [n, n], bf16
    mm_iters: int = 100  # matmuls per timed window
    reps: int = 9  # windows per scenario (median reported)
    chunk_mib: int = 256  # bytes per transfer op
    gate_cycles: int = 400_000_000  # start gate (~0.2 s at ~2 GHz): all work is queued before it opens


QUICK = BenchConfig(mm_iters=40, reps=5, chunk_mib=128, gate_cycles=200_000_000)


@dataclass
class Transfer:
    """Continuous byte mover: `ops[i]()` enqueues one op on `streams[i]` (current stream)."""

    name: str
    engine: str  # "copy engine" | "SM kernel"
    streams: list[torch.cuda.Stream]
    ops: list[Callable[[], object]]
    bytes_per_op: int  # per stream
    check: Callable[[], bool]
    note: str = ""
    count: int = 0  # ops per stream per window, set by calibration
    alone_gbs: float = 0.0
    during_gbs: list[float] = field(default_factory=list)
    covered: list[bool] = field(default_factory=list)


class _CudaArrayView:
    """Exposes pinned host memory as a CUDA array (UVA: the host pointer is device-valid)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<i4",
            "data": (t.data_ptr(), False),
            "version": 2,
            "strides": None,
        }


def _mapped_alias(host: torch.Tensor, dev: torch.device) -> torch.Tensor | None:
    """A CUDA tensor aliasing pinned `host` (int32), or None if that is not possible here."""
    try:
        alias = torch.as_tensor(_CudaArrayView(host), device=dev)
    except Exception as e:  # noqa: BLE001 - any failure means: use the fallback
        print(f"  mapped host alias unavailable: {type(e).__name__}: {e}")
        return None
    if alias.device != dev or alias.data_ptr() != host.data_ptr():
        print(f"  mapped host alias unavailable: got a copy on {alias.device}")
        return None
    probe = torch.empty(16, dtype=torch.int32, device=dev)
    torch.add(alias[:16], 0, out=probe)
    return alias if torch.equal(probe.cpu(), host[:16]) else None


def _elapsed(a: torch.cuda.Event, b: torch.cuda.Event) -> float:
    return float(a.elapsed_time(b))


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def _stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()  # type: ignore[no-untyped-call]


def build_transfers(cfg: BenchConfig, dev: torch.device) -> list[Transfer]:
    nbytes = cfg.chunk_mib << 20
    n32 = nbytes // 4
    g = torch.Generator().manual_seed(0)
    host_a = torch.randint(-(2**31), 2**31 - 1, (n32,), dtype=torch.int32, generator=g).pin_memory()
    host_b = torch.zeros(n32, dtype=torch.int32).pin_memory()
    dev_a = torch.empty(n32, dtype=torch.int32, device=dev)
    dev_b = torch.randint(-(2**31), 2**31 - 1, (n32,), dtype=torch.int32, device=dev)
    s_h2d, s_d2h = _stream(), _stream()

    def check_host_dev() -> bool:
        torch.cuda.synchronize()
        return torch.equal(dev_a.cpu(), host_a) and torch.equal(host_b, dev_b.cpu())

    ce = Transfer(
        name="(a) H2D+D2H DMA, pinned",
        engine="copy engine",
        streams=[s_h2d, s_d2h],
        ops=[lambda: dev_a.copy_(host_a, non_blocking=True), lambda: host_b.copy_(dev_b, non_blocking=True)],
        bytes_per_op=nbytes,
        check=check_host_dev,
    )
    # (b) has its own destinations, so its check cannot pass on (a)'s results.
    dev_a2 = torch.zeros_like(dev_a)
    host_b2 = torch.zeros(n32, dtype=torch.int32).pin_memory()
    alias_a = _mapped_alias(host_a, dev)
    alias_b = _mapped_alias(host_b2, dev) if alias_a is not None else None
    if alias_a is not None and alias_b is not None:
        src_a, dst_b, note = alias_a, alias_b, "kernel reads/writes mapped pinned host memory (UVA)"

        def sm_check() -> bool:
            torch.cuda.synchronize()
            return torch.equal(dev_a2.cpu(), host_a) and torch.equal(host_b2, dev_b.cpu())

    else:
        # Fallback: an SM copy kernel between device buffers (not the same bytes path!).
        src_a = dev_b.clone()
        dst_b = torch.zeros_like(dev_b)
        note = "FALLBACK: mapped host memory unavailable, D2D copy kernel instead"

        def sm_check() -> bool:
            torch.cuda.synchronize()
            return torch.equal(dev_a2, src_a) and torch.equal(dst_b, dev_b)

    sm = Transfer(
        name="(b) H2D+D2H copy kernel, mapped",
        engine="SM kernel",
        streams=[_stream(), _stream()],
        ops=[lambda: torch.add(src_a, 0, out=dev_a2), lambda: torch.add(dev_b, 0, out=dst_b)],
        bytes_per_op=nbytes,
        check=sm_check,
        note=note,
    )
    big = 4 * n32
    d_src = torch.randint(-(2**31), 2**31 - 1, (big,), dtype=torch.int32, device=dev)
    d_dst = torch.zeros_like(d_src)
    k_dst = torch.zeros_like(d_src)
    ag_out = torch.zeros_like(d_src)

    def check_d2d() -> bool:
        torch.cuda.synchronize()
        return torch.equal(d_dst, d_src)

    def check_kernel() -> bool:
        torch.cuda.synchronize()
        return torch.equal(k_dst, d_src)

    def check_ag() -> bool:
        torch.cuda.synchronize()
        return torch.equal(ag_out, d_src)

    def ag() -> None:
        gc.all_gather_into_tensor(ag_out, d_src, backend="copy_engine")

    return [
        ce,
        sm,
        Transfer(
            name="(c) D2D cudaMemcpyAsync, same GPU",
            engine="copy engine",
            streams=[_stream()],
            ops=[lambda: d_dst.copy_(d_src, non_blocking=True)],
            bytes_per_op=4 * big,
            check=check_d2d,
            note="reference: competes for HBM bandwidth",
        ),
        Transfer(
            name="(d) D2D copy kernel, same GPU",
            engine="SM kernel",
            streams=[_stream()],
            ops=[lambda: torch.add(d_src, 0, out=k_dst)],
            bytes_per_op=4 * big,
            check=check_kernel,
            note="reference for (c)",
        ),
        Transfer(
            name="(e) gem_comms all_gather, world 1",
            engine="copy engine",
            streams=[_stream()],
            ops=[ag],
            bytes_per_op=4 * big,
            check=check_ag,
            note="copy_engine backend, D2D on its side stream",
        ),
    ]


def calibrate(t: Transfer, window_ms: float) -> None:
    """Times ops alone (all of t's streams at once, as in a window) and picks how many per
    stream cover 1.5x the matmul window."""
    for s, op in zip(t.streams, t.ops):
        with torch.cuda.stream(s):
            op()
    torch.cuda.synchronize()
    k = 4
    marks = []
    for s, op in zip(t.streams, t.ops):
        e0, e1 = _event(), _event()
        with torch.cuda.stream(s):
            e0.record(s)
            for _ in range(k):
                op()
            e1.record(s)
        marks.append((e0, e1))
    torch.cuda.synchronize()
    ms = [_elapsed(e0, e1) / k for e0, e1 in marks]
    t.alone_gbs = sum(t.bytes_per_op / (m * 1e-3) / 1e9 for m in ms)
    t.count = min(5000, math.ceil(1.5 * window_ms / max(ms)) + 2)


def window(cfg: BenchConfig, mm: Callable[[], None], mm_stream: torch.cuda.Stream, t: Transfer | None) -> tuple[float, bool]:
    """One timed matmul window, with `t` moving bytes during all of it. Returns (ms, gate_ok)."""
    gate_stream = _stream()
    gate = torch.cuda.Event()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(gate_stream):
        torch.cuda._sleep(cfg.gate_cycles)  # type: ignore[no-untyped-call]
        gate.record(gate_stream)
    marks: list[tuple[torch.cuda.Event, list[torch.cuda.Event]]] = []  # (start, end of each op)
    if t is not None:
        for s, op in zip(t.streams, t.ops):
            s.wait_event(gate)
            start, ends = _event(), [_event() for _ in range(t.count)]
            with torch.cuda.stream(s):
                start.record(s)
                for e in ends:
                    op()
                    e.record(s)
            marks.append((start, ends))
    mm_stream.wait_event(gate)
    m0, m1 = _event(), _event()
    with torch.cuda.stream(mm_stream):
        m0.record(mm_stream)
        for _ in range(cfg.mm_iters):
            mm()
        m1.record(mm_stream)
    gate_ok = not gate.query()  # type: ignore[no-untyped-call]  # all work queued before the gate opened
    torch.cuda.synchronize()
    mm_ms = _elapsed(m0, m1)
    if t is not None:
        slack = 0.01 * mm_ms  # streams leave the gate within microseconds of each other
        covered = all(_elapsed(a, m0) >= -slack and _elapsed(m1, ends[-1]) >= 0 for a, ends in marks)
        t.covered.append(covered)
        # Rate inside the matmul window only: ops that *ended* inside it, per stream, summed.
        rate = 0.0
        for _, ends in marks:
            at = [_elapsed(m0, e) for e in ends]
            inside = [x for x in at if 0.0 <= x <= mm_ms]
            if len(inside) >= 2 and inside[-1] > inside[0]:
                rate += (len(inside) - 1) * t.bytes_per_op / ((inside[-1] - inside[0]) * 1e-3) / 1e9
        t.during_gbs.append(rate)
    return mm_ms, gate_ok


def _small_call_us(dev: torch.device, calls: int = 300) -> dict[str, float]:
    """Host cost per call of a tiny world-of-one all-gather vs a plain copy (launch overhead)."""
    x = torch.randn(1024, device=dev)
    out = torch.empty_like(x)
    res = {}
    for name, fn in (
        ("torch_copy", lambda: out.copy_(x)),
        ("gem_comms_copy_engine", lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine")),
    ):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        res[name] = round((time.perf_counter() - t0) / calls * 1e6, 2)
        if not torch.equal(out, x):
            raise RuntimeError(f"{name}: world-of-one all_gather result differs from its input")
    return res


def run_gpu(cfg: BenchConfig, quick: bool) -> dict[str, object]:
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(cfg.n, cfg.n, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(cfg.n, cfg.n, device=dev, dtype=torch.bfloat16, generator=g)
    c = torch.empty(cfg.n, cfg.n, device=dev, dtype=torch.bfloat16)
    mm_stream = _stream()

    def mm() -> None:
        torch.mm(a, b, out=c)

    flops = 2.0 * cfg.n**3 * cfg.mm_iters
    with torch.cuda.stream(mm_stream):
        for _ in range(5):
            mm()
    torch.cuda.synchronize()
    ref = a[:64].float() @ b.float()
    mm_ok = bool(torch.allclose(c[:64].float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())))
    window_ms, _ = window(cfg, mm, mm_stream, None)
    print(f"matmul window ~{window_ms:.1f} ms; allocating transfer buffers ...", flush=True)
    transfers = build_transfers(cfg, dev)
    for t in transfers:
        calibrate(t, window_ms)
        print(f"  {t.name}: {t.alone_gbs:.1f} GB/s alone, {t.count} ops/stream/window", flush=True)
    small_us = _small_call_us(dev)
    alone: list[float] = []
    gates: list[bool] = []
    under: dict[str, list[float]] = {t.name: [] for t in transfers}
    for _ in range(cfg.reps):  # interleaved, so clock/thermal drift hits all rows alike
        ms, ok = window(cfg, mm, mm_stream, None)
        alone.append(ms)
        gates.append(ok)
        for t in transfers:
            for _attempt in range(4):  # the matmul can slow the mover: lengthen it until it covers
                ms, ok = window(cfg, mm, mm_stream, t)
                if t.covered[-1] or t.count >= 5000:
                    break
                t.covered.pop()
                t.during_gbs.pop()
                t.count = min(5000, 2 * t.count)
            under[t.name].append(ms)
            gates.append(ok)
    tf_alone = flops / (statistics.median(alone) * 1e-3) / 1e12
    rows = []
    for t in transfers:
        tf = flops / (statistics.median(under[t.name]) * 1e-3) / 1e12
        rows.append(
            {
                "scenario": t.name,
                "engine": t.engine,
                "matmul_tflops": round(tf, 1),
                "slowdown_pct": round(100.0 * (tf_alone - tf) / tf_alone, 2),
                "transfer_gbs_during": round(statistics.median(t.during_gbs), 1),
                "transfer_gbs_alone": round(t.alone_gbs, 1),
                "covered_window": all(t.covered),
                "data_ok": bool(t.check()),
                "note": t.note,
            }
        )
    print(f"\nGPU {torch.cuda.get_device_name(dev)}; bf16 matmul {cfg.n}^3 x {cfg.mm_iters} per window; "
          f"{cfg.reps} windows per row (median); transfer ops of {cfg.chunk_mib} MiB (x4 for D2D)")
    hdr = f"{'scenario':36} {'moved by':12} {'matmul TF/s':>11} {'slowdown':>9} {'GB/s during':>11} {'GB/s alone':>10} {'covered':>7} {'data':>5}"
    print(hdr)
    print("-" * len(hdr))
    print(f"{'matmul alone':36} {'-':12} {tf_alone:11.1f} {'-':>9} {'-':>11} {'-':>10} {'-':>7} {str(mm_ok):>5}")
    for r in rows:
        print(
            f"{r['scenario']:36} {r['engine']:12} {r['matmul_tflops']:11.1f} {r['slowdown_pct']:8.2f}% "
            f"{r['transfer_gbs_during']:11.1f} {r['transfer_gbs_alone']:10.1f} {str(r['covered_window']):>7} {str(r['data_ok']):>5}"
        )
    for r in rows:
        if r["note"]:
            print(f"  {r['scenario']}: {r['note']}")
    print(
        f"4 KiB world-of-one all_gather: gem_comms copy_engine {small_us['gem_comms_copy_engine']:.1f} us/call, "
        f"torch copy_ {small_us['torch_copy']:.1f} us/call (host time, sync at end)"
    )
    print("GB/s: bytes copied per second (inside the matmul window for 'during'), summed over both directions for (a)/(b).")
    ce = rows[0]["slowdown_pct"]
    all_ok = mm_ok and all(r["data_ok"] and r["covered_window"] for r in rows)
    if not all(gates):
        print("WARNING: the start gate opened before all work was queued in some windows")
    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "absent"
    return {
        "bench": "comms.interference",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "triton": triton_version,
        "quick": quick,
        "n": cfg.n,
        "matmul_tflops_alone": round(tf_alone, 1),
        "rows": rows,
        "copy_engine_slowdown_pct": ce,
        "sm_path_slowdown_pct": rows[1]["slowdown_pct"],
        "target_copy_engine_le_3pct": bool(isinstance(ce, float) and ce <= 3.0),
        "sm_path_mapped_host": not str(rows[1]["note"]).startswith("FALLBACK"),
        "gate_ok": all(gates),
        "small_all_gather_world1_us": small_us,
        "all_checks_ok": bool(all_ok),
    }


def run_cpu(quick: bool) -> dict[str, object]:
    """Toy version: CPU matmul alone vs beside a memcpy thread, and a world-of-one gather."""
    print("CPU run (no CUDA): toy sizes; these numbers say nothing about copy engines.")
    n, iters = (128, 20) if quick else (256, 40)
    a, b = torch.randn(n, n), torch.randn(n, n)

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        return time.perf_counter() - t0

    timed()  # warm-up (thread pool, first-touch)
    alone = min(timed() for _ in range(5))
    src = torch.randn(1 << 20)
    dst = torch.empty_like(src)
    stop = threading.Event()
    copied = [0]

    def mover() -> None:
        while not stop.is_set():
            dst.copy_(src)
            copied[0] += src.numel() * 4

    th = threading.Thread(target=mover)
    t0 = time.perf_counter()
    th.start()
    beside = min(timed() for _ in range(5))
    stop.set()
    th.join()
    gbs = copied[0] / (time.perf_counter() - t0) / 1e9
    out = torch.empty_like(src)
    gc.all_gather_into_tensor(out, src, backend="copy_engine")
    ok = torch.equal(out, src)
    gf = 2.0 * n**3 * iters / 1e9
    print(f"{'scenario':28} {'matmul GFLOP/s':>14} {'copy GB/s':>9}")
    print(f"{'matmul alone':28} {gf / alone:14.2f} {'-':>9}")
    print(f"{'beside a memcpy thread':28} {gf / beside:14.2f} {gbs:9.2f}")
    print(f"world-of-one copy_engine all_gather correct: {ok}")
    return {
        "bench": "comms.interference",
        "device": "cpu",
        "torch": torch.__version__,
        "quick": quick,
        "matmul_gflops_alone": round(gf / alone, 2),
        "matmul_gflops_beside_copy": round(gf / beside, 2),
        "copy_gbs": round(gbs, 2),
        "all_checks_ok": bool(ok),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="fewer, shorter windows")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if torch.cuda.is_available():
        result = run_gpu(QUICK if args.quick else BenchConfig(), args.quick)
    else:
        result = run_cpu(args.quick)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))
    return 0 if result["all_checks_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
