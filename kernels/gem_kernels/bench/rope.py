"""Bench: `rope_qkv_grad` (one Triton pass) against the torch paths, at the h200 trainer's size.

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.rope [--iters N] [--out DIR]

dq, dk, dv `[263,661, 8, 128]` bf16 (the h200 preset's tokens + CLS rows per step), fp32 rope
tables `[T, 128]` → dqkv `[T, 3, 8, 128]`. Paths: ours at several rows-per-program / warps, one head per program or all heads of its
rows per program (`, all heads`: the tables read once per row instead of once per head);
torch eager (the reference); `torch.compile` of one stack of the three slots (what inductor
made of model 0.3.4's first backward); `torch.compile` of autograd's form (the rotation's
backward into a sliced gradient plus v's select_backward: model 0.3.3). `GB/s` counts the
bytes the op must move: dq, dk, dv read and dqkv written (3.2 GB), the tables left out.
Timing: CUDA events, median. Each row checks its output against the reference.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from gem_kernels._rope import rope_qkv_grad_reference, rope_qkv_grad_triton
from gem_kernels.bench._common import bench_ms, emit_json, env_info, print_table, save_json

CONFIGS = ((8, 4), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8), (128, 8))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    c, s = cos.reshape(shape).to(x.dtype), sin.reshape(shape).to(x.dtype)
    return torch.addcmul(x * c, torch.cat((x[..., half:], x[..., :half]), dim=-1), s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--tokens", type=int, default=263_661)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--only-ours", action="store_true", help="our configs only (no torch.compile paths)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("rope bench needs CUDA")
        emit_json({"bench": "rope", "skipped": "no CUDA", **env_info()})
        return
    t, h, d = args.tokens, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    dq, dk, dv = (torch.randn(t, h, d, generator=g, device="cuda").bfloat16() for _ in range(3))
    ang = torch.randint(0, 16384, (t,), device="cuda").float()[:, None] * 10000.0 ** (
        -torch.arange(d // 2, device="cuda").float() / (d // 2))
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((-ang.sin(), ang.sin()), -1)
    want = rope_qkv_grad_reference(dq, dk, dv, cos, sin)
    moved = 2 * 3 * dq.numel() * dq.element_size()

    rows: list[dict[str, object]] = []

    def add(path: str, fn) -> None:  # type: ignore[no-untyped-def]
        ms = bench_ms(fn, warmup=3, iters=args.iters)
        err = (fn().float() - want.float()).abs().max().item()
        rows.append({"path": path, "ms": round(ms, 3), "GB/s": round(moved / ms / 1e6),
                     "max_abs_err": err})
        print(json.dumps(rows[-1]), flush=True)

    for loop in (False, True):
        for bt, w in CONFIGS:
            name = f"ours {bt} rows, {w} warps" + (", all heads" if loop else "")
            add(name, lambda bt=bt, w=w, loop=loop: rope_qkv_grad_triton(dq, dk, dv, cos, sin, bt, w, loop))
    if args.only_ours:
        rows.sort(key=lambda r: float(r["ms"]))  # type: ignore[arg-type]
        print_table(rows, ["path", "ms", "GB/s", "max_abs_err"])
        return
    stack = torch.compile(lambda a, b, c: torch.stack((_rope(a, cos, -sin), _rope(b, cos, -sin), c), dim=1))
    qkv = torch.randn(t, 3, h, d, device="cuda").bfloat16().requires_grad_()

    def autograd_form() -> torch.Tensor:
        q, k = _rope(qkv[:, :2], cos, sin).unbind(1)
        v = qkv[:, 2]
        return torch.autograd.grad((q, k, v), qkv, (dq, dk, dv))[0]
    ag = torch.compile(autograd_form)
    add("torch eager (reference)", lambda: rope_qkv_grad_reference(dq, dk, dv, cos, sin))
    add("torch.compile stack", lambda: stack(dq, dk, dv))
    add("torch.compile autograd form (model 0.3.3)", ag)
    print("\nrope_qkv_grad at the h200 trainer's size (ms, CUDA events, median):")
    print_table(rows, ["path", "ms", "GB/s", "max_abs_err"])
    payload: dict[str, object] = {"bench": "rope", **env_info(), "tokens": t, "heads": h, "dim": d, "rows": rows}
    save_json(args.out, "rope.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
