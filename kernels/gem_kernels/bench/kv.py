"""Packed kv (`jagged_flash_attention_kv`) against k, v split by `unbind`, and packed rotary
qkv (`jagged_flash_attention_qkv`) against the rotation and the attention composed: forward+backward.

    cd kernels && python3 -m gem_kernels.bench.kv [--iters 15] [--rounds 2] [--small]

What it times: `kv = x @ W` reshaped to `[T, 2, H, D]`, then attention and the backward to
x and W, as the model's pooling does; once with `k, v = kv.unbind(1)` fed to
`jagged_flash_attention` (autograd stacks dk and dv into kv's gradient) and once with `kv`
fed to `jagged_flash_attention_kv` (the backward writes them into one gradient). Cases: the
h200 trainer's self-attention batch (~262 k tokens, causal) and its pooling (32 seed queries
per sample over every history). Eager calls, CUDA events, median per round; the rounds
alternate the two paths. The qkv case is the trainer's self-attention layer: `qkv = x @ W`
`[T, 3, H, D]`, q and k rotated, attention; composed as gem-model 0.5.2 compiled it (the
rotation in one Triton pass, its backward `rope_qkv_grad` moving dq, dk, dv into a new
gradient) against the one op (the attention's backward writes the gradient's slots, q's and
k's rotated back in place). The backward is whatever this process picks (FlashAttention-4's
where flash-attn-4 imports, else torch's FlashAttention-2's, which copies either way).
`--small` runs a toy batch (on CPU under TRITON_INTERPRET=1: a check that it runs, no timing).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch

from gem_kernels import (jagged_flash_attention, jagged_flash_attention_kv, jagged_flash_attention_qkv,
                         jfa_backward_rule, rope_qkv_grad)
from gem_kernels._rope import rotate_slots
from gem_kernels.bench._common import bench_ms, emit_json, env_info, offsets_from_lengths, print_table, trainer_lengths


def _case(lengths: list[int], seeds: int | None, heads: int, dim: int, causal: bool, device: str,
          dtype: torch.dtype) -> tuple[Callable[[bool], tuple[torch.Tensor, ...]], int]:
    """fn(packed) -> (out, x.grad, w.grad) for one fwd+bwd; the tokens."""
    t, b = sum(lengths), len(lengths)
    d_model = heads * dim
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(t, d_model, generator=g) * 0.5).to(device, dtype).requires_grad_()
    w = (torch.randn(d_model, 2 * d_model, generator=g) / d_model**0.5).to(device, dtype).requires_grad_()
    kv_off = offsets_from_lengths(lengths, device)
    if seeds is None:  # self-attention: q from x too
        wq = (torch.randn(d_model, d_model, generator=g) / d_model**0.5).to(device, dtype)
        q_off, max_q = kv_off, max(lengths)
    else:
        wq = None
        q_off = torch.arange(0, (b + 1) * seeds, seeds, device=device)
        max_q = seeds
    qs = None if seeds is None else (torch.randn(b * seeds, heads, dim, generator=g) * 0.5).to(device, dtype)

    def attend(y: torch.Tensor, packed: bool) -> torch.Tensor:
        kv = y.reshape(t, 2, heads, dim)
        q = (x @ wq).reshape(t, heads, dim) if wq is not None else qs
        assert q is not None
        if packed:
            return jagged_flash_attention_kv(q, kv, q_off, kv_off, max_q, max(lengths), causal=causal)
        k, v = kv.unbind(1)
        return jagged_flash_attention(q, k, v, q_off, kv_off, max_q, max(lengths), causal=causal)

    return _step(x, w, attend, g), t


def _step(x: torch.Tensor, w: torch.Tensor, attend: Callable[[torch.Tensor, bool], torch.Tensor],
          g: torch.Generator) -> Callable[[bool], tuple[torch.Tensor, ...]]:
    """fn(packed) -> (out, x.grad, w.grad): `attend(x @ w, packed)` forward and backward from
    one fixed random upstream gradient (drawn at the first call)."""
    up: list[torch.Tensor] = []

    def run(packed: bool) -> tuple[torch.Tensor, ...]:
        x.grad = w.grad = None
        o = attend(x @ w, packed)
        if not up:
            up.append(torch.randn(o.shape, generator=g).to(o.device, o.dtype))
        o.backward(up[0])  # type: ignore[no-untyped-call]
        assert x.grad is not None and w.grad is not None
        return o.detach(), x.grad, w.grad

    return run


class _ComposedRope(torch.autograd.Function):
    """rope(q), rope(k), v from `[T, 3, H, D]`: one rotation pass forward, `rope_qkv_grad`
    backward (gem-model 0.5.2's `_jagged.rope_qkv`, as the trainer compiled it)."""

    @staticmethod
    def forward(ctx: object, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t, _, h, d = qkv.shape
        qk = rotate_slots((qkv[:, 0], qkv[:, 1]), None, cos, sin, qkv.new_empty((t, 2, h, d)), forward=True)
        ctx.tables = (cos, sin)  # type: ignore[attr-defined]
        return qk[:, 0], qk[:, 1], qkv[:, 2]

    @staticmethod
    def backward(ctx: object, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return rope_qkv_grad(dq, dk, dv, *ctx.tables), None, None  # type: ignore[attr-defined]


def _qkv_case(lengths: list[int], heads: int, dim: int, device: str,
              dtype: torch.dtype) -> tuple[Callable[[bool], tuple[torch.Tensor, ...]], int]:
    """fn(packed) -> (out, x.grad, w.grad) for one causal rotary self-attention fwd+bwd; the tokens."""
    t, d_model = sum(lengths), heads * dim
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(t, d_model, generator=g) * 0.5).to(device, dtype).requires_grad_()
    w = (torch.randn(d_model, 3 * d_model, generator=g) / d_model**0.5).to(device, dtype).requires_grad_()
    off = offsets_from_lengths(lengths, device)
    pos = torch.cat([torch.arange(n) for n in lengths]).float()
    half = dim // 2
    ang = pos[:, None] * 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)[None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(device)
    sin = torch.cat((-ang.sin(), ang.sin()), -1).to(device)

    def attend(y: torch.Tensor, packed: bool) -> torch.Tensor:
        qkv = y.reshape(t, 3, heads, dim)
        if packed:
            return jagged_flash_attention_qkv(qkv, off, max(lengths), rope=(cos, sin), causal=True)
        q, k, v = _ComposedRope.apply(qkv, cos, sin)  # type: ignore[no-untyped-call]
        return jagged_flash_attention(q, k, v, off, off, max(lengths), max(lengths), causal=True)

    return _step(x, w, attend, g), t


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="toy batch (CPU interpreter check)")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    # (name, fn(packed) -> (out, x.grad, w.grad) and the tokens), built when the case runs.
    Case = tuple[str, Callable[[], tuple[Callable[[bool], tuple[torch.Tensor, ...]], int]]]
    if a.small or not cuda:
        toy = [5, 0, 17, 9]
        cases: list[Case] = [
            ("self causal", lambda: _case(toy, None, 2, 16, True, device, dtype)),
            ("pooling", lambda: _case(toy, 4, 2, 16, False, device, dtype)),
            ("rope qkv", lambda: _qkv_case(toy, 2, 16, device, dtype)),
        ]
    else:
        lengths = trainer_lengths()
        cases = [
            ("trainer self causal", lambda: _case(lengths, None, 8, 128, True, device, dtype)),
            ("trainer pooling (32 seeds)", lambda: _case(lengths, 32, 8, 128, False, device, dtype)),
            ("trainer rope qkv (self causal)", lambda: _qkv_case(lengths, 8, 128, device, dtype)),
        ]
    rows: list[dict[str, object]] = []
    for name, build in cases:
        run, t = build()
        want, got = run(False), run(True)
        err = max(float((a_ - b_).abs().max()) / max(float(b_.abs().max()), 1e-12) for a_, b_ in zip(got, want))
        for r in range(a.rounds):
            ms = {packed: bench_ms(functools.partial(run, packed), warmup=2, iters=a.iters)
                  for packed in (r % 2 == 1, r % 2 == 0)}
            rows.append({"case": name, "tokens": t, "round": r + 1, "unpacked ms": ms[False], "packed ms": ms[True],
                         "saved ms": ms[False] - ms[True], "err": err})
    print_table(rows, ["case", "tokens", "round", "unpacked ms", "packed ms", "saved ms", "err"])
    emit_json({"bench": "kv", "env": env_info(), "backward": jfa_backward_rule(), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
