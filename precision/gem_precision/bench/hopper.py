"""Hopper bench: one linear's forward + backward, bf16 vs fp8_block vs MXFP8, at the trainer's shapes.

    PYTHONPATH=precision python3 -m gem_precision.bench.hopper [--quick]
    bazel run //precision:bench_hopper -- --quick

Per shape (tokens M, in K -> out N; the h200 preset's 262144 tokens through 1024 -> 4096,
4096 -> 1024, 1024 -> 3072, 8192^3, and 262100 tokens through 1024 -> 4096: a token count
that is not a multiple of 128, as a jagged batch's is): nn.Linear in bf16; FP8BlockLinear ("fp8_block":
quantization included, FP8 wgrad; and "fp8_block_wgrad_bf16"), with the torch quantizers
(quant="torch") and with the fused Triton quantizer (`*_triton`: quant="triton", what the
default quant="auto" runs on CUDA; x and dY read once each);
MXFP8Linear (mxfp8_rceil, the exact dequantize path). Also the forward GEMM alone: bf16
torch.mm vs the blockwise FP8 scaled_mm (quantization excluded). Then the quantizer alone on
every distinct [tokens, features] bf16 operand: GB/s of the fused Triton rows+cols pass (each
QuantTile of `_triton_fp8_block.TILES`, best first) vs the compiled torch pair
quantize_rows + quantize_cols vs a device copy moving the same bytes (bytes = read the input
once + write both codes and both scales; one byte count for every column), and a bit-exactness
check of the fused codes against the torch pair. TFLOP/s = 6 M N K / time (fwd+bwd) or 2 M N K (GEMM);
ratio = bf16 time / this time. Weights and inputs are bf16. Timing: triton.testing.do_bench
(CUDA events, L2 flushed between reps), median. The first fp8_block call compiles its three
quantizations (torch.compile, dynamic shapes: once per process). Without an SM90 GPU it runs
a toy-size emulation check and says so.
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

from gem_precision import FP8BlockConfig, FP8BlockLinear, MXFP8Linear, MXLinearConfig
from gem_precision import _fp8_block as fb
from gem_precision import _triton_fp8_block as tfb

# M, N, K. 262,100 tokens: a jagged batch's count is rarely a multiple of 128, where fp8_block
# pads x and dY to 128 rows (the fused quantizer inside, the torch quantizers by a copy).
SHAPES = [(262144, 4096, 1024), (262144, 1024, 4096), (262144, 3072, 1024), (8192, 8192, 8192),
          (262100, 4096, 1024)]
TRAINER_M = (262144, 262100)
# The h200 trainer model's token-stream linears (d_model 1024): attention's wo, the FFN's wq /
# wo and pooling's (1024 -> 1024), the FFN's and pooling's wkv (1024 -> 2048), attention's wqkv
# (1024 -> 3072); --model-shapes, where the cost model's predictions are checked.
MODEL_SHAPES = [(262144, 1024, 1024), (262144, 2048, 1024), (262144, 3072, 1024)]


def _bench(fn: Callable[[], Any], rep_ms: int = 100) -> float:
    import triton.testing

    ms: float = triton.testing.do_bench(fn, warmup=20, rep=rep_ms, return_mode="median")
    return ms


def _step(m: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    def f() -> None:
        x.grad = None
        for p in m.parameters():
            p.grad = None
        m(x).backward(dy)
    return f


def _operands(M: int, N: int, K: int) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """The bf16 linear K -> N, its input x [M, K] (requires grad) and an output gradient dy."""
    torch.manual_seed(0)
    lin = nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    return lin, x, dy


def row(M: int, N: int, K: int, mx: bool, torch_quant: bool = True) -> dict[str, Any]:
    lin, x, dy = _operands(M, N, K)
    mods: dict[str, nn.Module] = {"bf16": lin}
    if torch_quant:
        mods["fp8_block"] = FP8BlockLinear.from_linear(lin, FP8BlockConfig(quant="torch"))
        mods["fp8_block_wgrad_bf16"] = FP8BlockLinear.from_linear(lin, FP8BlockConfig(wgrad_bf16=True, quant="torch"))
    mods["fp8_block_triton"] = FP8BlockLinear.from_linear(lin, FP8BlockConfig(quant="triton"))
    mods["fp8_block_wgrad_bf16_triton"] = FP8BlockLinear.from_linear(lin, FP8BlockConfig(wgrad_bf16=True, quant="triton"))
    if mx:
        mods["mxfp8_rceil"] = MXFP8Linear.from_linear(lin, MXLinearConfig(scale_mode="rceil"))
    r: dict[str, Any] = {"M": M, "N": N, "K": K,
                         "predicted fp8_block x": FP8BlockConfig().predicted_speedup(K, N),
                         "predicted fp8_block_wgrad_bf16 x": FP8BlockConfig(wgrad_bf16=True).predicted_speedup(K, N)}
    with torch.no_grad():
        ref = lin(x).float()
        y8 = mods["fp8_block_triton"](x).float()
        r["fp8_block_rel_err_vs_bf16"] = float((y8 - ref).norm() / ref.norm())
    del ref, y8
    for name, m in mods.items():
        t = _bench(_step(m, x, dy))
        r[f"{name} ms"] = t
        r[f"{name} TFLOP/s"] = 6 * M * N * K / t / 1e9
    for name in mods:
        r[f"{name} x"] = r["bf16 ms"] / r[f"{name} ms"]
    # the forward GEMM alone, quantization excluded (on the 128-padded rows fp8_block multiplies)
    xd = nn.functional.pad(x.detach(), (0, 0, 0, tfb.padded_rows(M) - M))
    xq, xs = fb.quantize_rows(xd)
    wq, ws = fb.quantize_tiles(lin.weight.detach())
    t_bf = _bench(lambda: torch.mm(xd, lin.weight.t()))
    t_8 = _bench(lambda: fb.block_mm(xq, xs, wq, ws, b_tiles=True, out_dtype=torch.bfloat16, backend="cublas"))
    r["gemm bf16 TFLOP/s"] = 2 * M * N * K / t_bf / 1e9
    r["gemm fp8 blockwise TFLOP/s"] = 2 * M * N * K / t_8 / 1e9
    return r


def quant_row(M: int, K: int) -> dict[str, Any]:
    """The quantizer alone on a bf16 [M, K]: fused Triton rows+cols vs the torch pair vs copy."""
    torch.manual_seed(0)
    t = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    nbytes = M * K * 2 + 2 * M * K + 2 * 4 * (M * K // fb.BLOCK)  # read t; write 2 codes + 2 scales
    rows_c = fb._quant(fb.quantize_rows, "cublas", True)
    cols_c = fb._quant(fb.quantize_cols, "cublas", True)
    (rq, rs), (cq, cs) = rows_c(t), cols_c(t)
    r, c = tfb.quantize_rows_cols_triton(t, True, True)
    assert r is not None and c is not None
    exact = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in ((r[0], rq), (c[0], cq)))
    exact = exact and torch.equal(r[1], rs) and torch.equal(c[1], cs)
    del r, c, rq, rs, cq, cs
    res: dict[str, Any] = {"M": M, "K": K, "bytes": nbytes, "fused_bit_exact_vs_torch": exact}
    tiles = []
    for tile in tfb.TILES:
        ms = _bench(lambda: tfb.quantize_rows_cols_triton(t, True, True, tile=tile), rep_ms=50)
        loop = f" k{tile.k_loop}s{tile.num_stages}" if tile.k_loop > 1 else ""
        tiles.append((ms, f"{tile.bm}x{tile.bk} w{tile.num_warps}{loop}"))
    tiles.sort()
    res["fused ms"], res["fused tile"] = tiles[0]
    res["tiles GB/s"] = {name: nbytes / ms / 1e6 for ms, name in tiles}
    res["rows only ms"] = _bench(lambda: tfb.quantize_rows_cols_triton(t, True, False), rep_ms=50)
    res["torch pair ms"] = _bench(lambda: (rows_c(t), cols_c(t)), rep_ms=50)
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    res["copy ms"] = _bench(lambda: dst.copy_(src), rep_ms=50)
    for k in ("fused", "torch pair", "copy"):
        res[f"{k} GB/s"] = nbytes / res[f"{k} ms"] / 1e6
    res["fused x torch pair"] = res["torch pair ms"] / res["fused ms"]
    res["fused % of copy"] = 100 * res["copy ms"] / res["fused ms"]
    return res


def _fmt_quant(q: dict[str, Any]) -> str:
    tiles = " ".join(f"{n} {g:.0f}" for n, g in q["tiles GB/s"].items())
    return (f"{q['M']:>6} x {q['K']:<5} | {q['fused GB/s']:6.0f} ({q['fused ms']:.3f} ms) | "
            f"{q['torch pair GB/s']:6.0f} ({q['torch pair ms']:.3f} ms) | {q['copy GB/s']:6.0f} | "
            f"x{q['fused x torch pair']:.2f} | {q['fused % of copy']:4.0f} % | {q['fused_bit_exact_vs_torch']} | "
            f"rows only {q['rows only ms']:.3f} ms | {tiles}")


def _fmt(r: dict[str, Any], names: list[str]) -> str:
    cells = " | ".join(f"{r[f'{n} TFLOP/s']:5.0f} {r[f'{n} ms']:7.2f} ms x{r[f'{n} x']:.2f}" for n in names)
    return (f"{r['M']:>6} {r['K']:>5}->{r['N']:<5} | {cells} | gemm bf16 {r['gemm bf16 TFLOP/s']:5.0f} "
            f"fp8 {r['gemm fp8 blockwise TFLOP/s']:5.0f} | err {r['fp8_block_rel_err_vs_bf16']:.3f} | predicted "
            f"x{r['predicted fp8_block x']:.2f} / wgrad_bf16 x{r['predicted fp8_block_wgrad_bf16 x']:.2f}")


def cpu_check() -> dict[str, Any]:
    torch.manual_seed(0)
    lin = nn.Linear(256, 384)
    x = torch.randn(300, 256)
    with torch.no_grad():
        ref = lin(x)
        y = FP8BlockLinear.from_linear(lin)(x).float()
    return {"emulation_rel_err_vs_fp32": float((y - ref).norm() / ref.norm())}


def profile_linear(m: nn.Module, x: torch.Tensor, dy: torch.Tensor, *, steps: int = 3, top: int = 15
                   ) -> list[dict[str, Any]]:
    """Where one fwd+bwd of `m` spends its time: torch.profiler's ops and kernels by self time
    (the device's on CUDA, the host's on CPU), per step, largest first, the first `top`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = x.is_cuda
    step = _step(m, x, dy)
    step()  # warm (compiles, autotunes) outside the profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append({"name": e.key, "ms_per_step": us / 1e3 / steps, "calls_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:top]


def _print_profile(name: str, M: int, N: int, K: int, rows: list[dict[str, Any]]) -> None:
    print(f"profile: {name}, {M} tokens, {K}->{N}: self time per fwd+bwd step (ms), calls")
    for r in rows:
        print(f"  {r['ms_per_step']:8.3f} {r['calls_per_step']:5.1f}  {r['name'][:110]}")


def _profiles(shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    out = []
    for M, N, K in shapes:
        lin, x, dy = _operands(M, N, K)
        for name, m in (("bf16", lin), ("fp8_block_triton", FP8BlockLinear.from_linear(lin, FP8BlockConfig(quant="triton")))):
            rows = profile_linear(m, x, dy)
            _print_profile(name, M, N, K, rows)
            out.append({"name": name, "M": M, "N": N, "K": K, "rows": rows})
        del lin, x, dy
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="the 8192^3 shape and 1024 -> 4096 at 262,144 and 262,100 tokens only")
    p.add_argument("--no-mxfp8", action="store_true", help="leave the MXFP8 column out")
    p.add_argument("--model-shapes", action="store_true",
                   help="the h200 model's token-stream linears (262,144 tokens; 1024 -> 1024, 2048, 3072), "
                        "the fused Triton quantizer only, beside the cost model's prediction "
                        "(FP8BlockConfig.predicted_speedup)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one fwd+bwd of bf16 and fp8_block (fused quantizer) at 1024->4096, "
                        "262,144 and 262,100 tokens: each op's and kernel's device time per step")
    args = p.parse_args(argv)
    t0 = time.time()
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        what = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
        res = cpu_check()
        print(f"{what}: fp8_block's cuBLAS GEMM needs an SM90 GPU; emulation check only: {res}")
        print(json.dumps({"where": what, "timed": False, **res}))
        return
    import triton

    where = (f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
             f"CUDA {torch.version.cuda}")
    print(where, flush=True)
    shapes = MODEL_SHAPES if args.model_shapes else [SHAPES[0], SHAPES[3], SHAPES[4]] if args.quick else SHAPES
    torch_quant = not args.model_shapes
    names = ["bf16"] + (["fp8_block", "fp8_block_wgrad_bf16"] if torch_quant else [])
    names += ["fp8_block_triton", "fp8_block_wgrad_bf16_triton"]
    names += [] if args.no_mxfp8 else ["mxfp8_rceil"]
    print("fwd+bwd of one linear: TFLOP/s, ms, speed-up vs bf16 (quantization included)")
    print(f"{'tokens':>6} {'K->N':<11} | " + " | ".join(f"{n:<24}" for n in names) + " | fwd GEMM only (TFLOP/s)")
    rows = []
    for M, N, K in shapes:
        r = row(M, N, K, not args.no_mxfp8, torch_quant)
        rows.append(r)
        print(_fmt(r, names), flush=True)
        torch.cuda.empty_cache()
    if torch_quant:
        print("quantizer alone, bf16 [M, K] -> 1x128 codes+scales along K and along M (x^T): GB/s over "
              "the same bytes (read once, write both)")
        print(f"{'M x K':<14} | {'triton fused (ms)':<20} | {'torch pair (ms)':<20} | {'copy':>6} | "
              "fused/torch | % copy | bit-exact | rows only | GB/s per tile (best first)")
    quants = []
    for M, K in dict.fromkeys((M, d) for M, N, K in shapes for d in (K, N) if M % 128 == 0 and torch_quant):
        q = quant_row(M, K)
        quants.append(q)
        print(_fmt_quant(q), flush=True)
        torch.cuda.empty_cache()
    trainer = [r for r in rows if r["M"] in TRAINER_M]
    summary = {"where": where, "rows": rows, "quant": quants, "seconds": round(time.time() - t0, 1),
               "fp8_block_min_x_trainer_shapes": min((r["fp8_block x"] for r in trainer if "fp8_block x" in r),
                                                     default=None),
               "fp8_block_triton_min_x_trainer_shapes": min((r["fp8_block_triton x"] for r in trainer), default=None),
               "quant_fused_bit_exact": all(q["fused_bit_exact_vs_torch"] for q in quants),
               "target_x": 1.3}
    worst = summary["fp8_block_min_x_trainer_shapes"]
    worst_t = summary["fp8_block_triton_min_x_trainer_shapes"]
    if args.model_shapes:
        for r in rows:
            r["predicted - measured wgrad_bf16"] = r["predicted fp8_block_wgrad_bf16 x"] - r["fp8_block_wgrad_bf16_triton x"]
        err = max(abs(r["predicted - measured wgrad_bf16"]) for r in rows)
        print(f"the model's stream linears: fp8_block_wgrad_bf16 x{min(r['fp8_block_wgrad_bf16_triton x'] for r in rows):.2f}"
              f"-x{max(r['fp8_block_wgrad_bf16_triton x'] for r in rows):.2f}; the cost model within {err:.2f} of it; "
              f"total {summary['seconds']} s")
    else:
        print(f"fp8_block vs bf16 at the trainer's shapes: min x{worst or 0:.2f}, with quant='triton' "
              f"x{worst_t or 0:.2f} (target >= 1.3); total {summary['seconds']} s")
    if args.profile:
        summary["profile"] = _profiles([SHAPES[0], SHAPES[4]])
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
