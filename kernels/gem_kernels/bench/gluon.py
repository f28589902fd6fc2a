"""Bench: JFA's Triton kernels against their Gluon twins (`GEM_JFA_GLUON`, gem_kernels._gluon_jfa).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.gluon [--iters N] [--out DIR] [--tiles ...]

Why: the Triton dK/dV kernel is the largest item of the trainer's step; `_gluon_jfa` holds its
Gluon twin with the score GEMMs issued asynchronously (kernels/BENCHMARKS.md), and twins of
the dQ kernel and of the forward. Per case, in one run: the forward alone (Triton; Gluon at
each `--fwd-tiles`), the dK/dV kernel alone (Triton at its picked config;
Gluon at each `--tiles`), the dQ kernel alone (Triton; Gluon at each `--dq-tiles`), the whole
backward (`jfa_backward`: delta + dK/dV + dQ) with `GEM_JFA_GLUON` off / dkdv / dkdv,dq, and
the eager forward+backward call (`jagged_flash_attention`, the issue table's measure) off / all;
on the causal batch, GDPA's SiLU forward (Triton against `_gluon_gdpa`'s warp-specialized kernel
at each WS tile set). `--fwd-only`: the forwards alone (and cuDNN's on the dense batch).
Useful TFLOP/s: forward 4 · visible pairs · D · H, dK/dV kernel 8 ·, dQ kernel 6 ·, backward
10 ·, forward+backward 14 ·. Per tile set, `_err`: the largest relative difference of Gluon's
dK/dV (dQ) from Triton's on the same inputs; for the forward, the larger of out's relative and
lse2's absolute difference (rows that see a key). `err`: the backward kernels' largest.
Timing: warm-up, CUDA events, median (`bench_ms`). Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import torch

from gem_kernels import _gluon_jfa, jagged_flash_attention
from gem_kernels import _triton_jfa as tj
from gem_kernels._jfa import FWD_ENV
from gem_kernels._launch import launch_of
from gem_kernels._triton_jfa import BWD_ENV
from gem_kernels.bench._common import (bench_ms, emit_json, env_info, issue_lengths, offsets_from_lengths, print_table,
                                       rel_err, save_json, trainer_lengths, visible_pairs)

D = 128
DT = torch.bfloat16


def _tf(flops: float, ms: float) -> float:
    return round(flops / ms / 1e9, 1)


def _sweep(row: dict[str, object], prefix: str, tiles: list[Any], run: Callable[[Any], Any],
           err: Callable[[Any], float], flops: float, iters: int, errs: list[float]) -> tuple[float, Any] | None:
    """Each Gluon tile set of one kernel: `run(tiles)` once for its error (`err` of its result,
    into `row[<prefix><tiles>_err]` and `errs`), then timed into `row[<prefix><tiles>]` (TFLOP/s);
    a tile set that fails (e.g. does not compile here) is reported and the others still run.
    Returns the fastest (ms, tiles), or None."""
    best: tuple[float, Any] | None = None
    for tl in tiles:
        key = prefix + "x".join(map(str, tl))
        try:
            e = err(run(tl))
        except Exception as exc:
            row[key] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
            continue
        row[key + "_err"] = f"{e:.1e}"
        errs.append(e)
        ms = bench_ms(lambda: run(tl), iters=iters)
        row[key] = _tf(flops, ms)
        if best is None or ms < best[0]:
            best = (ms, tl)
    return best


def _case(name: str, lengths: list[int], heads: int, causal: bool, iters: int,
          tiles: list[tuple[int, int, int, int, bool]], dq_tiles: list[tuple[int, int, int, int, bool]],
          fwd_tiles: list[tuple[int, ...]], fwd_only: bool = False) -> dict[str, object]:
    off = offsets_from_lengths(lengths, "cuda")
    mx, t = max(lengths), sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(t, heads, D, generator=g, device="cuda").to(DT) for _ in range(4))
    scale = 1.0 / math.sqrt(D)
    work = visible_pairs(lengths, lengths, causal=causal) * D * heads  # FLOPs per GEMM / 2
    out, lse = tj.jfa_forward(q, k, v, off, off, mx, mx, causal, None, scale)
    delta = (do.float() * out.float()).sum(-1).contiguous()
    cfg = dataclasses.replace(tj.pick_config(mx, mx, D, DT), one_pass=False)
    row: dict[str, object] = dict(case=name, B=len(lengths), mean=round(t / len(lengths)), max=mx, H=heads,
                                  triton_tiles=f"{cfg.dkdv.block_m}x{cfg.dkdv.block_n} w{cfg.dkdv.num_warps} "
                                               f"s{cfg.dkdv.num_stages}")
    fwd_errs: list[float] = []
    seen = torch.isfinite(lse)
    ms = bench_ms(lambda: tj.jfa_forward(q, k, v, off, off, mx, mx, causal, None, scale), iters=iters)
    row["triton_fwd_tf"] = _tf(4.0 * work, ms)
    _sweep(row, "gluon_fwd_", fwd_tiles, lambda tl: _gluon_jfa.forward(q, k, v, off, off, mx, causal, scale, tl),
           lambda r: max(rel_err(r[0], out), float((r[1] - lse)[seen].abs().max())), 4.0 * work, iters, fwd_errs)
    if len(set(lengths)) == 1 and not causal:  # dense: cuDNN's SDPA on the same [B, H, L, D] problem
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qd, kd, vd = (x.view(len(lengths), lengths[0], heads, D).transpose(1, 2) for x in (q, k, v))
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ms = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd), iters=iters)
            row["cudnn_fwd_tf"] = _tf(4.0 * work, ms)
        except RuntimeError as exc:
            row["cudnn_fwd_tf"] = f"error: {str(exc)[:80]}"
    if causal:  # GDPA SiLU causal (issue 15's GDPA rows): Triton against the warp-specialized forward
        from gem_kernels import _gluon_gdpa
        from gem_kernels._gdpa import gdpa_forward_triton

        div = float(mx)
        ref = gdpa_forward_triton(q, k, v, off, off, mx, mx, "silu", scale, div, True, None)
        ms = bench_ms(lambda: gdpa_forward_triton(q, k, v, off, off, mx, mx, "silu", scale, div, True, None),
                      iters=iters)
        row["gdpa_triton_fwd_tf"] = _tf(4.0 * work, ms)
        _sweep(row, "gdpa_ws_", [t for t in fwd_tiles if len(t) > 4 and t[4]],
               lambda tl: _gluon_gdpa.forward(q, k, v, off, off, mx, "silu", scale, div, True, tl),
               lambda r: rel_err(r, ref), 4.0 * work, iters, fwd_errs)
    if fwd_only:
        return row

    errs: list[float] = []
    dk_t, dv_t = torch.empty_like(k), torch.empty_like(v)
    grid, args, consts = tj.bwd_dkdv_args(cfg, q, k, v, do, lse, delta, dk_t, dv_t, dk_t, off, off, mx, causal,
                                          None, scale, False, False)
    launch = launch_of(tj._jfa_bwd_dkdv_kernel)
    ms = bench_ms(lambda: launch(grid, args, consts), iters=iters)
    row["triton_dkdv_ms"], row["triton_dkdv_tf"] = round(ms, 3), _tf(8.0 * work, ms)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    best = _sweep(row, "gluon_", tiles,
                  lambda tl: _gluon_jfa.dkdv(q, k, v, do, lse, delta, dk, dv, off, off, mx, causal, scale, tl),
                  lambda _: max(rel_err(dk, dk_t), rel_err(dv, dv_t)), 8.0 * work, iters, errs)
    dq_t, dq = torch.empty_like(q), torch.empty_like(q)
    (g0, g1), qargs, qconsts = tj.bwd_dq_args(cfg, q, k, v, do, lse, delta, dq_t.unsqueeze(0), 1, off, off, mx, causal,
                                              None, scale)
    qlaunch = launch_of(tj._jfa_bwd_dq_kernel)
    ms = bench_ms(lambda: qlaunch((g0, g1, 1), qargs, qconsts), iters=iters)
    row["triton_dq_tf"] = _tf(6.0 * work, ms)
    best_dq = _sweep(row, "gluon_dq_", dq_tiles,
                     lambda tl: _gluon_jfa.dq(q, k, v, do, lse, delta, dq, off, off, mx, causal, scale, tl),
                     lambda _: rel_err(dq, dq_t), 6.0 * work, iters, errs)
    row["err"] = f"{max(errs):.1e}" if errs else None
    if best is None or best_dq is None:
        return row
    row["gluon_dq_best"] = "x".join(map(str, best_dq[1]))
    row["gluon_dkdv_ms"], row["gluon_best"] = round(best[0], 3), "x".join(map(str, best[1]))
    row["dkdv_speedup"] = round(float(row["triton_dkdv_ms"]) / best[0], 3)  # type: ignore[arg-type]
    xs = [x.clone().requires_grad_() for x in (q, k, v)]

    def fwd_bwd() -> object:
        o = jagged_flash_attention(xs[0], xs[1], xs[2], off, off, mx, mx, causal=causal)
        return torch.autograd.grad(o, xs, do)

    def bwd() -> object:
        return tj.jfa_backward(do, q, k, v, out, lse, off, off, mx, mx, causal, None, scale)

    saved = _gluon_jfa.DEFAULT_TILES, _gluon_jfa.DEFAULT_DQ_TILES
    _gluon_jfa.DEFAULT_TILES, _gluon_jfa.DEFAULT_DQ_TILES = best[1], best_dq[1]  # whole-backward rows: best tiles
    # (the forward+backward "all" row runs the forward at DEFAULT_FWD_TILES)
    try:
        for label in ("off", "dkdv", "dkdv,dq"):  # the backward does not run the forward: "all" = "dkdv,dq"
            os.environ[_gluon_jfa.ENV] = label
            ms_b = bench_ms(bwd, iters=iters)
            row[f"{label}_bwd_ms"], row[f"{label}_bwd_tf"] = round(ms_b, 3), _tf(10.0 * work, ms_b)
        for label in ("off", "all"):
            os.environ[_gluon_jfa.ENV] = label
            row[f"{label}_fb_tf"] = _tf(14.0 * work, bench_ms(fwd_bwd, iters=iters))
    finally:
        os.environ.pop(_gluon_jfa.ENV, None)
        _gluon_jfa.DEFAULT_TILES, _gluon_jfa.DEFAULT_DQ_TILES = saved
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--tiles", nargs="*", default=["32,128,8,4,1", "32,128,8,3,1", "32,128,8,5,1", "32,128,8,4,0",
                                                  "32,64,4,4,1", "64,128,8,4,1"],
                   help="Gluon dK/dV tiles BLOCK_M,BLOCK_N,num_warps,STAGES,OVERLAP_ACC")
    p.add_argument("--fwd-tiles", nargs="*", default=["128,128,8,3", "128,128,12,3,1", "128,64,12,4,1",
                                                      "128,128,12,3,1,1", "128,64,12,4,1,1", "128,128,12,2,1,1,1",
                                                      "128,64,12,4,1,1,1"],
                   help="Gluon forward tiles BLOCK_M,BLOCK_N,num_warps,STAGES[,WS[,PINGPONG[,PERSISTENT]]] (WS 1: "
                        "the warp-specialized kernel, BLOCK_M 128 and 12 warps; PINGPONG 1: its consumers take "
                        "turns; PERSISTENT 1: one program per SM over every (q tile, head))")
    p.add_argument("--fwd-only", action="store_true", help="time the forwards only (no backward kernels)")
    p.add_argument("--dq-tiles", nargs="*", default=["128,64,8,4,1", "128,64,8,3,1", "128,32,8,4,1", "128,64,8,4,0",
                                                     "64,64,4,4,1"],
                   help="Gluon dQ tiles, the same fields")
    args = p.parse_args()
    os.environ[FWD_ENV] = "pointer"
    os.environ[BWD_ENV] = "two_pass"
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("gluon bench needs a Hopper GPU")
        emit_json({"bench": "gluon", "skipped": "no Hopper GPU", **env_info()})
        return
    tiles, dq_tiles = ([(a, b, c, s, bool(o)) for a, b, c, s, o in (tuple(int(x) for x in t.split(",")) for t in ts)]
                       for ts in (args.tiles, args.dq_tiles))
    fwd_tiles = [tuple(int(x) for x in t.split(",")) for t in args.fwd_tiles]
    tl = trainer_lengths()
    cases = [("issue", issue_lengths(), 4, False), ("issue causal", issue_lengths(), 4, True),
             ("trainer+cls", [n + 4 for n in tl], 8, False), ("dense 8x4096", [4096] * 8, 16, False)]
    rows = [_case(name, lengths, heads, causal, args.iters, tiles, dq_tiles, fwd_tiles, args.fwd_only)
            for name, lengths, heads, causal in cases if args.only in name]
    cols = ["case", "B", "mean", "max", "H", "triton_tiles", "triton_dkdv_tf",
            *("gluon_" + "x".join(map(str, t)) for t in tiles), "gluon_best", "dkdv_speedup", "err"]
    print("\nForward, Triton vs Gluon (TFLOP/s; _err = the larger of out's relative and lse2's absolute difference):")
    print_table(rows, ["case", "triton_fwd_tf", "cudnn_fwd_tf",
                       *(f"gluon_fwd_{'x'.join(map(str, t))}{e}" for t in fwd_tiles for e in ("", "_err"))])
    ws_tiles = [t for t in fwd_tiles if len(t) > 4 and t[4]]
    print("\nGDPA SiLU causal forward, Triton vs the warp-specialized Gluon kernel (TFLOP/s):")
    print_table([r for r in rows if "gdpa_triton_fwd_tf" in r],
                ["case", "gdpa_triton_fwd_tf", *(f"gdpa_ws_{'x'.join(map(str, t))}{e}" for t in ws_tiles
                                                 for e in ("", "_err"))])
    if args.fwd_only:
        payload0: dict[str, object] = {"bench": "gluon", "fwd_only": True, **env_info(), "rows": rows}
        save_json(args.out, "gluon_fwd.json", payload0)
        emit_json(payload0)
        return
    print("\ndK/dV kernel, Triton vs Gluon (TFLOP/s; gluon_<BM>x<BN>x<warps>x<stages>x<overlap>):")
    print_table(rows, cols)
    print("\ndQ kernel (TFLOP/s); whole backward with GEM_JFA_GLUON off / dkdv / dkdv,dq; eager fwd+bwd off / all:")
    print_table(rows, ["case", "triton_dq_tf", *("gluon_dq_" + "x".join(map(str, t)) for t in dq_tiles),
                       "gluon_dq_best", "off_bwd_tf", "dkdv_bwd_tf", "dkdv,dq_bwd_tf", "off_fb_tf", "all_fb_tf"])
    payload: dict[str, object] = {"bench": "gluon", **env_info(), "rows": rows}
    save_json(args.out, "gluon.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
