"""Bench: Jagged Flash Attention vs the best torch paths, useful TFLOP/s (issue 3).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.attention [--quick] [--sweep]
    bazel run //kernels:bench_attention -- --quick

Cases (GPU): 64 log-normal sequences (mean ~840, cap 4,500, fixed seed), H=4, D=128, bf16,
full / causal / causal+window; cross (long q, 8-64 kv); pooling (1-32 q, long kv); dense
B=8, L=4096, H=16. Methods: ours (Triton), padded SDPA with the flash and cuDNN backends,
nested-jagged SDPA (forward only). Useful FLOPs count only visible, unpadded pairs, so
padded baselines pay for their padding. Every case checks our output and gradients against
the fp32 reference in the same run. Baselines run on pre-padded tensors (padding not timed),
and windowed cases give them plain causal attention (SDPA has no window): both favour torch.
On a machine without CUDA it runs toy sizes (the reference, and Triton under
TRITON_INTERPRET=1) and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gem_kernels import jagged_flash_attention, pad_jagged
from gem_kernels._triton_jfa import JfaTiles, force_config, pick_config
from gem_kernels.bench._common import (attention_flops, bench_graph_ms, bench_ms, check_visible_pairs_small, emit_json,
                                       env_info, lognormal_lengths, offsets_from_lengths, print_table, random_jagged,
                                       rel_err, tflops, uniform_lengths, visible_pairs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    len_q: list[int]
    len_kv: list[int]
    heads: int
    dim: int
    causal: bool = False
    window: int | None = None
    dense: bool = False


def build_cases(cuda: bool, quick: bool) -> list[Case]:
    if not cuda:
        lq = lognormal_lengths(6, mean=24, cap=48, seed=0)
        return [
            Case(name="self", len_q=lq, len_kv=lq, heads=2, dim=32),
            Case(name="self_causal", len_q=lq, len_kv=lq, heads=2, dim=32, causal=True),
            Case(name="cross", len_q=lq, len_kv=uniform_lengths(6, 2, 8, seed=1), heads=2, dim=32),
        ]
    hist = lognormal_lengths(64, mean=840, cap=4500, seed=0)
    cases = [
        Case(name="self", len_q=hist, len_kv=hist, heads=4, dim=128),
        Case(name="self_causal", len_q=hist, len_kv=hist, heads=4, dim=128, causal=True),
        Case(name="self_window512", len_q=hist, len_kv=hist, heads=4, dim=128, causal=True, window=512),
        Case(name="cross", len_q=hist, len_kv=uniform_lengths(64, 8, 64, seed=1), heads=4, dim=128),
        Case(name="pooling", len_q=uniform_lengths(64, 1, 32, seed=2), len_kv=hist, heads=4, dim=128),
        Case(name="dense", len_q=[4096] * 8, len_kv=[4096] * 8, heads=16, dim=128, dense=True),
    ]
    if quick:
        cases = [c for c in cases if c.name in ("self", "cross", "pooling", "dense")]
    return cases


def run_case(case: Case, *, device: str, dtype: torch.dtype, quick: bool, triton_ok: bool) -> list[dict[str, object]]:
    cuda = device == "cuda"
    q = random_jagged(case.len_q, case.heads, case.dim, dtype=dtype, device=device, seed=1)
    k = random_jagged(case.len_kv, case.heads, case.dim, dtype=dtype, device=device, seed=2)
    v = random_jagged(case.len_kv, case.heads, case.dim, dtype=dtype, device=device, seed=3)
    dout = random_jagged(case.len_q, case.heads, case.dim, dtype=dtype, device=device, seed=4)
    qo, ko = offsets_from_lengths(case.len_q, device), offsets_from_lengths(case.len_kv, device)
    mq, mk = max(case.len_q), max(case.len_kv)
    kw = dict(causal=case.causal, window=case.window)
    pairs = visible_pairs(case.len_q, case.len_kv, causal=case.causal, window=case.window)
    f_fwd, f_all = attention_flops(pairs, case.heads, case.dim)
    # Compulsory forward traffic: read q, k, v once, write out (+ fp32 lse).
    fwd_bytes = (2 * q.numel() + k.numel() + v.numel()) * q.element_size() + q.shape[0] * case.heads * 4
    iters = 2 if not cuda else (5 if quick else 15)
    rows: list[dict[str, object]] = []

    def row(method: str, fwd_ms: float | None, all_ms: float | None, note: str = "", **extra: object) -> None:
        rows.append({
            "case": case.name, "method": method, "fwd_ms": fwd_ms, "fwd_tflops": tflops(f_fwd, fwd_ms),
            "fwdbwd_ms": all_ms, "fwdbwd_tflops": tflops(f_all, all_ms), "note": note, **extra,
        })

    # Reference (fp32, per sequence) for the correctness check of ours.
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    ref = jagged_flash_attention(q32, k32, v32, qo, ko, mq, mk, backend="reference", **kw)  # type: ignore[arg-type]
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    ref = ref.detach()

    backends = (["triton"] if triton_ok else []) + ([] if cuda else ["reference"])
    for backend in backends:
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = jagged_flash_attention(qg, kg, vg, qo, ko, mq, mk, backend=backend, **kw)  # type: ignore[arg-type]
        grads = torch.autograd.grad(out, (qg, kg, vg), dout)
        errs = [rel_err(out, ref)] + [rel_err(g, r) for g, r in zip(grads, ref_grads)]
        tol = 2e-2 if dtype != torch.float32 else 1e-4
        ok = all(e <= tol for e in errs) and all(bool(torch.isfinite(g).all()) for g in grads)

        def fwd() -> object:
            with torch.no_grad():
                return jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend=backend, **kw)  # type: ignore[arg-type]

        def fwd_bwd() -> object:
            o = jagged_flash_attention(qg, kg, vg, qo, ko, mq, mk, backend=backend, **kw)  # type: ignore[arg-type]
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        cfg = pick_config(mq, mk, case.dim, dtype)
        note = f"fwd {cfg.fwd.block_m}x{cfg.fwd.block_n}/w{cfg.fwd.num_warps}" if backend == "triton" else ""
        warm = 3 if cuda else 1
        graph_ms = bench_graph_ms(fwd, iters=iters) if backend == "triton" else None
        row(f"ours-{backend}", bench_ms(fwd, warmup=warm, iters=iters), bench_ms(fwd_bwd, warmup=warm, iters=iters), note,
            fwd_graph_ms=graph_ms, fwd_graph_tflops=tflops(f_fwd, graph_ms),
            fwd_graph_gbs=None if graph_ms is None else fwd_bytes / (graph_ms * 1e-3) / 1e9,
            correct=ok, err_out=errs[0], err_dq=errs[1], err_dk=errs[2], err_dv=errs[3])

    if cuda:
        rows.extend(_torch_baselines(case, q, k, v, dout, qo, ko, mq, mk, row_fn=row, iters=iters))
    return rows


def _torch_baselines(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
    qo: torch.Tensor, ko: torch.Tensor, mq: int, mk: int,
    *, row_fn: Callable[..., None], iters: int,
) -> list[dict[str, object]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def padded(x: torch.Tensor, off: torch.Tensor, n: int) -> torch.Tensor:
        return pad_jagged(x, off, n).transpose(1, 2).contiguous()  # [B, H, L, D]

    qp, kp, vp, dp = padded(q, qo, mq), padded(k, ko, mk), padded(v, ko, mk), padded(dout, qo, mq)
    causal = case.causal
    note = "padded" + (", causal instead of window" if case.window is not None else "")
    for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            qg, kg, vg = (t.clone().requires_grad_() for t in (qp, kp, vp))

            def fwd() -> object:
                with torch.no_grad(), sdpa_kernel(be):
                    return F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal)

            def fwd_bwd() -> object:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                return torch.autograd.grad(o, (qg, kg, vg), dp)

            f_ms = bench_ms(fwd, iters=iters)
            a_ms = bench_ms(fwd_bwd, iters=iters)
            row_fn(name, f_ms, a_ms, note if not case.dense else "dense")
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            row_fn(name, None, None, f"failed: {type(e).__name__}: {str(e)[:60]}")
        torch.cuda.empty_cache()
    del qp, kp, vp, dp
    if not case.dense and not causal:
        try:
            def nj(x: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
                return torch.nested.nested_tensor_from_jagged(x, off).transpose(1, 2)

            qn, kn, vn = nj(q, qo), nj(k, ko), nj(v, ko)

            def fwd_nested() -> object:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(qn, kn, vn)

            row_fn("sdpa-nested", bench_ms(fwd_nested, iters=iters), None, "nested jagged, fwd only")
        except Exception as e:  # noqa: BLE001
            row_fn("sdpa-nested", None, None, f"failed: {type(e).__name__}: {str(e)[:60]}")
    return []


SWEEP_FWD = [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
SWEEP_BWD = [  # (dkdv bm, bn, warps, stages), (dq bm, bn, warps, stages)
    ((32, 64, 4, 3), (64, 32, 4, 3)),
    ((32, 64, 4, 4), (64, 32, 4, 4)),
    ((64, 64, 4, 3), (64, 64, 4, 3)),
    ((32, 128, 4, 3), (128, 32, 4, 3)),
    ((32, 64, 8, 3), (64, 32, 8, 3)),
    ((64, 64, 8, 3), (64, 64, 8, 3)),
]


def _log(rows: list[dict[str, object]], r: dict[str, object]) -> None:
    rows.append(r)
    print("sweep:", r, flush=True)


def sweep(case: Case, dtype: torch.dtype, device: str = "cuda") -> list[dict[str, object]]:
    """Tile sweep on one case (GPU): forward configs, then backward configs."""
    q = random_jagged(case.len_q, case.heads, case.dim, dtype=dtype, device=device, seed=1)
    k = random_jagged(case.len_kv, case.heads, case.dim, dtype=dtype, device=device, seed=2)
    v = random_jagged(case.len_kv, case.heads, case.dim, dtype=dtype, device=device, seed=3)
    dout = random_jagged(case.len_q, case.heads, case.dim, dtype=dtype, device=device, seed=4)
    qo, ko = offsets_from_lengths(case.len_q, device), offsets_from_lengths(case.len_kv, device)
    mq, mk = max(case.len_q), max(case.len_kv)
    kw = dict(causal=case.causal, window=case.window)
    pairs = visible_pairs(case.len_q, case.len_kv, causal=case.causal, window=case.window)
    f_fwd, f_all = attention_flops(pairs, case.heads, case.dim)
    base = pick_config(mq, mk, case.dim, dtype)
    ref = jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
    rows: list[dict[str, object]] = []
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    for fw in SWEEP_FWD:
        cfg = dataclasses.replace(base, fwd=JfaTiles(block_m=fw[0], block_n=fw[1], num_warps=fw[2], num_stages=fw[3]))
        try:
            with force_config(cfg):
                out = jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
                err = rel_err(out, ref.float())
                ms = bench_ms(lambda: jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend="triton", **kw), iters=10)  # type: ignore[arg-type]
            _log(rows, {"case": case.name, "kernel": "fwd", "tiles": str(fw), "ms": ms,
                         "tflops": f_fwd / (ms * 1e-3) / 1e12, "err_vs_default": err})
        except Exception as e:  # noqa: BLE001
            _log(rows, {"case": case.name, "kernel": "fwd", "tiles": str(fw), "note": f"failed: {type(e).__name__}"})
    # Launch schedule: tile list (default where lengths are long-tailed) vs the plain grid.
    for tile_list in (True, False):
        cfg = dataclasses.replace(base, tile_list=tile_list)

        def fb_sched() -> object:
            o = jagged_flash_attention(qg, kg, vg, qo, ko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        try:
            with force_config(cfg):
                out = jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
                err = rel_err(out, ref.float())
                ms = bench_ms(lambda: jagged_flash_attention(q, k, v, qo, ko, mq, mk, backend="triton", **kw), iters=10)  # type: ignore[arg-type]
                ms_all = bench_ms(fb_sched, iters=10)
            _log(rows, {"case": case.name, "kernel": "fwd", "tiles": f"default, tile_list={tile_list}", "ms": ms,
                         "tflops": f_fwd / (ms * 1e-3) / 1e12, "err_vs_default": err})
            _log(rows, {"case": case.name, "kernel": "fwd+bwd", "tiles": f"default, tile_list={tile_list}", "ms": ms_all,
                         "tflops": f_all / (ms_all * 1e-3) / 1e12})
        except Exception as e:  # noqa: BLE001
            _log(rows, {"case": case.name, "kernel": "sched", "tiles": f"tile_list={tile_list}", "note": f"failed: {type(e).__name__}"})
    for dkdv, dq in SWEEP_BWD if case.name == "self" else []:
        cfg = dataclasses.replace(base, dkdv=JfaTiles(block_m=dkdv[0], block_n=dkdv[1], num_warps=dkdv[2], num_stages=dkdv[3]),
                                  dq=JfaTiles(block_m=dq[0], block_n=dq[1], num_warps=dq[2], num_stages=dq[3]))

        def fb() -> object:
            o = jagged_flash_attention(qg, kg, vg, qo, ko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        try:
            with force_config(cfg):
                ms = bench_ms(fb, iters=10)
            _log(rows, {"case": case.name, "kernel": "fwd+bwd", "tiles": f"{dkdv}|{dq}", "ms": ms,
                         "tflops": f_all / (ms * 1e-3) / 1e12})
        except Exception as e:  # noqa: BLE001
            _log(rows, {"case": case.name, "kernel": "fwd+bwd", "tiles": f"{dkdv}|{dq}", "note": f"failed: {type(e).__name__}"})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    p.add_argument("--sweep", action="store_true", help="also sweep tile configs on the self case (GPU)")
    p.add_argument("--cases", default="", help="comma-separated subset of case names")
    args = p.parse_args(argv)
    check_visible_pairs_small()
    cuda = torch.cuda.is_available()
    import os

    triton_ok = cuda or os.environ.get("TRITON_INTERPRET") == "1"
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    env = env_info()
    if not cuda:
        print(f"CPU run (no CUDA): toy sizes, fp32; Triton {'via interpreter' if triton_ok else 'skipped (set TRITON_INTERPRET=1)'}."
              " Figures are not performance claims.")
    print("env:", env)
    cases = build_cases(cuda, args.quick)
    if args.cases:
        keep = set(args.cases.split(","))
        cases = [c for c in cases if c.name in keep]
    rows: list[dict[str, object]] = []
    for case in cases:
        print(f"case {case.name}: B={len(case.len_q)} H={case.heads} D={case.dim} "
              f"q mean {sum(case.len_q) / len(case.len_q):.0f} max {max(case.len_q)}, "
              f"kv mean {sum(case.len_kv) / len(case.len_kv):.0f} max {max(case.len_kv)}, "
              f"causal={case.causal} window={case.window}", flush=True)
        rows.extend(run_case(case, device=device, dtype=dtype, quick=args.quick, triton_ok=triton_ok))
        if cuda:
            torch.cuda.empty_cache()
    cols = ["case", "method", "fwd_ms", "fwd_tflops", "fwdbwd_ms", "fwdbwd_tflops", "fwd_graph_ms",
            "fwd_graph_tflops", "fwd_graph_gbs", "correct",
            "err_out", "err_dq", "err_dk", "err_dv", "note"]
    print()
    print_table(rows, cols)
    sweep_rows: list[dict[str, object]] = []
    if args.sweep and cuda:
        for case in cases:
            if case.name == "self":
                sweep_rows.extend(sweep(case, dtype))
        print()
        print_table(sweep_rows, ["case", "kernel", "tiles", "ms", "tflops", "err_vs_default", "note"])
    correct = all(bool(r["correct"]) for r in rows if "correct" in r)
    summary = {
        f"{r['case']}/{r['method']}": {k: r.get(k) for k in ("fwd_tflops", "fwdbwd_tflops", "fwd_graph_tflops", "fwd_graph_gbs")}
        for r in rows
    }
    emit_json({"bench": "attention", "device": "cuda" if cuda else "cpu", **env, "all_correct": correct,
               "useful_tflops": summary, "sweep": sweep_rows})
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
