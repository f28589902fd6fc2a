"""Bench: the two-pass backward's kernels, Triton against Gluon (`GEM_JFA_GLUON=dkdv|dq|all`).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.dkdv [--iters N] [--out DIR] [--tiles ...]

Why: the Triton dK/dV kernel is the largest item of the trainer's step; `_gluon_jfa` is its
Gluon twin with the score GEMMs issued asynchronously (kernels/BENCHMARKS.md), and the dQ
kernel has one too. Per case, in one run: the dK/dV kernel alone (Triton at its picked config;
Gluon at each `--tiles`), the dQ kernel alone (Triton; Gluon at each `--dq-tiles`), the whole
backward (`jfa_backward`: delta + dK/dV + dQ) with `GEM_JFA_GLUON` off / dkdv / all, and the
eager forward+backward call (`jagged_flash_attention`, the issue table's measure) off / all.
Useful TFLOP/s: dK/dV kernel 8 · visible pairs · D · H (four GEMMs), dQ kernel 6 ·, backward
10 ·, forward+backward 14 ·. `err` = the largest relative difference of Gluon's dK/dV/dQ from
Triton's on the same inputs.
Timing: warm-up, CUDA events, median (`bench_ms`). Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os

import torch

from gem_kernels import _gluon_jfa, jagged_flash_attention
from gem_kernels import _triton_jfa as tj
from gem_kernels._jfa import FWD_ENV
from gem_kernels._launch import launch_of
from gem_kernels._triton_jfa import BWD_ENV
from gem_kernels.bench._common import (bench_ms, emit_json, env_info, issue_lengths, offsets_from_lengths, print_table,
                                       save_json, trainer_lengths, visible_pairs)

D = 128
DT = torch.bfloat16


def _tf(flops: float, ms: float) -> float:
    return round(flops / ms / 1e9, 1)


def _case(name: str, lengths: list[int], heads: int, causal: bool, iters: int,
          tiles: list[tuple[int, int, int, int, bool]], dq_tiles: list[tuple[int, int, int, int, bool]]
          ) -> dict[str, object]:
    off = offsets_from_lengths(lengths, "cuda")
    mx, t = max(lengths), sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(t, heads, D, generator=g, device="cuda").to(DT) for _ in range(4))
    scale = 1.0 / math.sqrt(D)
    pairs = visible_pairs(lengths, lengths, causal=causal)
    out, lse = tj.jfa_forward(q, k, v, off, off, mx, mx, causal, None, scale)
    delta = (do.float() * out.float()).sum(-1).contiguous()
    cfg = dataclasses.replace(tj.pick_config(mx, mx, D, DT), one_pass=False)
    dk_t, dv_t = torch.empty_like(k), torch.empty_like(v)
    grid, args, consts = tj.bwd_dkdv_args(cfg, q, k, v, do, lse, delta, dk_t, dv_t, dk_t, off, off, mx, causal,
                                          None, scale, False, False)
    launch = launch_of(tj._jfa_bwd_dkdv_kernel)
    row: dict[str, object] = dict(case=name, B=len(lengths), mean=round(t / len(lengths)), max=mx, H=heads,
                                  triton_tiles=f"{cfg.dkdv.block_m}x{cfg.dkdv.block_n} w{cfg.dkdv.num_warps} "
                                               f"s{cfg.dkdv.num_stages}")
    ms = bench_ms(lambda: launch(grid, args, consts), iters=iters)
    row["triton_dkdv_ms"], row["triton_dkdv_tf"] = round(ms, 3), _tf(8.0 * pairs * D * heads, ms)
    best: tuple[float, tuple[int, int, int, int, bool]] | None = None
    errs = []
    for tl in tiles:
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        try:
            _gluon_jfa.dkdv(q, k, v, do, lse, delta, dk, dv, off, off, mx, causal, scale, tl)
        except Exception as e:  # a tile that does not compile here: reported, the others still run
            row["gluon_" + "x".join(map(str, tl))] = f"error: {type(e).__name__}: {str(e)[:120]}"
            continue
        errs.append(max(_rel(dk, dk_t), _rel(dv, dv_t)))
        ms = bench_ms(lambda: _gluon_jfa.dkdv(q, k, v, do, lse, delta, dk, dv, off, off, mx, causal, scale, tl),
                      iters=iters)
        row["gluon_" + "x".join(map(str, tl))] = _tf(8.0 * pairs * D * heads, ms)
        if best is None or ms < best[0]:
            best = (ms, tl)
    dq_t = torch.empty_like(q)
    (g0, g1), qargs, qconsts = tj.bwd_dq_args(cfg, q, k, v, do, lse, delta, dq_t.unsqueeze(0), 1, off, off, mx, causal,
                                              None, scale)
    qlaunch = launch_of(tj._jfa_bwd_dq_kernel)
    ms = bench_ms(lambda: qlaunch((g0, g1, 1), qargs, qconsts), iters=iters)
    row["triton_dq_tf"] = _tf(6.0 * pairs * D * heads, ms)
    best_dq: tuple[float, tuple[int, int, int, int, bool]] | None = None
    for tl in dq_tiles:
        dq = torch.empty_like(q)
        key = "gluon_dq_" + "x".join(map(str, tl))
        try:
            _gluon_jfa.dq(q, k, v, do, lse, delta, dq, off, off, mx, causal, scale, tl)
        except Exception as e:
            row[key] = f"error: {type(e).__name__}: {str(e)[:120]}"
            continue
        errs.append(_rel(dq, dq_t))
        ms = bench_ms(lambda: _gluon_jfa.dq(q, k, v, do, lse, delta, dq, off, off, mx, causal, scale, tl), iters=iters)
        row[key] = _tf(6.0 * pairs * D * heads, ms)
        if best_dq is None or ms < best_dq[0]:
            best_dq = (ms, tl)
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
    try:
        for label in ("off", "dkdv", "all"):
            os.environ[_gluon_jfa.ENV] = label
            ms_b = bench_ms(bwd, iters=iters)
            row[f"{label}_bwd_ms"], row[f"{label}_bwd_tf"] = round(ms_b, 3), _tf(10.0 * pairs * D * heads, ms_b)
            if label != "dkdv":
                row[f"{label}_fb_tf"] = _tf(14.0 * pairs * D * heads, bench_ms(fwd_bwd, iters=iters))
    finally:
        os.environ.pop(_gluon_jfa.ENV, None)
        _gluon_jfa.DEFAULT_TILES, _gluon_jfa.DEFAULT_DQ_TILES = saved
    return row


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.float().abs().max()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--tiles", nargs="*", default=["32,128,8,4,1", "32,128,8,3,1", "32,128,8,5,1", "32,128,8,4,0",
                                                  "32,64,4,4,1", "64,128,8,4,1"],
                   help="Gluon dK/dV tiles BLOCK_M,BLOCK_N,num_warps,STAGES,OVERLAP_ACC")
    p.add_argument("--dq-tiles", nargs="*", default=["128,64,8,4,1", "128,64,8,3,1", "128,32,8,4,1", "128,64,8,4,0",
                                                     "64,64,4,4,1"],
                   help="Gluon dQ tiles, the same fields")
    args = p.parse_args()
    os.environ[FWD_ENV] = "pointer"
    os.environ[BWD_ENV] = "two_pass"
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("dkdv bench needs a Hopper GPU")
        emit_json({"bench": "dkdv", "skipped": "no Hopper GPU", **env_info()})
        return
    tiles, dq_tiles = ([(a, b, c, s, bool(o)) for a, b, c, s, o in (tuple(int(x) for x in t.split(",")) for t in ts)]
                       for ts in (args.tiles, args.dq_tiles))
    tl = trainer_lengths()
    cases = [("issue", issue_lengths(), 4, False), ("issue causal", issue_lengths(), 4, True),
             ("trainer+cls", [n + 4 for n in tl], 8, False), ("dense 8x4096", [4096] * 8, 16, False)]
    rows = [_case(name, lengths, heads, causal, args.iters, tiles, dq_tiles)
            for name, lengths, heads, causal in cases if args.only in name]
    cols = ["case", "B", "mean", "max", "H", "triton_tiles", "triton_dkdv_tf",
            *("gluon_" + "x".join(map(str, t)) for t in tiles), "gluon_best", "dkdv_speedup", "err"]
    print("\ndK/dV kernel, Triton vs Gluon (TFLOP/s; gluon_<BM>x<BN>x<warps>x<stages>x<overlap>):")
    print_table(rows, cols)
    print("\ndQ kernel (TFLOP/s), whole backward and eager fwd+bwd with GEM_JFA_GLUON off / dkdv / all:")
    print_table(rows, ["case", "triton_dq_tf", *("gluon_dq_" + "x".join(map(str, t)) for t in dq_tiles),
                       "gluon_dq_best", "off_bwd_tf", "dkdv_bwd_tf", "all_bwd_tf", "off_fb_tf", "all_fb_tf"])
    payload: dict[str, object] = {"bench": "dkdv", **env_info(), "rows": rows}
    save_json(args.out, "dkdv.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
