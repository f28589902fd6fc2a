"""Bench: issue 15's table in one command, ours beside the best torch path in the same run.

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.table [--out DIR] [--iters N]
    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.table --bwd-compare   # JFA backward A/B only
    ... --bwd-compare --bwd-cases trainer,long --no-bwd-sweep   # some cases, no one-pass tile sweep

Why a third bench: `attention` and `gdpa` sweep many shapes and tiles; this one prints only
the issue's rows on the issue's batch (`torch.manual_seed(62)`; 64 lengths
`LogNormal(6.5, 1.0)` clamped to 64..16384, H=4, D=128, bf16) plus a length-mix sweep (mean
100 -> 4,000 at ~constant tokens) showing where each path wins, in well under two minutes
on an H200. Timing: eager calls, warm-up, CUDA events, median (STYLE.md point 11). Useful
FLOPs = 4 * visible pairs * D * H forward, x3.5 forward+backward. Torch paths: nested-jagged
SDPA (no padding) and padded cuDNN SDPA (pre-padded; padding not timed) for softmax; a
per-sample loop of eager matmuls for GDPA (torch has no fused elementwise attention; a
padded batch would be 64 x 4,787^2 scores). Each of ours is checked against the fp32
reference on the first 8 samples in the same run. `ours_device` is the same call of ours
replayed from a CUDA graph: the kernels' device time without the call's host work, which
the eager figure includes (`bench.eager` sets the two side by side). The compact table is
printed last, then one JSON line; `--out` also writes the JSON there.

"ours" is what `jagged_flash_attention` runs by default in this process; the `path` column
names it (forward / backward: "triton", "flash2" for torch's FlashAttention-2, "flash4" for
FlashAttention-4). With the optional flash-attn-4 installed the default on the issue batch is
FlashAttention-4's, a public kernel, so the table then also times the path without it
(rows "..., no flash-attn-4": our forward and two-pass backward) in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gem_kernels import block_attention, generalized_dot_product_attention, jagged_flash_attention, pad_jagged
from gem_kernels._flash4 import unavailable_reason as flash4_unavailable
from gem_kernels._gdpa import GdpaTiles, force_tiles, gdpa_tiles
from gem_kernels._jfa import fwd_uses_flash, fwd_uses_flash4
from gem_kernels._triton_jfa import (JfaConfig, JfaTiles, _heuristic_config, _tma_modes, bwd_one_pass_from_env,
                                    bwd_uses_flash, bwd_uses_flash4, force_config, jfa_backward, jfa_forward)
from gem_kernels.bench.flash4 import PATHS, switches
from gem_kernels.bench._common import (attention_flops, bench_graph_ms, bench_ms, emit_json, env_info, issue_lengths,
                                       offsets_from_lengths, print_table, rel_err, save_json, tflops, trainer_lengths,
                                       visible_pairs)

H, D = 4, 128
DT = torch.bfloat16


class Batch:
    """q, k, v, dout `[T, H, D]` and offsets for one length list (self-attention)."""

    def __init__(self, lengths: list[int], device: str, heads: int = H) -> None:
        self.lengths = lengths
        self.heads = heads
        self.off = offsets_from_lengths(lengths, device)
        self.max = max(lengths)
        g = torch.Generator(device=device).manual_seed(1)
        t = sum(lengths)
        self.q, self.k, self.v, self.do = (torch.randn(t, heads, D, generator=g, device=device).to(DT)
                                           for _ in range(4))
        self.qg, self.kg, self.vg = (x.clone().requires_grad_() for x in (self.q, self.k, self.v))

    def head(self, n: int) -> Batch:
        """The first n samples (for the reference check)."""
        return Batch(self.lengths[:n], str(self.q.device), self.heads)


def _check(ours: Callable[..., torch.Tensor], ref: Callable[..., torch.Tensor], b: Batch) -> float:
    """Worst relative error of ours (bf16) vs the fp32 reference over out, dq, dk, dv."""
    qg, kg, vg = (x.clone().requires_grad_() for x in (b.q, b.k, b.v))
    out = ours(qg, kg, vg, b)
    grads = torch.autograd.grad(out, (qg, kg, vg), b.do)
    q32, k32, v32 = (x.float().requires_grad_() for x in (b.q, b.k, b.v))
    r = ref(q32, k32, v32, b)
    rg = torch.autograd.grad(r, (q32, k32, v32), b.do.float())
    return max([rel_err(out, r)] + [rel_err(g, w) for g, w in zip(grads, rg)])


def _fwd_bwd(fn: Callable[..., torch.Tensor], b: Batch) -> Callable[[], object]:
    def run() -> object:
        o = fn(b.qg, b.kg, b.vg, b)
        return torch.autograd.grad(o, (b.qg, b.kg, b.vg), b.do)
    return run


def _fwd(fn: Callable[..., torch.Tensor], b: Batch) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return fn(b.q, b.k, b.v, b)
    return run


def jfa(causal: bool, backend: str = "triton") -> Callable[..., torch.Tensor]:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: Batch) -> torch.Tensor:
        return jagged_flash_attention(q, k, v, b.off, b.off, b.max, b.max, causal=causal, backend=backend)
    return f


def gdpa(backend: str = "triton") -> Callable[..., torch.Tensor]:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: Batch) -> torch.Tensor:
        return generalized_dot_product_attention(q, k, v, b.off, b.off, b.max, b.max, activation="silu",
                                                 causal=True, backend=backend)
    return f


def jfa_path(q: torch.Tensor, k: torch.Tensor, off: torch.Tensor, max_len: int) -> str:
    """Which kernels `jagged_flash_attention` runs for self-attention over `q`, `k` with offsets
    `off` (longest sequence `max_len`) in this process, forward / backward
    (the switches and rules of `gem_kernels._jfa` / `_triton_jfa`): "flash4" FlashAttention-4,
    "flash2" torch's FlashAttention-2, "triton" ours (with "one-pass" / "two-pass" for the
    backward). With flash-attn-4 installed the default is FlashAttention-4's for both on the
    issue batch, so the table names it rather than calling it ours."""
    if fwd_uses_flash4(q, k, off, None):
        fwd = "flash4"
    elif fwd_uses_flash(q, k, off, None):
        fwd = "flash2"
    else:
        fwd = "triton"
    if bwd_uses_flash4(q, k, None):
        bwd = "flash4"
    elif bwd_uses_flash(q, None):
        bwd = "flash2"
    else:
        bwd = "triton " + ("one-pass" if bwd_one_pass_from_env(max_len) else "two-pass")
    return f"{fwd} / {bwd}"


def nested_sdpa(causal: bool) -> Callable[..., torch.Tensor]:
    """torch's nested-jagged SDPA (flash backend under the hood; no padding)."""
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: Batch) -> torch.Tensor:
        qn, kn, vn = (torch.nested.nested_tensor_from_jagged(x, b.off, max_seqlen=b.max).transpose(1, 2)
                      for x in (q, k, v))
        return F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal).transpose(1, 2).values()
    return f


def gdpa_torch_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: Batch) -> torch.Tensor:
    """GDPA SiLU causal as a per-sample loop of eager bf16 matmuls (torch's best unpadded path)."""
    off = [0, *torch.tensor(b.lengths).cumsum(0).tolist()]
    outs = []
    for s, e in zip(off[:-1], off[1:]):
        qb, kb, vb = (x[s:e].transpose(0, 1) for x in (q, k, v))  # [H, L, D]
        sc = torch.matmul(qb, kb.transpose(1, 2)) * (1.0 / math.sqrt(D))
        p = F.silu(sc).tril() / b.max
        outs.append(torch.matmul(p, vb).transpose(0, 1))
    return torch.cat(outs)


def _padded_cudnn(b: Batch, causal: bool, iters: int, *, fwd_only: bool = False
                  ) -> tuple[float | None, float | None]:
    """Padded cuDNN SDPA on pre-padded tensors: (fwd ms, fwd+bwd ms), None where it fails."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        qp, kp, vp, dp = (pad_jagged(x, b.off, b.max).transpose(1, 2).contiguous() for x in (b.q, b.k, b.v, b.do))
        qg, kg, vg = (x.clone().requires_grad_() for x in (qp, kp, vp))

        def fwd() -> object:
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal)

        def fwd_bwd() -> object:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(o, (qg, kg, vg), dp)

        f_ms = bench_ms(fwd, warmup=1, iters=iters)
        return f_ms, None if fwd_only else bench_ms(fwd_bwd, warmup=1, iters=iters)
    except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
        print(f"padded cudnn failed: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return None, None


def _try_ms(fn: Callable[[], object], iters: int) -> float | None:
    try:
        return bench_ms(fn, warmup=1, iters=iters)
    except Exception as e:  # noqa: BLE001
        print(f"torch path failed: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return None


def main_table(iters: int) -> list[dict[str, object]]:
    b = Batch(issue_lengths(), "cuda")
    small = b.head(8)
    rows: list[dict[str, object]] = []
    pad_ratio = len(b.lengths) * b.max / sum(b.lengths)
    print(f"batch: B={len(b.lengths)} mean={sum(b.lengths) / len(b.lengths):.0f} max={b.max} "
          f"padding={pad_ratio:.2f}x", flush=True)

    def add(case: str, ours_ms: float | None, flops: float, peer: str, peer_ms: float | None, err: float | None,
            unit: str = "TFLOP/s", path: str = "triton", device_ms: float | None = None) -> None:
        # `ours_device`: the same call replayed from a CUDA graph (device time, no host work):
        # the eager figure minus it is what the call's host time costs (`bench.eager`).
        rows.append({"case": case, "ours": tflops(flops, ours_ms), "ours_ms": ours_ms, "peer": peer,
                     "peer_val": tflops(flops, peer_ms), "peer_ms": peer_ms, "unit": unit, "err": err,
                     "path": path, "ours_device": tflops(flops, device_ms), "ours_device_ms": device_ms})
        print(rows[-1], flush=True)

    # With flash-attn-4 installed the default JFA path on this batch is FlashAttention-4's (a
    # public kernel): its rows say so in `path`, and the rows "..., no flash-attn-4" time the
    # default without it (our forward and two-pass backward) in the same run.
    fa4 = flash4_unavailable(b.q, None, k=b.k) is None
    for causal in (False, True):
        name = "causal" if causal else "full"
        f_fwd, f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=causal), H, D)
        err = _check(jfa(causal), jfa(causal, "reference"), small)
        fwd = bench_ms(_fwd(jfa(causal), b), iters=iters)
        all_ = bench_ms(_fwd_bwd(jfa(causal), b), iters=iters)
        path = jfa_path(b.q, b.k, b.off, b.max)
        # Device figures for our kernels only (a CUDA graph of the CuTe kernels is not tried here).
        ours_only = "flash4" not in path
        fwd_dev = bench_graph_ms(_fwd(jfa(causal), b), iters=iters) if ours_only else None
        all_dev = bench_graph_ms(_fwd_bwd(jfa(causal), b), iters=iters) if ours_only else None
        if fa4:
            with switches(*PATHS["default"]):
                path0 = jfa_path(b.q, b.k, b.off, b.max)
                fwd0 = bench_ms(_fwd(jfa(causal), b), iters=iters)
                all0 = bench_ms(_fwd_bwd(jfa(causal), b), iters=iters)
        # torch's nested SDPA rejects is_causal with nested q/k: padded cuDNN is the causal peer.
        nf = None if causal else _try_ms(_fwd(nested_sdpa(causal), b), iters)
        na = None if causal else _try_ms(_fwd_bwd(nested_sdpa(causal), b), iters)
        pf, pa = _padded_cudnn(b, causal, max(2, iters // 2))
        torch.cuda.empty_cache()
        bf, bn = min(((nf, "nested SDPA"), (pf, "padded cuDNN")), key=lambda x: math.inf if x[0] is None else x[0])
        ba, bna = min(((na, "nested SDPA"), (pa, "padded cuDNN")), key=lambda x: math.inf if x[0] is None else x[0])
        add(f"JFA fwd {name}", fwd, f_fwd, bn, bf, err, path=path, device_ms=fwd_dev)
        add(f"JFA fwd+bwd {name}", all_, f_all, bna, ba, err, path=path, device_ms=all_dev)
        if fa4:
            add(f"JFA fwd {name}, no flash-attn-4", fwd0, f_fwd, bn, bf, None, path=path0)
            add(f"JFA fwd+bwd {name}, no flash-attn-4", all0, f_all, bna, ba, None, path=path0)

    f_fwd, f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=True), H, D)
    err = _check(gdpa(), gdpa("reference"), small)
    add("GDPA SiLU causal fwd", bench_ms(_fwd(gdpa(), b), iters=iters), f_fwd, "torch per-sample loop",
        _try_ms(_fwd(gdpa_torch_loop, b), max(2, iters // 2)), err,
        device_ms=bench_graph_ms(_fwd(gdpa(), b), iters=iters))
    add("GDPA SiLU causal fwd+bwd", bench_ms(_fwd_bwd(gdpa(), b), iters=iters), f_all, "torch per-sample loop",
        _try_ms(_fwd_bwd(gdpa_torch_loop, b), max(2, iters // 2)), err,
        device_ms=bench_graph_ms(_fwd_bwd(gdpa(), b), iters=iters))
    # A/B of the tanh.approx sigmoid (the default): the same kernels with exp2 + reciprocal.
    old = {kind: dataclasses.replace(gdpa_tiles(b.max, D, kind=kind), tanh_sigmoid=False)
           for kind in ("fwd", "dq", "dkdv")}
    with force_tiles(**old):
        err_old = _check(gdpa(), gdpa("reference"), small)
        add("GDPA SiLU causal fwd, exp2+rcp sigmoid", bench_ms(_fwd(gdpa(), b), iters=iters), f_fwd, "-", None,
            err_old)
        add("GDPA SiLU causal fwd+bwd, exp2+rcp", bench_ms(_fwd_bwd(gdpa(), b), iters=iters), f_all, "-", None,
            err_old)
    torch.cuda.empty_cache()

    rows.append(block_row(b, small, iters))

    # Dense 8 x 4096, 16 heads, full: ours vs cuDNN SDPA.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(3)
    qd, kd, vd = (torch.randn(8 * 4096, 16, D, generator=g, device="cuda").to(DT) for _ in range(3))
    offd = offsets_from_lengths([4096] * 8, "cuda")
    f_dense = 4.0 * 8 * 4096 * 4096 * D * 16
    ours_d = bench_ms(lambda: jagged_flash_attention(qd, kd, vd, offd, offd, 4096, 4096), iters=iters)
    path_d = jfa_path(qd, kd, offd, 4096)
    ours_d0 = None
    if flash4_unavailable(qd, None, k=kd) is None:
        with switches(*PATHS["default"]):
            path_d0 = jfa_path(qd, kd, offd, 4096)
            ours_d0 = bench_ms(lambda: jagged_flash_attention(qd, kd, vd, offd, offd, 4096, 4096), iters=iters)
    qp, kp, vp = (x.view(8, 4096, 16, D).transpose(1, 2).contiguous() for x in (qd, kd, vd))

    def cudnn() -> object:
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp)

    with torch.no_grad():
        ref_d = F.scaled_dot_product_attention(qp, kp, vp).transpose(1, 2).reshape(8 * 4096, 16, D)
        err_d = rel_err(jagged_flash_attention(qd, kd, vd, offd, offd, 4096, 4096), ref_d)
    cudnn_ms = _try_ms(cudnn, iters)
    add("dense 8x4096x16 fwd", ours_d, f_dense, "cuDNN SDPA", cudnn_ms, err_d, path=path_d,
        device_ms=None if "flash4" in path_d else bench_graph_ms(
            lambda: jagged_flash_attention(qd, kd, vd, offd, offd, 4096, 4096), iters=iters))
    if ours_d0 is not None:
        add("dense 8x4096x16 fwd, no flash-attn-4", ours_d0, f_dense, "cuDNN SDPA", cudnn_ms, None, path=path_d0)
    return rows


def block_row(b: Batch, small: Batch, iters: int) -> dict[str, object]:
    """BlockAttention(64) forward: bytes = q, k, v read + out written; roof = a plain copy."""
    nbytes = 4 * b.q.numel() * b.q.element_size()
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src), iters=iters)  # reads + writes nbytes in all
    blk_ms = bench_ms(lambda: block_attention(b.q, b.k, b.v, b.off, b.max, block_size=64), iters=iters)
    blk_err = rel_err(block_attention(small.q, small.k, small.v, small.off, small.max, block_size=64),
                       block_attention(small.q.float(), small.k.float(), small.v.float(), small.off, small.max,
                                       block_size=64, backend="reference"))
    row: dict[str, object] = {
        "case": "BlockAttention(64) fwd", "ours": nbytes / (blk_ms * 1e-3) / 1e12, "ours_ms": blk_ms,
        "peer": "copy (same bytes)", "peer_val": nbytes / (copy_ms * 1e-3) / 1e12, "peer_ms": copy_ms,
        "unit": "TB/s", "err": blk_err}
    print(row, flush=True)
    return row


def sweep(iters: int) -> list[dict[str, object]]:
    """Length mixes (mean ~120 -> ~3,200 at ~64k tokens): where each path wins, forward full
    (ours, nested SDPA, padded cuDNN) and causal (ours, padded cuDNN: torch's nested SDPA
    rejects is_causal), causal fwd+bwd, and GDPA SiLU causal forward. Useful TFLOP/s."""
    rows: list[dict[str, object]] = []
    for mean in (100, 300, 1000, 2000, 4000):
        n = max(8, 65536 // mean)
        b = Batch(issue_lengths(n, mu=math.log(mean) - 0.5, seed=62), "cuda")
        f_full = attention_flops(visible_pairs(b.lengths, b.lengths), H, D)[0]
        f_fwd, f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=True), H, D)
        r: dict[str, object] = {"mean": round(sum(b.lengths) / n), "B": n, "max": b.max,
                                "path": jfa_path(b.q, b.k, b.off, b.max)}  # "ours" = this path
        r["full_ours"] = tflops(f_full, bench_ms(_fwd(jfa(False), b), warmup=2, iters=iters))
        r["full_nested"] = tflops(f_full, _try_ms(_fwd(nested_sdpa(False), b), iters))
        r["full_cudnn"] = tflops(f_full, _padded_cudnn(b, False, iters, fwd_only=True)[0])
        r["causal_ours"] = tflops(f_fwd, bench_ms(_fwd(jfa(True), b), warmup=2, iters=iters))
        pf, pa = _padded_cudnn(b, True, iters)
        r["causal_cudnn"] = tflops(f_fwd, pf)
        r["causal_fb_ours"] = tflops(f_all, bench_ms(_fwd_bwd(jfa(True), b), warmup=2, iters=iters))
        r["causal_fb_cudnn"] = tflops(f_all, pa)
        r["gdpa_fwd"] = tflops(f_fwd, bench_ms(_fwd(gdpa(), b), warmup=2, iters=iters))
        for col in ("full", "causal", "causal_fb"):
            cands = {k: float(v) for k, v in r.items() if k.startswith(col + "_") and k.count("_") == col.count("_") + 1
                     and isinstance(v, float)}
            r[col + "_win"] = max(cands, key=lambda k: cands[k]).split("_")[-1] if cands else None
        rows.append(r)
        print(r, flush=True)
        del b
        torch.cuda.empty_cache()
    return rows


def narrow_bwd(iters: int) -> list[dict[str, object]]:
    """GDPA SiLU causal fwd+bwd: default backward tiles vs the narrow sweep winners (dQ 64x32,
    dK/dV 32x64, 4 warps, 3 stages) that once faulted on the H200. Run it in its own process:
    an illegal memory access poisons the CUDA context."""
    b = Batch(issue_lengths(), "cuda")
    f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=True), H, D)[1]
    narrow = {"dq": GdpaTiles(block_m=64, block_n=32, num_warps=4, num_stages=3),
              "dkdv": GdpaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3)}
    rows: list[dict[str, object]] = []
    for name, tiles in (("default", {}), ("narrow", narrow)):
        with force_tiles(**tiles):
            err = _check(gdpa(), gdpa("reference"), b.head(8))
            ms = bench_ms(_fwd_bwd(gdpa(), b), iters=iters)
            torch.cuda.synchronize()
        rows.append({"bwd_tiles": name, "fwdbwd_ms": ms, "tflops": tflops(f_all, ms), "err": err})
        print(rows[-1], flush=True)
    return rows


# One-pass backward tile sweep (q x kv, warps, stages) beside the heuristic's one-pass tiles
# (a row equal to them is skipped): the two-pass dK/dV kernel uses 32x64 / 4 warps / 3 stages;
# FlashAttention-2's CUDA backward 64x128 / 8 warps at D=128. Wider kv blocks mean fewer dQ
# atomics per FLOP; BLOCK_M = 32 beat 64 on the H200 (64x64 was ~3x slower than two-pass: dropped).
BWD_SWEEP = (
    JfaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3),
    JfaTiles(block_m=32, block_n=64, num_warps=4, num_stages=2),
    JfaTiles(block_m=32, block_n=128, num_warps=8, num_stages=2),
    JfaTiles(block_m=32, block_n=128, num_warps=8, num_stages=3),
    JfaTiles(block_m=32, block_n=128, num_warps=4, num_stages=2),
    JfaTiles(block_m=16, block_n=128, num_warps=4, num_stages=2),
    JfaTiles(block_m=64, block_n=128, num_warps=8, num_stages=2),
    JfaTiles(block_m=64, block_n=128, num_warps=8, num_stages=1),
)


# Two-pass dK/dV tile sweep (q x kv, warps, stages; `dq` tiles kept): ncu (2026-12-04,
# kernels/BENCHMARKS.md) found the heuristic's 32x64 / 4 warps kernel at 255 registers with
# millions of local-memory loads (its two [BLOCK_N, D] fp32 accumulators over 128 threads).
# 8 warps halve the accumulators' registers per thread.
BWD2_SWEEP = (
    JfaTiles(block_m=32, block_n=64, num_warps=8, num_stages=3),
    JfaTiles(block_m=32, block_n=64, num_warps=4, num_stages=2),
    JfaTiles(block_m=64, block_n=64, num_warps=8, num_stages=2),
    JfaTiles(block_m=64, block_n=64, num_warps=8, num_stages=3),
    JfaTiles(block_m=32, block_n=128, num_warps=8, num_stages=2),
    JfaTiles(block_m=64, block_n=128, num_warps=8, num_stages=2),
    JfaTiles(block_m=16, block_n=64, num_warps=4, num_stages=3),
)


def long_lengths() -> list[int]:
    """A long mix at the trainer's token count: the issue batch scaled by 262,144 / its tokens,
    clamped to 64..16384 (255,604 tokens, mean ~4,000; this was the bench's "trainer" case
    until 2026-11-30, but the trainer's sequences are a quarter as long)."""
    lengths = issue_lengths()
    f = 262144 / sum(lengths)
    return [min(16384, max(64, round(n * f))) for n in lengths]


def _tiles(t: JfaTiles) -> str:
    return f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"


BwdCase = tuple[str, list[int], int, bool]  # name, lengths, heads, causal


def bwd_cases() -> list[BwdCase]:
    """`bwd_compare`'s default cases: the issue batch (H=4) full and causal; the trainer's
    batches (H=8, 262k tokens of mean-1,000 sequences) full; a long mix (H=8, 256k tokens,
    mean ~4,000) full."""
    return [("issue H=4 full", issue_lengths(), 4, False), ("issue H=4 causal", issue_lengths(), 4, True),
            ("trainer H=8 full", trainer_lengths(), 8, False), ("long H=8 full", long_lengths(), 8, False)]


def select_cases(cases: list[BwdCase], prefixes: list[str] | None) -> list[BwdCase]:
    """The cases whose name starts with one of `prefixes` (None: all), in their own order."""
    if prefixes is None:
        return cases
    picked = [c for c in cases if any(c[0].startswith(p) for p in prefixes)]
    if not picked:
        raise ValueError(f"--bwd-cases {','.join(prefixes)!r} matches none of {[c[0] for c in cases]}")
    return picked


def _tma_label(cfg: JfaConfig, b: Batch) -> str:
    """What `cfg.tma` / `tma_loads` become on this device for this batch (see `_tma_modes`)."""
    ws = torch.empty((1, b.heads, D), dtype=torch.float32, device=b.q.device)  # like the fresh dQ workspace
    reduce, loads = _tma_modes(cfg, b.q, b.do, ws)
    return "+".join(name for name, on in (("reduce", reduce), ("loads", loads)) if on) or "-"


def bwd_compare(iters: int, cases: list[BwdCase] | None = None, device: str = "cuda", *,
                case_prefixes: list[str] | None = None, sweep: bool = True) -> list[dict[str, object]]:
    """Issue #15/#16: the JFA backward, two-pass (dK/dV + dQ kernels) vs one-pass (dK/dV kernel
    adding dQ with atomics), backward-only and fwd+bwd, plus a one-pass tile sweep (backward
    only; `sweep=False` skips it). The "one-pass tma" and "one-pass tma+loads" rows are the
    one-pass heuristic tiles with `JfaConfig.tma` (dQ by TMA bulk reduce) and with `tma_loads`
    too (q/dO through tensor descriptors); their `tma` column says what ran ("-": the plain
    path, e.g. not an SM90+ GPU). Cases (name, lengths, heads, causal): `bwd_cases()`, or those
    whose name starts with one of `case_prefixes`. err: vs the fp32 reference on the first 8
    samples for the issue batch's main paths, else vs the two-pass gradients."""
    cases = select_cases(bwd_cases() if cases is None else cases, case_prefixes)
    rows: list[dict[str, object]] = []
    for name, lengths, heads, causal in cases:
        b = Batch(lengths, device, heads)
        print(f"{name}: B={len(lengths)} tokens={sum(lengths)} max={b.max}", flush=True)
        f_fwd, f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=causal), heads, D)
        scale = 1.0 / math.sqrt(D)
        with torch.no_grad():
            out, lse = jfa_forward(b.q, b.k, b.v, b.off, b.off, b.max, b.max, causal, None, scale)

        def bwd(b: Batch = b, out: torch.Tensor = out, lse: torch.Tensor = lse,
                causal: bool = causal) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return jfa_backward(b.do, b.q, b.k, b.v, out, lse, b.off, b.off, b.max, b.max, causal, None, scale)

        two = _heuristic_config(b.max, b.max, D, DT, False)
        one = _heuristic_config(b.max, b.max, D, DT, True)
        with force_config(two):
            base = bwd()
        configs = [("two-pass", two), ("one-pass", one), ("one-pass tma", dataclasses.replace(one, tma=True)),
                   ("one-pass tma+loads", dataclasses.replace(one, tma=True, tma_loads=True))]
        if sweep:
            configs += [("one-pass sweep", dataclasses.replace(one, dkdv=t)) for t in BWD_SWEEP if t != one.dkdv]
            configs += [("two-pass sweep", dataclasses.replace(two, dkdv=t)) for t in BWD2_SWEEP if t != two.dkdv]
        two_ms = math.nan
        for path, cfg in configs:
            tiles = _tiles(cfg.dkdv) if cfg.one_pass else f"dkdv {_tiles(cfg.dkdv)}; dq {_tiles(cfg.dq)}"
            ms: float | None = None
            fb_ms: float | None = None
            err: float | str | None = None
            try:
                with force_config(cfg):
                    ms = bench_ms(bwd, warmup=2, iters=iters)
                    err = max(rel_err(g, w) for g, w in zip(bwd(), base))
                    if not path.endswith("sweep"):
                        fb_ms = bench_ms(_fwd_bwd(jfa(causal), b), warmup=1, iters=iters)
                        if heads == H:  # the issue batch: the fp32 reference on the first 8 samples
                            err = _check(jfa(causal), jfa(causal, "reference"), b.head(8))
            except Exception as e:  # noqa: BLE001 - e.g. a tile that runs out of shared memory
                if path == "two-pass":
                    raise
                err = f"{type(e).__name__}: {str(e)[:60]}"
            two_ms = ms if path == "two-pass" and ms is not None else two_ms
            rows.append({"case": name, "path": path, "tiles": tiles, "tma": _tma_label(cfg, b), "bwd_ms": ms,
                         "bwd_tflops": tflops(f_all - f_fwd, ms), "bwd_x": None if ms is None else two_ms / ms,
                         "fb_ms": fb_ms, "fb_tflops": tflops(f_all, fb_ms), "err": err})
            print(rows[-1], flush=True)
        del b, out, lse, base
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_bwd_compare(rows: list[dict[str, object]]) -> None:
    """The compact two-pass vs one-pass table, then the fastest one-pass tiles per case."""
    print("\nJFA backward, two-pass vs one-pass (useful TFLOP/s, backward = 2.5x forward FLOPs; bwd_x = "
          "two-pass bwd ms / this bwd ms; err = max rel. error of out/dq/dk/dv vs the fp32 reference on 8 "
          "samples for the issue batch's main rows (not the sweep), else of dq/dk/dv vs two-pass; tma = what "
          "the TMA rows ran: reduce / loads, '-' = the plain path):")
    print_table(rows, ["case", "path", "tiles", "tma", "bwd_ms", "bwd_tflops", "bwd_x", "fb_ms", "fb_tflops", "err"])
    for kind in ("one-pass", "two-pass"):
        print(f"\nfastest {kind} config per case (backward only):")
        for case in dict.fromkeys(str(r["case"]) for r in rows):
            ones = [r for r in rows if r["case"] == case and str(r["path"]).startswith(kind)
                    and isinstance(r["bwd_ms"], float)]
            if not ones:
                print(f"  {case}: no {kind} config ran")
                continue
            best = min(ones, key=lambda r: _num(r["bwd_ms"]))
            print(f"  {case}: {best['path']} {best['tiles']}  {_num(best['bwd_ms']):.3f} ms  "
                  f"{_num(best['bwd_x']):.2f}x two-pass  "
                  f"err {_num(best['err']):.2g}")


def _num(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=7, help="timed iterations per figure (median)")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--block", type=int, default=0, metavar="ROUNDS",
                   help="only the BlockAttention row, this many times (its eager call is host-bound: "
                        "box-to-box and round-to-round spread)")
    p.add_argument("--narrow-bwd", action="store_true", help="only GDPA fwd+bwd, default vs narrow backward tiles")
    p.add_argument("--bwd-compare", action="store_true",
                   help="only the JFA backward: two-pass vs one-pass (+ TMA variants, one-pass tile sweep)")
    p.add_argument("--bwd-cases", default=None,
                   help="with --bwd-compare: comma list of case-name prefixes (e.g. trainer,long); default all")
    p.add_argument("--no-bwd-sweep", action="store_true",
                   help="with --bwd-compare: skip the one-pass tile sweep (BWD_SWEEP) rows")
    p.add_argument("--out", default=os.environ.get("OUT"), help="directory for table.json (default $OUT)")
    args = p.parse_args()
    if (args.bwd_cases is not None or args.no_bwd_sweep) and not args.bwd_compare:
        p.error("--bwd-cases and --no-bwd-sweep go with --bwd-compare")
    prefixes = None if args.bwd_cases is None else [c.strip() for c in args.bwd_cases.split(",") if c.strip()]
    if not torch.cuda.is_available():
        print("table bench needs CUDA (the CPU toy runs are `bench.attention --quick` / `bench.gdpa --quick`)")
        skipped: dict[str, object] = {"bench": "table", "skipped": "no CUDA", **env_info()}
        emit_json(skipped)
        return
    if args.bwd_compare:
        rows_b = bwd_compare(max(3, args.iters // 2 + 1), case_prefixes=prefixes, sweep=not args.no_bwd_sweep)
        print_bwd_compare(rows_b)
        bc: dict[str, object] = {"bench": "table_bwd_compare", **env_info(), "rows": rows_b}
        save_json(args.out, "table.json", bc)
        emit_json(bc)
        return
    if args.narrow_bwd:
        nb: dict[str, object] = {"bench": "table_narrow_bwd", **env_info(), "rows": narrow_bwd(args.iters)}
        emit_json(nb)
        return
    if args.block:
        b = Batch(issue_lengths(), "cuda")
        blk = [block_row(b, b.head(8), args.iters) for _ in range(args.block)]
        print_table(blk, ["case", "ours", "peer_val", "unit", "peer", "ours_ms", "peer_ms", "err"])
        emit_json({"bench": "table_block", **env_info(), "rows": blk})
        return
    rows = main_table(args.iters)
    save_json(args.out, "table.json", {"bench": "table", **env_info(), "rows": rows, "sweep": "not run yet"})  # if cut off
    sw = [] if args.no_sweep else sweep(max(3, args.iters // 2))
    print("\nlength-mix sweep (useful TFLOP/s; *_win = fastest path; fb = fwd+bwd; gdpa = SiLU causal fwd):")
    if sw:
        print_table(sw, ["mean", "B", "max", "full_ours", "full_nested", "full_cudnn", "full_win", "causal_ours",
                         "causal_cudnn", "causal_win", "causal_fb_ours", "causal_fb_cudnn", "causal_fb_win", "gdpa_fwd",
                         "path"])
    print("\nissue 15 table (eager calls, median of CUDA events; err = max rel. error vs fp32 reference):")
    print_table(rows, ["case", "ours", "ours_device", "peer_val", "unit", "peer", "ours_ms", "peer_ms", "err", "path"])
    payload: dict[str, object] = {"bench": "table", **env_info(), "rows": rows, "sweep": sw}
    save_json(args.out, "table.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
