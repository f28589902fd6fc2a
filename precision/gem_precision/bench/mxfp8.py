"""MXFP8 bench: quantization GB/s, GEMM TFLOP/s, MXFP8Linear fwd+bwd, with correctness checks.

    PYTHONPATH=precision python3 -m gem_precision.bench.mxfp8 [--quick]
    bazel run //precision:bench_mxfp8 -- --quick

Baselines in the same run: device copy (bandwidth ceiling), bf16 torch.mm, torch._scaled_mm
rowwise FP8 (the FP8 upper bound on Hopper), torch.nn.functional.scaled_mm blockwise FP8
(1x128 activations, 128x128 weights, DeepSeek-style) where this torch has it, nn.Linear bf16.
Timing: triton.testing.do_bench (CUDA events, L2 flushed between reps), median.
Without CUDA it runs a toy-size emulation check and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gem_precision import MXFP8Linear, MXLinearConfig, mx_mm, mx_mm_reference, to_mx, to_mx_2d_both, to_mx_reference

COPY_CEILING_TBS = 4.22  # measured H200 device copy (DESIGN.md)


def _bench(fn: Callable[[], Any], rep_ms: int = 60) -> float:
    import triton.testing

    ms: float = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
    return ms


def _mixed(shape: tuple[int, int], dtype: torch.dtype, device: str) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, generator=g)
    e = torch.randint(-20, 20, (shape[0], 1), device=device, generator=g).float()
    return (x * torch.exp2(e)).to(dtype)


def _codes_equal(a: Any, b: Any) -> bool:
    d = a.data.device
    return bool(torch.equal(a.scale, b.scale.to(d)) and torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8).to(d)))


def correctness(dev: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    x = _mixed((1024, 2048), torch.bfloat16, dev)
    x[3, 17] = float("nan")
    xc = x.cpu()
    ok = True
    for mode in ("floor", "rceil"):
        r, c = to_mx_2d_both(x, scale_mode=mode)
        ok &= _codes_equal(r, to_mx_reference(xc, scale_mode=mode))
        ok &= _codes_equal(c, to_mx_reference(xc.t(), scale_mode=mode))
        ok &= _codes_equal(to_mx(x, dim=0, scale_mode=mode), to_mx_reference(xc, dim=0, scale_mode=mode))
    out["quant_bit_exact"] = bool(ok)
    from gem_precision import _triton_quant as tq

    per_variant = {}
    for v in tq.VARIANTS:  # each variant's default tile (small shape: no tuning)
        tq.FORCE_VARIANT["variant"] = v
        try:
            r, c = to_mx_2d_both(x, scale_mode="rceil")
            okv = _codes_equal(r, to_mx_reference(xc, scale_mode="rceil"))
            okv &= _codes_equal(c, to_mx_reference(xc.t(), scale_mode="rceil"))
            okv &= _codes_equal(to_mx(x, dim=0), to_mx_reference(xc, dim=0))
        finally:
            tq.FORCE_VARIANT["variant"] = None
        per_variant[v] = bool(okv)
    out["quant_variants_bit_exact"] = per_variant
    # quant_bw checks against the reference computed on the GPU: is it the CPU one?
    out["gpu_reference_equals_cpu"] = all(
        _codes_equal(to_mx_reference(x, dim=d, scale_mode=m), to_mx_reference(xc, dim=d, scale_mode=m))
        for d in (0, 1) for m in ("floor", "rceil"))
    from gem_precision._triton_quant import hw_cvt_ok

    out["quant_hw_fp8_cvt_path"] = hw_cvt_ok(x.device)  # False: the exact integer path is used
    a = to_mx(torch.randn(2048, 2048, device=dev))
    b = to_mx(torch.randn(1536, 2048, device=dev))
    y = mx_mm(a, b, out_dtype=torch.float32)
    ref = mx_mm_reference(a, b, out_dtype=torch.float32)
    den = a.dequantize().abs() @ b.dequantize().abs().t()
    out["gemm_max_err_over_sum_abs"] = float(((y - ref).abs() / den).max())
    lin = nn.Linear(1024, 512, device=dev)
    xi = torch.randn(4096, 1024, device=dev, requires_grad=True)
    dy = torch.randn(4096, 512, device=dev, dtype=torch.bfloat16)
    res: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for be in ("triton", "reference"):
        xi.grad = None
        lin.zero_grad()
        yy = MXFP8Linear.from_linear(lin, MXLinearConfig(backend=be))(xi)
        yy.backward(dy)
        assert xi.grad is not None and lin.weight.grad is not None
        res.append((yy.float(), xi.grad.clone(), lin.weight.grad.clone()))
    out["linear_rel_err_vs_emulation"] = max(float((t - r).detach().norm() / r.detach().norm()) for t, r in zip(*res))
    return out


QUANT_VARIANTS: dict[str, tuple[str, ...]] = {  # which kernel variants each cast has (_triton_quant._TILES)
    "row": ("v1", "v1e"), "col": ("v1", "loop"), "both": ("v1", "v1e"),
}


def quant_bw(shape: tuple[int, int], device: str = "cuda") -> list[dict[str, Any]]:
    """GB/s of each cast, for the tuner's pick over all variants ("auto") and for each kernel
    variant forced, side by side; every timed output is checked bit for bit against the
    reference (computed on the GPU; `correctness` checks that GPU reference = CPU reference)."""
    from gem_precision import _triton_quant as tq

    x = _mixed(shape, torch.bfloat16, device)
    n = x.numel()
    rows: list[dict[str, Any]] = []
    y = torch.empty_like(x)
    t = _bench(lambda: y.copy_(x))
    rows.append({"op": "copy bf16 (baseline)", "variant": "-", "ms": t, "GB/s": 2 * 2 * n / t / 1e6, "bit_exact": True})
    ref = {
        "row floor": (to_mx_reference(x),), "row rceil": (to_mx_reference(x, scale_mode="rceil"),),
        "col": (to_mx_reference(x, dim=0),), "both": (to_mx_reference(x), to_mx_reference(x.t())),
    }
    cases: list[tuple[str, str, Callable[[], Any], float]] = [
        ("quant dim -1 floor", "row floor", lambda: (to_mx(x),), 2 * n + n + n / 32),
        ("quant dim -1 rceil", "row rceil", lambda: (to_mx(x, scale_mode="rceil"),), 2 * n + n + n / 32),
        ("quant dim 0", "col", lambda: (to_mx(x, dim=0),), 2 * n + n + n / 32),
        ("quant both (one read)", "both", lambda: to_mx_2d_both(x), 2 * n + 2 * n + 2 * n / 32),
    ]
    forced: list[tuple[str, str | None]] = [(v, v) for v in tq.VARIANTS]
    passes: list[tuple[str, str | None]] = [("auto", None), *forced, ("auto (again)", None)]
    try:
        for label, variant in passes:
            tq.FORCE_VARIANT["variant"] = variant
            for name, rk, fn, nbytes in cases:
                kind = rk.split()[0]
                if variant is not None and variant not in QUANT_VARIANTS[kind]:
                    continue
                outs = fn()  # tunes on the first call per (shape, variant)
                exact = all(_codes_equal(o, r) for o, r in zip(outs, ref[rk]))
                t = _bench(fn)
                picked = [v for k, v in tq._tile_cache.items() if k[0] == kind and k[1:3] == shape and k[-1] == variant]
                rows.append({"op": name, "variant": label, "tile": picked[0] if picked else None, "ms": t,
                             "GB/s": nbytes / t / 1e6, "bit_exact": exact})
                del outs
    finally:
        tq.FORCE_VARIANT["variant"] = None
    for r in rows:
        r["% of 4.22 TB/s"] = 100 * r["GB/s"] / (COPY_CEILING_TBS * 1000)
    return rows


def _fp8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    s = amax / 448.0
    return (x.float() / s).to(torch.float8_e4m3fn), s


def _blockwise_fn(x: torch.Tensor, w: torch.Tensor) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """F.scaled_mm with 1x128 activation and 128x128 weight scales (raises if unavailable)."""
    F = torch.nn.functional
    M, K = x.shape
    N = w.shape[0]
    xs = x.float().reshape(M, K // 128, 128).abs().amax(-1).clamp(min=1e-12) / 448.0  # [M, K/128]
    xq = (x.float().reshape(M, K // 128, 128) / xs[..., None]).reshape(M, K).to(torch.float8_e4m3fn)
    ws = w.float().reshape(N // 128, 128, K // 128, 128).abs().amax((1, 3)).clamp(min=1e-12) / 448.0  # [N/128, K/128]
    wq = (w.float().reshape(N // 128, 128, K // 128, 128) / ws[:, None, :, None]).reshape(N, K).to(torch.float8_e4m3fn)
    xs_t = xs.t().contiguous().t()  # outer-dim-major, as cuBLAS wants for 1x128
    ST = F.ScalingType

    def fn() -> torch.Tensor:
        out: torch.Tensor = F.scaled_mm(xq, wq.t(), xs_t, ST.BlockWise1x128, ws.t(), ST.BlockWise128x128,
                                        output_dtype=torch.bfloat16)
        return out

    return fn, fn()


def gemm_rows(shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    rows = []
    for M, N, K in shapes:
        flop = 2 * M * N * K
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        row: dict[str, Any] = {"M": M, "N": N, "K": K}
        rep = 100 if flop < 2e12 else 200
        ref = x @ w.t()
        row["bf16 mm"] = flop / _bench(lambda: torch.mm(x, w.t()), rep) / 1e9
        xq, xs = _fp8_rowwise(x)
        wq, ws = _fp8_rowwise(w)
        try:
            row["fp8 rowwise"] = flop / _bench(lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16), rep) / 1e9
        except Exception as e:  # noqa: BLE001
            row["fp8 rowwise"] = None
            row["rowwise_error"] = str(e)[:120]
        try:
            fn, yb = _blockwise_fn(x, w)
            row["blockwise_rel_err"] = float((yb.float() - ref.float()).norm() / ref.float().norm())
            row["fp8 blockwise 1x128/128x128"] = flop / _bench(fn, rep) / 1e9
        except Exception as e:  # noqa: BLE001
            row["fp8 blockwise 1x128/128x128"] = None
            row["blockwise_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        a, b = to_mx(x), to_mx(w)
        y = mx_mm(a, b)  # tunes once per shape
        row["mxfp8_rel_err"] = float((y.float() - ref.float()).norm() / ref.float().norm())
        row["MXFP8 ours (excl quant)"] = flop / _bench(lambda: mx_mm(a, b), rep) / 1e9
        row["MXFP8 ours (incl quant)"] = flop / _bench(lambda: mx_mm(to_mx(x), to_mx(w)), rep) / 1e9
        row["ours/bf16"] = row["MXFP8 ours (excl quant)"] / row["bf16 mm"]
        # The single fused Triton kernel (FP8 dot + fp32 rescale per 32 K), same operands.
        from gem_precision import _triton_gemm

        _triton_gemm.GEMM_PATH["path"] = "fused"
        try:
            yf = mx_mm(a, b)
            row["fused_rel_err_vs_dequant_path"] = float((yf.float() - y.float()).norm() / y.float().norm())
            row["MXFP8 fused kernel (excl quant)"] = flop / _bench(lambda: mx_mm(a, b), rep) / 1e9
        finally:
            _triton_gemm.GEMM_PATH["path"] = "dequant"
        rows.append(row)
        print(_fmt_row(row), flush=True)
        del x, w, xq, wq, a, b, ref, y
    return rows


def _fmt_row(r: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "   n/a" if v is None else f"{v:6.0f}"

    return (f"{r['M']:>6} {r['N']:>6} {r['K']:>6} | bf16 {f(r['bf16 mm'])} | fp8 row {f(r['fp8 rowwise'])} | "
            f"fp8 blk {f(r['fp8 blockwise 1x128/128x128'])} | MX excl {f(r['MXFP8 ours (excl quant)'])} "
            f"incl {f(r['MXFP8 ours (incl quant)'])} | fused {f(r['MXFP8 fused kernel (excl quant)'])} | x{r['ours/bf16']:.2f} vs bf16")


def linear_rows(shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    rows = []
    for M, N, K in shapes:
        lin = nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
        mx = MXFP8Linear.from_linear(lin, MXLinearConfig(scale_mode="rceil"))
        mxw = MXFP8Linear.from_linear(lin, MXLinearConfig(scale_mode="rceil", wgrad_bf16=True))
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)

        def step(m: nn.Module) -> Callable[[], None]:
            def f() -> None:
                x.grad = None
                lin.weight.grad = None
                lin.bias.grad = None
                m(x).backward(dy)
            return f

        flop = 6 * M * N * K
        row: dict[str, Any] = {"M": M, "N": N, "K": K}
        for name, m in (("nn.Linear bf16", lin), ("MXFP8Linear", mx), ("MXFP8Linear wgrad bf16", mxw)):
            t = _bench(step(m), 200)
            row[name + " ms"] = t
            row[name + " TFLOP/s"] = flop / t / 1e9
        row["speedup"] = row["nn.Linear bf16 ms"] / row["MXFP8Linear ms"]
        rows.append(row)
        print(f"linear M={M} N={N} K={K}: bf16 {row['nn.Linear bf16 ms']:.3f} ms, MXFP8 {row['MXFP8Linear ms']:.3f} ms "
              f"(wgrad bf16 {row['MXFP8Linear wgrad bf16 ms']:.3f} ms), speedup x{row['speedup']:.2f}", flush=True)
    return rows


def cpu_run() -> None:
    print("CPU run (no CUDA): toy-size emulation check only, no speed figures.")
    t0 = time.time()
    x = torch.randn(256, 256)
    lin = nn.Linear(256, 128)
    y = MXFP8Linear.from_linear(lin)(x)
    ref = lin(x)
    err = float((y.float() - ref).detach().norm() / ref.detach().norm())
    a, b = to_mx(x), to_mx(lin.weight.detach())
    gemm_ok = torch.equal(mx_mm(a, b, out_dtype=torch.float32), a.dequantize() @ b.dequantize().t())
    res = {"device": "cpu", "linear_rel_err_vs_fp32": err, "gemm_ref_ok": gemm_ok, "torch": torch.__version__, "seconds": time.time() - t0}
    print(f"MXFP8Linear vs fp32 nn.Linear relative error {err:.4f} (E4M3: a few %)")
    print(json.dumps(res))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="fewer shapes (~30 s)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        cpu_run()
        return
    import triton

    t0 = time.time()
    gpu = torch.cuda.get_device_name()
    print(f"GPU {gpu}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    corr = correctness("cuda")
    print("correctness:", corr, flush=True)
    qshape = (8192, 8192) if args.quick else (16384, 8192)
    qrows = quant_bw(qshape)
    print(f"\nquantization, bf16 {qshape} -> MXFP8 E4M3 (bytes read + written); variant 'auto' = the tuner's "
          "pick over all kernel variants, then each variant forced (its best tile)")
    for r in qrows:
        print(f"  {r['op']:<22} {r['variant']:<13} {r['ms']:8.3f} ms {r['GB/s']:8.0f} GB/s {r['% of 4.22 TB/s']:5.1f} % "
              f"bit-exact {r['bit_exact']}  tile {r.get('tile')}")
    cube = [(8192, 8192, 8192)] if args.quick else [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384)]
    rec_kn = [(1024, 1024), (2048, 512)] if args.quick else [(k, n) for k in (512, 1024, 2048) for n in (512, 1024, 2048)]
    shapes = cube + [(65536, n, k) for k, n in rec_kn]
    print("\nGEMM TFLOP/s (y[M,N] = x[M,K] w[N,K]^T, bf16 out)", flush=True)
    grows = gemm_rows(shapes)
    from gem_precision._triton_gemm import TUNE_LOG

    from gem_precision._triton_quant import TILE_LOG

    print("\nquant tile tuning ((variant, a, b, warps) -> ms; key: kind, R, C, ..., forced variant):")
    for qk, qv in TILE_LOG.items():
        print(f"  {qk[:3] + qk[-1:]}: " + ", ".join(f"{c}={ms:.3f}" for c, ms in qv))
    print("\nMX GEMM tuning (BM, BN, SUB, warps, stages) -> ms:")
    for k, v in TUNE_LOG.items():
        print(f"  {k}: " + ", ".join(f"{c}={ms:.3f}" for c, ms in v))
    print("\nlinear forward+backward (6MNK FLOP)", flush=True)
    lshapes = [(8192, 8192, 8192)] + ([] if args.quick else [(65536, 1024, 1024), (65536, 2048, 2048)])
    lrows = linear_rows(lshapes)
    summary = {
        "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "quick": args.quick,
        "correctness": corr, "quant": qrows, "gemm": grows, "linear": lrows,
        "seconds": round(time.time() - t0, 1),
    }
    print(f"\ntotal {summary['seconds']} s")
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
