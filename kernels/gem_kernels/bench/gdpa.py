"""Bench: GDPA and BlockAttention vs the best torch paths (issue 4).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.gdpa [--quick] [--no-compile]
    bazel run //kernels:bench_gdpa -- --quick

GPU cases (the JFA bench's batch: 64 log-normal sequences, mean ~840, cap 4,500, seed 0,
H=4, D=128, bf16):
- GDPA self-attention, SiLU and GELU (causal and full): useful TFLOP/s forward and
  forward+backward (useful = 4 * visible pairs * D * H; x3.5 for fwd+bwd) for ours and for a
  padded, masked PyTorch implementation, eager and `torch.compile`d (padding not timed).
- GDPA cross-attention, the personalized-FFN shape: the same queries over exactly 16 or 64
  keys per sample. Reported as TFLOP/s and GB/s (q, k, v read once, out written once; for
  fwd+bwd add dO, q, k, v read and dq, dk, dv written) and as % of the binding roof of the
  measured H200 ceilings (803 TFLOP/s bf16 matmul, 4.22 TB/s copy).
- BlockAttention (block 64, RoPE off/on): GB/s (q, k, v read, out written; fwd+bwd adds
  q, k, v, dO read and dq, dk, dv written) vs SDPA on the padded batch with a block-diagonal
  mask, vs SDPA on the batch regrouped into 64-token blocks (regrouping not timed: favours
  torch), and vs `jagged_flash_attention` with window=64 (a band of similar locality).
Times are medians of CUDA-event-timed single calls (host work of the call included); the
`fwd_graph_*` columns replay the forward in a CUDA graph (GPU time only). Every case checks
our output and gradients against the fp32 reference in the same run. On a
machine without CUDA it runs toy sizes (reference and, under TRITON_INTERPRET=1, Triton) and
says so.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gem_kernels import block_attention, generalized_dot_product_attention, jagged_flash_attention, pad_jagged
from gem_kernels._block import rope_tables
from gem_kernels.bench._common import (
    attention_flops,
    bench_ms,
    capture_graph,
    emit_json,
    env_info,
    lognormal_lengths,
    offsets_from_lengths,
    print_table,
    random_jagged,
    visible_pairs,
)

PEAK_TFLOPS = 803.0  # measured bf16 8192^3 matmul on the H200 (DESIGN.md section 3)
PEAK_TBS = 4.22  # measured device copy

_TORCH_ACT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
}


def _rel_err(got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    """max |got - want| / max(1e-6, max |want|) (0 for two empty/None)."""
    if got is None or want is None or want.numel() == 0:
        return 0.0
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def _grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    return torch.autograd.grad(out, inputs, dout, allow_unused=True)


def _timed(fn_fwd: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...], iters: int) -> tuple[float, float]:
    """(fwd ms, fwd+bwd ms), medians."""
    fwd = bench_ms(fn_fwd, iters=iters)  # with autograd on, as in training (one compile each)
    out = fn_fwd()
    dout = torch.randn_like(out)

    def fb() -> object:
        return torch.autograd.grad(fn_fwd(), inputs, dout, allow_unused=True)

    del out
    return fwd, bench_ms(fb, iters=iters)


def _graph_ms(fn: Callable[[], torch.Tensor], iters: int) -> float | None:
    """Forward GPU time without host overhead: median CUDA-graph replay (no autograd).

    The per-call timings include the host work of a call (checks, autograd bookkeeping,
    launch), which is the same order as the kernel for the ~0.1 ms memory-bound cases."""
    with torch.no_grad():
        replay, why = capture_graph(fn)
    if replay is None:
        if why != "no CUDA":
            print(f"(CUDA graph timing unavailable: {why})", flush=True)
        return None
    return bench_ms(replay, iters=iters)


def _padded_gdpa(act: str, scale: float, divisor: float) -> Callable[..., torch.Tensor]:
    fn = _TORCH_ACT[act]

    def f(qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(qp, kp.transpose(-1, -2)) * scale
        p = fn(s) * mask / divisor
        return torch.matmul(p.to(vp.dtype), vp)

    return f


def _padded_mask(lq: list[int], lk: list[int], lmq: int, lmk: int, causal: bool, device: str) -> torch.Tensor:
    """[B, 1, Lq, Lk] visibility over the padded batch (bottom-right aligned, as ours)."""
    tq = torch.tensor(lq, device=device)[:, None, None]
    tk = torch.tensor(lk, device=device)[:, None, None]
    i = torch.arange(lmq, device=device)[None, :, None]
    j = torch.arange(lmk, device=device)[None, None, :]
    m = (i < tq) & (j < tk)
    if causal:
        m &= j <= i + (tk - tq)
    return m[:, None]


def gdpa_case(
    name: str, lq: list[int], lk: list[int], *, act: str, causal: bool, heads: int, dim: int,
    dtype: torch.dtype, device: str, iters: int, compile_torch: bool, roofline: bool,
) -> list[dict[str, object]]:
    qo, ko = offsets_from_lengths(lq, device), offsets_from_lengths(lk, device)
    mq, mk = max(lq), max(lk)
    q = random_jagged(lq, heads, dim, dtype=dtype, device=device, seed=1).requires_grad_()
    k = random_jagged(lk, heads, dim, dtype=dtype, device=device, seed=2).requires_grad_()
    v = random_jagged(lk, heads, dim, dtype=dtype, device=device, seed=3).requires_grad_()
    cuda = device == "cuda"
    backend = "triton" if (cuda or os.environ.get("TRITON_INTERPRET") == "1") else "reference"
    divisor = float(mk)
    scale = 1.0 / math.sqrt(dim)
    pairs = visible_pairs(lq, lk, causal=causal)
    f_fwd, f_all = attention_flops(pairs, heads, dim)
    el = heads * dim * q.element_size()
    tq, tk = sum(lq), sum(lk)
    bytes_fwd = float((2 * tq + 2 * tk) * el)
    bytes_all = bytes_fwd + float((3 * tq + 4 * tk) * el)  # + read q, dO, k, v; write dq, dk, dv
    rows: list[dict[str, object]] = []

    def ours() -> torch.Tensor:
        return generalized_dot_product_attention(
            q, k, v, qo, ko, mq, mk, activation=act, causal=causal, backend=backend
        )

    # Correctness vs the fp32 reference, same run.
    out = ours()
    dout = torch.randn(out.shape, device=device, generator=torch.Generator(device=device).manual_seed(9)).to(dtype)
    g = _grads(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = generalized_dot_product_attention(
        q32, k32, v32, qo, ko, mq, mk, activation=act, causal=causal, backend="reference"
    )
    rg = _grads(ref, (q32, k32, v32), dout.float())
    errs = {"err_out": _rel_err(out, ref), **{f"err_d{n}": _rel_err(a, b) for n, a, b in zip("qkv", g, rg)}}
    del out, ref, rg, g, q32, k32, v32

    def row(method: str, ms_f: float | None, ms_a: float | None, ms_g: float | None = None, **extra: object) -> None:
        r: dict[str, object] = {"case": name, "method": method}
        r["fwd_ms"], r["fwdbwd_ms"], r["fwd_graph_ms"] = ms_f, ms_a, ms_g
        r["fwd_tflops"] = f_fwd / ms_f / 1e9 if ms_f else None
        r["fwdbwd_tflops"] = f_all / ms_a / 1e9 if ms_a else None
        r["fwd_graph_tflops"] = f_fwd / ms_g / 1e9 if ms_g else None
        if roofline and ms_g:
            r["fwd_graph_gbs"] = bytes_fwd / ms_g / 1e6
            roof_g = max(f_fwd / (PEAK_TFLOPS * 1e12), bytes_fwd / (PEAK_TBS * 1e12)) * 1e3
            r["fwd_graph_roof_pct"] = 100.0 * roof_g / ms_g
        if roofline and ms_f and ms_a:
            r["fwd_gbs"] = bytes_fwd / ms_f / 1e6
            r["fwdbwd_gbs"] = bytes_all / ms_a / 1e6
            roof_f = max(f_fwd / (PEAK_TFLOPS * 1e12), bytes_fwd / (PEAK_TBS * 1e12)) * 1e3
            roof_a = max(f_all / (PEAK_TFLOPS * 1e12), bytes_all / (PEAK_TBS * 1e12)) * 1e3
            r["fwd_roof_pct"] = 100.0 * roof_f / ms_f
            r["fwdbwd_roof_pct"] = 100.0 * roof_a / ms_a
            r["bound"] = "memory" if bytes_fwd / (PEAK_TBS * 1e12) > f_fwd / (PEAK_TFLOPS * 1e12) else "compute"
        r.update(extra)
        rows.append(r)

    ms_f, ms_a = _timed(ours, (q, k, v), iters)
    ms_g = _graph_ms(ours, iters) if cuda else None
    row("ours(triton)" if backend == "triton" else "ours(reference)", ms_f, ms_a, ms_g, **errs)

    if cuda:
        # Padded, masked PyTorch: the best plain-torch formulation (two matmuls + fused-able
        # elementwise); padding is done once outside the timed region.
        qp = pad_jagged(q.detach(), qo, mq).transpose(1, 2).contiguous().requires_grad_()
        kp = pad_jagged(k.detach(), ko, mk).transpose(1, 2).contiguous().requires_grad_()
        vp = pad_jagged(v.detach(), ko, mk).transpose(1, 2).contiguous().requires_grad_()
        mask = _padded_mask(lq, lk, mq, mk, causal, device).to(dtype)
        f = _padded_gdpa(act, scale, divisor)
        variants: list[tuple[str, Callable[..., torch.Tensor]]] = [("torch_padded_eager", f)]
        if compile_torch:
            variants.append(("torch_padded_compile", torch.compile(f, dynamic=False)))
        for label, fn in variants:
            try:
                pf, pa = _timed(lambda fn=fn: fn(qp, kp, vp, mask), (qp, kp, vp), max(3, iters // 2))  # type: ignore[misc]
                row(label, pf, pa)
            except torch.OutOfMemoryError:
                row(label, None, None, note="OOM")
            torch.cuda.empty_cache()
        del qp, kp, vp, mask
    return rows


def _block_regroup(x: torch.Tensor, lengths: list[int], bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged [T, H, D] -> [nblk, H, bs, D] zero-padded blocks + key mask [nblk, 1, 1, bs]."""
    idx, valid = [], []
    start = 0
    for n in lengths:
        for s in range(0, n, bs):
            e = min(s + bs, n)
            idx.append(list(range(start + s, start + e)) + [start + s] * (bs - (e - s)))
            valid.append([True] * (e - s) + [False] * (bs - (e - s)))
        start += n
    ii = torch.tensor(idx, device=x.device)
    vv = torch.tensor(valid, device=x.device)
    return x[ii].transpose(1, 2).contiguous(), vv[:, None, None, :]


def block_case(
    name: str, lens: list[int], *, rope: bool, heads: int, dim: int, dtype: torch.dtype, device: str,
    iters: int, bs: int = 64,
) -> list[dict[str, object]]:
    off = offsets_from_lengths(lens, device)
    ml = max(lens)
    q, k, v = (random_jagged(lens, heads, dim, dtype=dtype, device=device, seed=s).requires_grad_() for s in (4, 5, 6))
    tables = rope_tables(ml, dim, device=device) if rope else None
    cuda = device == "cuda"
    backend = "triton" if (cuda or os.environ.get("TRITON_INTERPRET") == "1") else "reference"
    t = sum(lens)
    unit = float(t * heads * dim * q.element_size())
    bytes_fwd, bytes_all = 4 * unit, 11 * unit
    rows: list[dict[str, object]] = []

    def ours() -> torch.Tensor:
        return block_attention(q, k, v, off, ml, block_size=bs, rope=tables, backend=backend)

    out = ours()
    dout = torch.randn(out.shape, device=device, generator=torch.Generator(device=device).manual_seed(9)).to(dtype)
    g = _grads(out, (q, k, v), dout)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = block_attention(q32, k32, v32, off, ml, block_size=bs, rope=tables, backend="reference")
    rg = _grads(ref, (q32, k32, v32), dout.float())
    errs = {"err_out": _rel_err(out, ref), **{f"err_d{n}": _rel_err(a, b) for n, a, b in zip("qkv", g, rg)}}
    del out, ref, rg, g, q32, k32, v32

    def row(method: str, ms_f: float | None, ms_a: float | None, ms_g: float | None = None, **extra: object) -> None:
        r: dict[str, object] = {"case": name, "method": method, "fwd_ms": ms_f, "fwdbwd_ms": ms_a}
        r["fwd_gbs"] = bytes_fwd / ms_f / 1e6 if ms_f else None
        r["fwdbwd_gbs"] = bytes_all / ms_a / 1e6 if ms_a else None
        r["fwd_roof_pct"] = 100.0 * bytes_fwd / (PEAK_TBS * 1e12) * 1e3 / ms_f if ms_f else None
        r["fwdbwd_roof_pct"] = 100.0 * bytes_all / (PEAK_TBS * 1e12) * 1e3 / ms_a if ms_a else None
        r["fwd_graph_ms"] = ms_g
        r["fwd_graph_gbs"] = bytes_fwd / ms_g / 1e6 if ms_g else None
        r["fwd_graph_roof_pct"] = 100.0 * bytes_fwd / (PEAK_TBS * 1e12) * 1e3 / ms_g if ms_g else None
        r.update(extra)
        rows.append(r)

    ms_f, ms_a = _timed(ours, (q, k, v), iters)
    ms_g = _graph_ms(ours, iters) if cuda else None
    row("ours(triton)" if backend == "triton" else "ours(reference)", ms_f, ms_a, ms_g, **errs)
    if not cuda:
        return rows
    if rope:  # baselines have no fused rope; they are timed on the rope-free case only
        return rows
    # SDPA, padded batch, block-diagonal mask (keys of the same 64-block and sample).
    qp, kp, vp = (pad_jagged(x.detach(), off, ml).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    pos = torch.arange(ml, device=device)
    lt = torch.tensor(lens, device=device)
    blkmask = (pos[:, None] // bs == pos[None, :] // bs)[None, None] & (pos[None, None, None, :] < lt[:, None, None, None])
    try:
        pf, pa = _timed(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=blkmask), (qp, kp, vp), max(3, iters // 2))
        row("sdpa_padded_blockdiag_mask", pf, pa)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        row("sdpa_padded_blockdiag_mask", None, None, note=type(e).__name__)
    del qp, kp, vp, blkmask
    # SDPA on the batch regrouped into blocks (regroup not timed).
    qb, kmask = _block_regroup(q.detach(), lens, bs)
    kb, _ = _block_regroup(k.detach(), lens, bs)
    vb, _ = _block_regroup(v.detach(), lens, bs)
    qb, kb, vb = (x.requires_grad_() for x in (qb, kb, vb))
    try:
        def sdpa_blocks() -> torch.Tensor:
            return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=kmask)

        pf, pa = _timed(sdpa_blocks, (qb, kb, vb), iters)
        row("sdpa_regrouped_blocks", pf, pa, _graph_ms(sdpa_blocks, iters), note="regroup not timed")
    except RuntimeError as e:
        row("sdpa_regrouped_blocks", None, None, note=type(e).__name__)
    del qb, kb, vb
    # JFA with a window of the same size (a band |i - j| < 64, not identical work).
    try:
        def jfa() -> torch.Tensor:
            return jagged_flash_attention(q, k, v, off, off, ml, ml, window=bs, backend="triton")

        jf, ja = _timed(jfa, (q, k, v), iters)
        row("jfa_window64", jf, ja, _graph_ms(jfa, iters), note="band, not blocks")
    except Exception as e:  # noqa: BLE001 - the JFA kernel may be absent in this checkout
        row("jfa_window64", None, None, note=f"unavailable: {type(e).__name__}")
    return rows


def sweep(hist: list[int], heads: int, dim: int, dtype: torch.dtype) -> None:
    """Tile sweep on the SiLU causal self-attention case (prints one line per config)."""
    from gem_kernels._gdpa import GdpaTiles, force_tiles

    device = "cuda"
    off = offsets_from_lengths(hist, device)
    ml = max(hist)
    q, k, v = (random_jagged(hist, heads, dim, dtype=dtype, device=device, seed=s).requires_grad_() for s in (1, 2, 3))
    f_fwd, f_all = attention_flops(visible_pairs(hist, hist, causal=True), heads, dim)

    def run() -> torch.Tensor:
        return generalized_dot_product_attention(q, k, v, off, off, ml, ml, activation="silu", causal=True)

    fwd_cfgs = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 2)]
    for bm, bn, w, st in fwd_cfgs:
        try:
            with force_tiles(fwd=GdpaTiles(block_m=bm, block_n=bn, num_warps=w, num_stages=st)):
                ms = bench_ms(run, iters=5)
            print(f"sweep fwd BM={bm} BN={bn} warps={w} stages={st}: {ms:.3f} ms {f_fwd / ms / 1e9:.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001 - a config may not fit (shared memory)
            print(f"sweep fwd BM={bm} BN={bn} warps={w} stages={st}: failed {type(e).__name__}", flush=True)
    bwd_cfgs = [
        ((64, 64, 8, 2), (64, 64, 8, 2)),
        ((128, 64, 8, 2), (64, 128, 8, 2)),
        ((64, 64, 4, 3), (64, 64, 4, 3)),
        ((128, 32, 4, 3), (32, 128, 4, 3)),
        ((64, 32, 4, 3), (32, 64, 4, 3)),
    ]
    for dq_c, kv_c in bwd_cfgs:
        tiles = {
            "dq": GdpaTiles(block_m=dq_c[0], block_n=dq_c[1], num_warps=dq_c[2], num_stages=dq_c[3]),
            "dkdv": GdpaTiles(block_m=kv_c[0], block_n=kv_c[1], num_warps=kv_c[2], num_stages=kv_c[3]),
        }
        try:
            with force_tiles(**tiles):
                _, ms = _timed(run, (q, k, v), 5)
            print(f"sweep bwd dq={dq_c} dkdv={kv_c}: fwd+bwd {ms:.3f} ms {f_all / ms / 1e9:.1f} TFLOP/s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"sweep bwd dq={dq_c} dkdv={kv_c}: failed {type(e).__name__}", flush=True)


def short_kv(iters: int) -> list[dict[str, object]]:
    """The trainer's GDPA FFN shape (its token budget of log-normal lengths, H=8, D=128, bf16,
    32 keys per sample, SiLU): the short-kv kernels' tiles swept (q tiles per program, rows
    per tile, warps; one q tile per program is how the kernels ran up to gem-kernels 0.2.1),
    next to the default tiles, in one run. GB/s counts q, k, v read and out written (forward;
    + q, dO, k, v read and dq, dk, dv written for fwd+bwd)."""
    from gem_kernels._gdpa import GdpaTiles, force_tiles
    from gem_kernels.bench._common import trainer_lengths

    lq = trainer_lengths()
    lk = [32] * len(lq)
    qo, ko = offsets_from_lengths(lq, "cuda"), offsets_from_lengths(lk, "cuda")
    q, k, v = (random_jagged(n, 8, 128, dtype=torch.bfloat16, device="cuda", seed=s).requires_grad_()
               for n, s in ((lq, 1), (lk, 2), (lk, 3)))
    el = 8 * 128 * 2
    tq, tk = sum(lq), sum(lk)
    b_fwd, b_all = (2 * tq + 2 * tk) * el, (2 * tq + 2 * tk) * el + (3 * tq + 4 * tk) * el

    def run() -> torch.Tensor:
        return generalized_dot_product_attention(q, k, v, qo, ko, max(lq), 32, activation="silu")

    ref = run()
    dout = torch.randn_like(ref)
    want = (ref.detach(), *_grads(ref, (q, k, v), dout))
    rows: list[dict[str, object]] = []
    cfgs: list[tuple[str, dict[str, GdpaTiles]]] = [("default tiles", {})]
    cfgs += [(f"BM={bm} q_tiles={qt} w={w}", {kind: GdpaTiles(block_m=bm, block_n=32, num_warps=w, num_stages=2,
                                                             q_tiles=qt) for kind in ("fwd", "dq")})
             for bm in (64, 128) for qt in (1, 2, 4, 8, 16) for w in (4, 8)]
    for name, tiles in cfgs:
        with force_tiles(**tiles):
            out = run()
            got = (out.detach(), *_grads(out, (q, k, v), dout))
            err = max(_rel_err(a, b) for a, b in zip(got, want))
            ms_f, ms_a = _timed(run, (q, k, v), iters)
        r = {"config": name, "fwd_ms": round(ms_f, 3), "fwdbwd_ms": round(ms_a, 3),
             "fwd_gbs": round(b_fwd / ms_f / 1e6), "fwdbwd_gbs": round(b_all / ms_a / 1e6), "err_vs_default": f"{err:.1e}"}
        print(r, flush=True)
        rows.append(r)
    print_table(rows, ["config", "fwd_ms", "fwdbwd_ms", "fwd_gbs", "fwdbwd_gbs", "err_vs_default"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--sweep", action="store_true", help="only a tile sweep of the SiLU causal case (GPU)")
    p.add_argument("--short", action="store_true",
                   help="only the trainer's short-kv shape: q tiles per program A/B (GPU)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.short:
        if not cuda:
            print("--short needs CUDA")
            return 0
        short_kv(10)
        return 0
    if args.sweep:
        if not cuda:
            print("--sweep needs CUDA")
            return 0
        sweep(lognormal_lengths(64, mean=840, cap=4500, seed=0), 4, 128, torch.bfloat16)
        return 0
    device = "cuda" if cuda else "cpu"
    if not cuda:
        print("CPU run (no CUDA): toy sizes, timings meaningless; checks correctness only.")
        hist = lognormal_lengths(4, mean=20, cap=40, seed=0)
        heads, dim, dtype, iters = 1, 32, torch.float32, 2
    else:
        hist = lognormal_lengths(64, mean=840, cap=4500, seed=0)
        heads, dim, dtype, iters = 4, 128, torch.bfloat16, (5 if args.quick else 10)
    print(f"batch: B={len(hist)} mean={sum(hist) / len(hist):.0f} max={max(hist)} H={heads} D={dim} {dtype}")
    comp = cuda and not args.no_compile
    rows: list[dict[str, object]] = []
    self_cases = [("silu", True), ("gelu", False)] if args.quick else [("silu", True), ("silu", False), ("gelu", True), ("gelu", False)]
    for act, causal in self_cases:
        name = f"gdpa_{act}_{'causal' if causal else 'full'}"
        rows += gdpa_case(name, hist, hist, act=act, causal=causal, heads=heads, dim=dim, dtype=dtype,
                          device=device, iters=iters, compile_torch=comp, roofline=False)
    for kv in (16, 64):
        rows += gdpa_case(f"gdpa_silu_cross_kv{kv}", hist, [kv] * len(hist), act="silu", causal=False, heads=heads,
                          dim=dim, dtype=dtype, device=device, iters=iters, compile_torch=comp and not args.quick,
                          roofline=True)
    for rope in (False, True):
        rows += block_case(f"block64{'_rope' if rope else ''}", hist, rope=rope, heads=heads, dim=dim, dtype=dtype,
                           device=device, iters=iters)
    print_table(
        rows,
        ["case", "method", "fwd_ms", "fwdbwd_ms", "fwd_graph_ms", "fwd_tflops", "fwdbwd_tflops", "fwd_graph_tflops",
         "fwd_gbs", "fwdbwd_gbs", "fwd_graph_gbs", "fwd_roof_pct", "fwdbwd_roof_pct", "fwd_graph_roof_pct",
         "err_out", "err_dq", "err_dk", "err_dv", "note"],
    )
    errs = [r[e] for r in rows for e in ("err_out", "err_dq", "err_dk", "err_dv") if e in r]
    worst = max((float(e) for e in errs if isinstance(e, float)), default=0.0)
    ok = worst < 3e-2
    print(f"correctness vs fp32 reference: worst relative error {worst:.2e} -> {'OK' if ok else 'FAIL'}")
    emit_json({"bench": "gdpa", "quick": args.quick, "cuda": cuda, "correct": ok, "worst_rel_err": worst,
               **env_info(), "rows": rows})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
