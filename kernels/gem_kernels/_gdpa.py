"""Generalized Dot-Product Attention (GDPA): `out_i = sum_j act(scale q_i.k_j) v_j / divisor`.

Why this op exists: HSTU and Kunlun replace softmax by an elementwise activation (SiLU in
HSTU) and divide by a fixed `divisor` (the max kv length) instead of a row sum. Without the
row normalisation there is no online-softmax rescale in the forward and no `rowsum(dO * O)`
correction in the backward, which is where it beats flash attention. Kunlun also rewrites its
personalized FFN as GDPA cross-attention: long jagged queries over a short (4-64 token)
per-sample key/value set, so the kernel keeps the whole kv of a sample in one tile there.

Visibility (causal / window / cross) is exactly `jagged_flash_attention`'s
(`_jagged.visible_mask`). `activation="softmax"` *is* `jagged_flash_attention` (divisor
ignored).

Adding an activation is one small change in two adjacent places:
1. one entry in `ACTIVATIONS` below: the value and the derivative in plain PyTorch (the
   reference and the tests use them);
2. one branch with the same name in `_triton_gdpa._act` and `_triton_gdpa._act_and_grad`.
The tests iterate over `ACTIVATIONS`, so a new entry is tested against the reference at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gem_kernels._jagged import (check_attention, check_row_offsets, check_triton_device, pad_jagged, resolve_backend,
                                 unpad_jagged, visible_mask)
from gem_kernels._jfa_reference import padded_mask, run_reference
from gem_kernels import _attn_plan
from gem_kernels._launch import CachedLaunch, cdiv, launch_of

_BACKENDS = ("auto", "triton", "reference")
# Tests set this to force the two-kernel dK/dV path for short kv too (both paths are tested).
_FORCE_SPLIT_BWD = False
TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)

_Fn = Callable[[torch.Tensor], torch.Tensor]
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + _GELU_A * x**3)))


def _dgelu(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(_GELU_C * (x + _GELU_A * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_A * x * x)


def _dsilu(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Activation:
    """An elementwise GDPA activation: value and derivative (fp32 in, fp32 out)."""

    fn: _Fn
    grad: _Fn


# The one table of elementwise activations (see the module docstring to add one).
ACTIVATIONS: dict[str, Activation] = {
    "silu": Activation(fn=lambda x: x * torch.sigmoid(x), grad=_dsilu),
    "gelu": Activation(fn=_gelu, grad=_dgelu),  # tanh approximation
    "relu": Activation(fn=torch.relu, grad=lambda x: (x > 0).to(x.dtype)),
    "relu2": Activation(fn=lambda x: torch.relu(x) ** 2, grad=lambda x: 2.0 * torch.relu(x)),
    "sigmoid": Activation(fn=torch.sigmoid, grad=lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
    "identity": Activation(fn=lambda x: x, grad=torch.ones_like),
}
ACTIVATION_NAMES = ("softmax", *ACTIVATIONS)


class _ActFn(torch.autograd.Function):
    """Applies a table activation with the table's derivative, so the reference's backward
    uses exactly the documented derivative (and a test can check it against autograd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.name = name
        return ACTIVATIONS[name].fn(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return g * ACTIVATIONS[ctx.name].grad(x), None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GdpaTiles:
    """Tile shape of the Triton GDPA kernels (rows of q x rows of kv per program step)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    # Sigmoid (SiLU, GELU, sigmoid) through one `tanh.approx.f32` instead of exp2 + reciprocal
    # for 16-bit inputs on the GPU (_triton_gdpa._sigmoid); off for fp32 and the interpreter.
    tanh_sigmoid: bool = True
    # Short kv only (the whole kv of a sample in one tile): consecutive q tiles of one sample
    # per program (_triton_gdpa._gdpa_fwd_short_kernel / _gdpa_bwd_short_kernel).
    q_tiles: int = 1
    # Long kv only: the order programs take tiles in (JFA's, `_triton_jfa._schedule`).
    # "in_order" (the default): grid (real tiles, heads), every sample's tiles first to last,
    # samples in batch order: the programs running together read one sample's keys (L2 hits).
    # "list": only the real tiles, heaviest first (samples by the other side's length, each
    # sample's tiles last to first; a few torch ops per call); "grid": (B·H, the longest
    # sample's tiles reversed), programs past a sample's end exit; "auto": "list" when the
    # grid would be mostly empty programs, else "grid" (JFA's rule); "in_order_rev": batch
    # order with the q-side kernels (forward, dQ) walking each sample's tiles last to first
    # (causal: the heavy ones first). Every order gives bitwise the same result. On the H200
    # (issue 15's batch, SiLU causal, 7 interleaved rounds, kernels/BENCHMARKS.md 2026-12-04)
    # in_order 216 / 217 useful TFLOP/s fwd / fwd+bwd, in_order_rev 201 / 221, grid 218 / 220
    # (equal within the spread); list (and auto, which picks it there) 25-35 % slower.
    schedule: str = "in_order"
    # Long kv, the "dkdv" tiles only: the one-pass backward. The dK/dV kernel also adds dQ
    # into an fp32 workspace with atomics and no dQ kernel runs: S and act'(S) are computed
    # once per tile pair instead of twice (5 matmuls instead of 7, half the special-function
    # work). The atomic sums make dQ's last bits order-dependent, so never under torch's
    # deterministic algorithms. Read from forced tiles only (`force_tiles`); otherwise
    # `GEM_GDPA_BWD=one_pass|two_pass` decides, else ONE_PASS_DEFAULT.
    one_pass: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"GdpaTiles.schedule must be one of {SCHEDULES}, got {self.schedule!r}")


SCHEDULES = ("auto", "list", "grid", "in_order", "in_order_rev")


_TILE_OVERRIDE: dict[str, GdpaTiles] = {}


@contextlib.contextmanager
def force_tiles(**tiles: GdpaTiles) -> Iterator[None]:
    """Overrides the heuristic tiles inside the block (keys "fwd", "dq", "dkdv"); for sweeps."""
    old = dict(_TILE_OVERRIDE)
    _TILE_OVERRIDE.update(tiles)
    try:
        yield
    finally:
        _TILE_OVERRIDE.clear()
        _TILE_OVERRIDE.update(old)


BWD_ENV = "GEM_GDPA_BWD"
_BWD_CHOICES = {"one_pass": True, "two_pass": False}
# The heuristic's long-kv backward: two-pass until the one-pass one is measured faster on the
# GPU (kernels/BENCHMARKS.md).
ONE_PASS_DEFAULT = False


def _one_pass(t: GdpaTiles, forced: bool) -> bool:
    """Whether the long-kv backward is one-pass: never under torch's deterministic algorithms;
    forced tiles as they say; else `GEM_GDPA_BWD`, else ONE_PASS_DEFAULT."""
    from gem_kernels._triton_jfa import env_choice

    if torch.are_deterministic_algorithms_enabled():
        return False
    if forced:
        return t.one_pass
    value = env_choice(BWD_ENV, tuple(_BWD_CHOICES))
    return ONE_PASS_DEFAULT if value is None else _BWD_CHOICES[value]


def gdpa_tiles(max_kv_len: int, head_dim: int, *, kind: str = "fwd") -> GdpaTiles:
    """Tiles for one kernel ("fwd", "dq" or "dkdv") of one call.

    Short kv (<= 64, the cross-attention / personalized-FFN shape): the whole kv of a sample
    in one tile (block_n = next pow2 >= 16), the grid over q tiles, and dK/dV fused into the
    dQ kernel (see `gdpa_backward_triton`).
    """
    if kind in _TILE_OVERRIDE:
        return _TILE_OVERRIDE[kind]
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return GdpaTiles(block_m=16, block_n=16, num_warps=4, num_stages=1, q_tiles=2)
    if max_kv_len <= 64:
        # 8 q tiles per program: forward 64-row tiles, 4 warps; backward 128-row, 8 warps. On
        # the trainer's shape (H=8, D=128, 32 keys per sample, H200) 0.38 ms forward and ~0.84 ms
        # backward against 0.60 / 1.22 ms with one q tile per program (`bench.gdpa --short`,
        # kernels/BENCHMARKS.md, 2026-12-01).
        bn = max(16, 1 << max(0, (max_kv_len - 1).bit_length()))
        if kind == "fwd":
            return GdpaTiles(block_m=64, block_n=bn, num_warps=4, num_stages=2, q_tiles=8)
        return GdpaTiles(block_m=128, block_n=bn, num_warps=8, num_stages=2, q_tiles=8)
    big = head_dim > 64
    if kind == "fwd":
        return GdpaTiles(block_m=128, block_n=64 if big else 128, num_warps=8 if big else 4, num_stages=3)
    # Backward, D > 64: the narrow tiles (dQ 64x32, dK/dV 32x64, 4 warps, 3 stages): 1.52 ms vs
    # 2.36 ms fwd+bwd on the issue-15 batch (225 vs 145 TFLOP/s, H200, 2026-11-30). They once
    # hit an illegal memory access (test_gpu_real_sizes[full-gelu], 2026-11-29); the
    # bounds-checked interpreter run finds every index in bounds and the real-size GPU tests
    # (tests/test_gdpa_narrow_tiles.py, full/causal x silu/gelu) passed on 2026-11-30.
    if big:
        if kind == "dq":
            return GdpaTiles(block_m=64, block_n=32, num_warps=4, num_stages=3)
        return GdpaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3)
    return GdpaTiles(block_m=64, block_n=128, num_warps=4, num_stages=2)


def gdpa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """Plain-PyTorch GDPA for an elementwise activation (the specification).

    One sample at a time, fp32 math; reads the offsets on the host (one sync).
    Shapes: q `[Tq, H, D]`, k/v `[Tkv, H, D]`, offsets int64 `[B+1]` -> `[Tq, H, D]`.
    """
    qo = q_offsets.tolist()
    ko = kv_offsets.tolist()
    outs: list[torch.Tensor] = []
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].float().transpose(0, 1)  # [H, Lq, D]
        kb = k[ko[b] : ko[b + 1]].float().transpose(0, 1)
        vb = v[ko[b] : ko[b + 1]].float().transpose(0, 1)
        lq, lk = qb.shape[1], kb.shape[1]
        if lq == 0:
            continue
        mask = visible_mask(lq, lk, causal=causal, window=window, device=q.device)
        s = torch.matmul(qb, kb.transpose(1, 2)) * scale
        p = _ActFn.apply(s, activation) * mask / divisor  # type: ignore[no-untyped-call]
        outs.append(torch.matmul(p, vb).transpose(0, 1).to(q.dtype))
    if not outs:  # no queries at all: an empty [0, H, D] result, still part of q's graph
        return q * 0.0
    return torch.cat(outs, dim=0)


def gdpa_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """Batched GDPA on padded tensors (what `backend="reference"` runs); same contract as
    `gdpa_reference`, which the tests hold it to."""
    qp = pad_jagged(q, q_offsets, max_q_len).float().transpose(1, 2)  # [B, H, Lq, D]
    kp = pad_jagged(k, kv_offsets, max_kv_len).float().transpose(1, 2)
    vp = pad_jagged(v, kv_offsets, max_kv_len).float().transpose(1, 2)
    mask = padded_mask(q_offsets, kv_offsets, max_q_len, max_kv_len, causal=causal, window=window)
    s = torch.matmul(qp, kp.transpose(-1, -2)) * scale
    p = _ActFn.apply(s, activation) * mask / divisor  # type: ignore[no-untyped-call]
    out = torch.matmul(p, vp).transpose(1, 2)  # [B, Lq, H, D]
    return unpad_jagged(out, q_offsets, total=q.shape[0]).to(q.dtype)


def generalized_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    activation: str = "silu",
    scale: float | None = None,
    divisor: float | None = None,
    causal: bool = False,
    window: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """GDPA on jagged sequences: `out_i = sum_j act(scale q_i.k_j) v_j / divisor`.

    The sum runs over the keys j of the same sample that query i sees (the visibility rule of
    `jagged_flash_attention`: `causal`, `window`, bottom-right aligned for unequal lengths).

    Args:
        q: `[Tq, H, D]` jagged queries (bf16, fp16 or fp32).
        k: `[Tkv, H, D]` jagged keys.
        v: `[Tkv, H, D]` jagged values.
        q_offsets: int64 `[B+1]` offsets into q.
        kv_offsets: int64 `[B+1]` offsets into k/v (self-attention: pass q_offsets again).
        max_q_len: host int >= every query length.
        max_kv_len: host int >= every key length.
        activation: one of `ACTIVATION_NAMES`: "softmax" (= `jagged_flash_attention`,
            divisor ignored), "silu", "gelu" (tanh approximation), "relu", "relu2" (squared
            ReLU), "sigmoid", "identity".
        scale: score scale, default 1/sqrt(D).
        divisor: host float > 0 dividing the sum; default `max(max_kv_len, 1)` (HSTU/Kunlun).
        causal: query i sees keys j <= i + (len_kv - len_q).
        window: sliding window w (see `jagged_flash_attention`).
        backend: "triton", "reference" (plain PyTorch) or "auto" (Triton on CUDA).

    Returns:
        `[Tq, H, D]` in q's dtype. Queries that see no key output 0, never NaN.

    Note:
        With short kv (`max_kv_len` within one kv tile, <= 64 on the GPU) the Triton backward
        sums dK/dV over query tiles with fp32 atomics: equal up to rounding, not bitwise
        reproducible run to run.
    """
    if not isinstance(activation, str) or activation not in ACTIVATION_NAMES:
        raise ValueError(f"activation={activation!r} must be one of {ACTIVATION_NAMES}")
    if activation == "softmax":
        from gem_kernels._jfa import jagged_flash_attention

        return jagged_flash_attention(
            q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len,
            causal=causal, window=window, scale=scale, backend=backend,
        )
    # An eager call with a signature already checked takes its plan (`gem_kernels._attn_plan`).
    key, served = (None, None) if torch.compiler.is_compiling() else _planned(
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation, scale, divisor, causal, window, backend)
    if served is not None:
        return served
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {_BACKENDS}")
    device = check_attention(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be a finite host float")
    if divisor is None:
        divisor = float(max(max_kv_len, 1))
    elif isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or not (
        math.isfinite(divisor) and divisor > 0
    ):
        raise ValueError(f"divisor={divisor!r} must be a finite host float > 0")
    backend = resolve_backend(backend, device)
    if backend == "reference":
        if torch.compiler.is_compiling():
            # Traced: the padded batch (sync-free); the CPU buckets read the offsets on the host.
            return gdpa_padded(q, k, v, q_offsets, kv_offsets, max_q_len, max(max_kv_len, 1),
                               activation=activation, scale=float(scale), divisor=float(divisor),
                               causal=bool(causal), window=window)
        return run_reference(gdpa_padded, gdpa_reference, q, k, v, q_offsets, kv_offsets, max_q_len,
                             max_kv_len, activation=activation, scale=float(scale),
                             divisor=float(divisor), causal=bool(causal), window=window)
    if q.shape[2] not in TRITON_HEAD_DIMS:
        raise ValueError(
            f"q.shape[2]={q.shape[2]} (head dim D) must be one of {TRITON_HEAD_DIMS} for backend='triton'"
        )
    check_triton_device(device)
    args = (q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation,
            float(scale), float(divisor), bool(causal), window)
    if torch.compiler.is_compiling():
        out: torch.Tensor = torch.ops.gem_kernels.gdpa_fwd(*args)
        return out
    # Eager: a plain autograd.Function over the same launchers. The custom op's Python
    # dispatch + autograd wrapper costs ~0.1-0.3 ms of host time per call, as much as the
    # kernel itself on a whole jagged batch (measured on the H200, see BENCHMARKS.md). Where no
    # gradient is wanted, the launcher alone (the Function's apply costs ~10-15 us of host time).
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out = _GdpaFunction.apply(None, None, *args)  # type: ignore[no-untyped-call]
    else:
        out = gdpa_forward_triton(*args)
    _remember(key, *args)
    return out


class _GdpaFunction(torch.autograd.Function):
    """Eager autograd over the launchers; `plan, ptrs` (or None, None): the forward through a
    plan (`_planned`)."""

    @staticmethod
    def forward(ctx: Any, plan: _attn_plan.Plan | None, ptrs: tuple[int, ...] | None, *args: Any) -> torch.Tensor:
        q, k, v, q_offsets, kv_offsets, *meta = args
        ctx.save_for_backward(q, k, v, q_offsets, kv_offsets)
        ctx.meta = tuple(meta)
        planned = plan is not None and ptrs is not None
        ctx.plan = plan if planned else None
        if planned:
            return _plan_forward(plan, ptrs, *args)  # type: ignore[arg-type]
        return gdpa_forward_triton(*args)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, q_offsets, kv_offsets = ctx.saved_tensors
        plan = ctx.plan
        got = None if plan is None else _plan_backward(plan, dout, q, k, v, q_offsets, kv_offsets, *ctx.meta)
        if got is None:
            got = gdpa_backward_triton(dout, q, k, v, q_offsets, kv_offsets, *ctx.meta)
            if plan is not None:
                _remember_backward(plan, dout, q, k, v, q_offsets, kv_offsets, *ctx.meta)
        return (None, None, *got) + (None,) * 9


# --- the eager fast path: one plan per call signature (gem_kernels._attn_plan) ------------------
#
# Kept for the long-kv forward (`max_kv_len` past one kv tile) in its default batch-order
# schedule, where the first call passed q, k, v and the offsets contiguous and 16-byte aligned
# (the kernel then reads the caller's tensors). Per call the plan re-applies what its signature
# leaves out: `max_kv_len` still past one tile, no `force_tiles`, and `_attn_plan.admits`.
#
# The backward of a planned call has a plan of its own (`_BwdPlan`), kept in the forward's by
# the first such backward that ran the two-kernel (dQ, then dK/dV) backward in batch order: the
# binaries it launched, their stride arguments and tiles. Per call it re-applies what the
# forward's signature leaves out: no `force_tiles`, the two-pass rule (`_one_pass`: torch's
# deterministic switch, GEM_GDPA_BWD), `max_kv_len` past the short-kv bound, and dO in q's
# dtype, shape and (contiguous) strides, 16-byte aligned. Anything else takes
# `gdpa_backward_triton`.

_PLANS: dict[tuple[Any, ...], _attn_plan.Plan] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class _BwdPlan:
    dq: _attn_plan.Plan  # the dQ kernel's kept binary; its `ints` are the kernel's stride arguments
    dkdv: _attn_plan.Plan  # the dK/dV kernel's
    dq_block_m: int
    dkdv_block_n: int
    short_kv: int  # max_kv_len at or below this takes the short-kv kernel instead
    t_kv: GdpaTiles  # the dK/dV tiles (for `_one_pass`)


@dataclasses.dataclass(frozen=True, slots=True)
class _PlanOp:
    block_m: int
    block_n: int  # the plan serves max_kv_len > block_n (the long-kv kernel)
    scale: float  # the default, 1/sqrt(D)
    # The backward's plan, once kept (`_remember_backward`): a one-slot list, this record being frozen.
    bwd: list[_BwdPlan] = dataclasses.field(default_factory=list, compare=False)


def _signature(q: Any, k: Any, v: Any, q_offsets: Any, kv_offsets: Any, max_q_len: Any, max_kv_len: Any,
               activation: Any, scale: Any, divisor: Any, causal: Any, window: Any,
               backend: Any) -> tuple[Any, ...] | None:
    return _attn_plan.signature(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, (
        activation, backend, scale.__class__, scale, divisor.__class__, divisor, causal.__class__, causal,
        window.__class__, window))


def _planned(
    q: Any, k: Any, v: Any, q_offsets: Any, kv_offsets: Any, max_q_len: Any, max_kv_len: Any, activation: Any,
    scale: Any, divisor: Any, causal: Any, window: Any, backend: Any,
) -> tuple[tuple[Any, ...] | None, torch.Tensor | None]:
    """(the call's signature, its result where a plan serves it, else None)."""
    key = _signature(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation, scale, divisor, causal,
                     window, backend)
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: the ordinary checks name it
        return None, None
    if plan is None or _TILE_OVERRIDE or not max_kv_len > plan.op.block_n:
        return key, None
    ptrs = _attn_plan.admits(plan, q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len)
    if ptrs is None:
        return key, None
    args = (q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation,
            plan.op.scale if scale is None else float(scale),
            float(max_kv_len) if divisor is None else float(divisor), bool(causal), window)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return key, _GdpaFunction.apply(plan, ptrs, *args)  # type: ignore[no-untyped-call]
    return key, _plan_forward(plan, ptrs, *args)


def _plan_forward(
    plan: _attn_plan.Plan, ptrs: tuple[int, ...], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, activation: str,
    scale: float, divisor: float, causal: bool, window: int | None,
) -> torch.Tensor:
    """`gdpa_forward_triton`'s long-kv launch for a planned signature."""
    from gem_kernels._triton_jfa import in_order_tiles

    tq = q.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    b, h, w = plan.b, plan.heads, window or 0
    grid = (in_order_tiles(tq, b, max_q_len, plan.op.block_m), h, 1)
    qp, kp, vp, qo, ko = ptrs
    rest = (scale, 1.0 / divisor, w, b, h)
    _attn_plan.run(plan, grid, (qp, kp, vp, out.data_ptr(), qo, ko, *plan.ints, *rest, qo, qo),
                   (q, k, v, out, q_offsets, kv_offsets, *plan.ints, *rest, q_offsets, q_offsets))
    return out


def _remember(
    key: tuple[Any, ...] | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, activation: str, scale: float, divisor: float,
    causal: bool, window: int | None,
) -> None:
    """Keeps a plan for `key` after the ordinary path checked and launched a call with it, where
    that launch is the plan's: the long-kv kernel in batch order on the caller's contiguous,
    aligned tensors, T > 0 on both sides, B > 0."""
    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    if key is None or _TILE_OVERRIDE or tq == 0 or k.shape[0] == 0 or b == 0 or max_q_len == 0:
        return
    t = gdpa_tiles(max_kv_len, d)
    if (max_kv_len <= t.block_n or t.schedule != "in_order"
            or not all(x.is_contiguous() for x in (q, k, v, q_offsets, kv_offsets))
            or _attn_plan.aligned_pointers(q, k, v, q_offsets, kv_offsets) is None):
        return
    # q stands in for out (same dtype, both aligned): the specialization of the call just made.
    _, args, consts = _long_fwd(t, q, k, v, q, q_offsets, kv_offsets, max_q_len, activation, scale, divisor,
                                causal, window)
    op = _PlanOp(block_m=t.block_m, block_n=t.block_n, scale=1.0 / math.sqrt(d))
    _attn_plan.keep(_PLANS, key, _attn_plan.make(_kernel_launch("fwd"), args, consts, q=q, k=k, v=v, b=b,
                                                 ints=(h * d, d) * 4, op=op))


def _plan_backward(
    plan: _attn_plan.Plan, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, activation: str,
    scale: float, divisor: float, causal: bool, window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`gdpa_backward_triton`'s two-kernel launch for the backward of a planned call, or None
    where its plan cannot serve it (see above). q, k, v and the offsets are the forward's (the
    plan admitted them: contiguous, aligned, within the 32-bit row bounds)."""
    held = plan.op.bwd
    if not held or _TILE_OVERRIDE:
        return None
    bp = held[0]
    if max_kv_len <= bp.short_kv or _one_pass(bp.t_kv, False):
        return None
    dout = dout.contiguous()
    if dout.dtype != q.dtype or dout.shape != q.shape or dout.data_ptr() & 15:
        return None
    from gem_kernels._triton_jfa import in_order_tiles

    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    b, h = plan.b, plan.heads
    qp, kp, vp, dp, dqp = q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), dq.data_ptr()
    qo, ko = q_offsets.data_ptr(), kv_offsets.data_ptr()
    rest = (scale, 1.0 / divisor, window or 0, b, h)
    _attn_plan.run(bp.dq, (in_order_tiles(q.shape[0], b, max_q_len, bp.dq_block_m), h, 1),
                   (qp, kp, vp, dp, dqp, qo, ko, *bp.dq.ints, *rest, qo, qo),
                   (q, k, v, dout, dq, q_offsets, kv_offsets, *bp.dq.ints, *rest, q_offsets, q_offsets))
    _attn_plan.run(bp.dkdv, (in_order_tiles(k.shape[0], b, max_kv_len, bp.dkdv_block_n), h, 1),
                   (qp, kp, vp, dp, dk.data_ptr(), dv.data_ptr(), dqp, qo, ko, *bp.dkdv.ints, *rest, ko, ko),
                   (q, k, v, dout, dk, dv, dq, q_offsets, kv_offsets, *bp.dkdv.ints, *rest, kv_offsets, kv_offsets))
    return dq, dk, dv


def _remember_backward(
    plan: _attn_plan.Plan, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, activation: str,
    scale: float, divisor: float, causal: bool, window: int | None,
) -> None:
    """Keeps the backward's plan in the forward's `plan` after `gdpa_backward_triton` ran the
    backward of a planned call, where what it launched is the plan's (see above)."""
    if plan.op.bwd or _TILE_OVERRIDE:
        return
    d = q.shape[2]
    t, t_kv = gdpa_tiles(max_kv_len, d, kind="dq"), gdpa_tiles(max_kv_len, d, kind="dkdv")
    if max_kv_len <= t.block_n or _one_pass(t_kv, False) or t.schedule != "in_order" or t_kv.schedule != "in_order":
        return
    dout = dout.contiguous()
    if dout.dtype != q.dtype or dout.shape != q.shape or _attn_plan.aligned_pointers(dout) is None:
        return
    b = plan.b
    common = dict(D=d, ACT=activation, CAUSAL=causal, HAS_WINDOW=window is not None, PREC=_prec(q.dtype))
    # The launches just made, as `gdpa_backward_triton` made them: q stands in for dq, k for dk
    # and dv (same dtypes and strides, all aligned), so the keys are those calls' specializations.
    _, args, consts = _dq_args(t, q, k, v, dout, q, q_offsets, kv_offsets, max_q_len, scale, divisor, window, b,
                               common)
    dq_plan = _attn_plan.make(_kernel_launch("dq"), args, consts, q=q, k=k, v=v, b=b, ints=args[7:17], op=None)
    _, args, consts = _dkdv_args(t_kv, q, k, v, dout, k, v, q, q_offsets, kv_offsets, max_kv_len, scale, divisor,
                                 window, b, common, False)
    dkdv_plan = _attn_plan.make(_kernel_launch("dkdv"), args, consts, q=q, k=k, v=v, b=b, ints=args[9:23], op=None)
    if dq_plan is not None and dkdv_plan is not None:
        plan.op.bwd.append(_BwdPlan(dq=dq_plan, dkdv=dkdv_plan, dq_block_m=t.block_m, dkdv_block_n=t_kv.block_n,
                                    short_kv=t.block_n, t_kv=t_kv))


# --- Triton launchers ------------------------------------------------------------------------


def _block_b(b: int) -> int:
    """Width of the in-kernel per-sample scan (`_triton_jfa._locate`)."""
    return max(16, 1 << max(0, b - 1).bit_length())


def _grid(tokens: int, b: int, max_len: int, block: int, heads: int) -> tuple[int, int]:
    """(programs, heads) covering every `block`-row tile of a jagged batch of `b` samples and
    `tokens` rows: at most `tokens // block + b` tiles, and at most `b * cdiv(max_len, block)`
    (host ints only; programs past the last tile exit)."""
    return min(tokens // block + b, b * max(1, cdiv(max_len, block))), heads


def _schedule(
    t: GdpaTiles, offsets: torch.Tensor, other_offsets: torch.Tensor, rows: int, max_len: int, block: int,
    heads: int, *, q_side: bool = True,
) -> tuple[tuple[int, int], tuple[object, ...], dict[str, object]]:
    """(grid, args H/CUM/ORDER, constexprs TILE_LIST/LOG2B/IN_ORDER) of a long-kv kernel that
    tiles `offsets`' side by `block` rows, in the order `t.schedule` names (see `GdpaTiles`);
    JFA's schedules (`_triton_jfa._schedule_args`)."""
    from gem_kernels._triton_jfa import _schedule_args

    tile_list = {"auto": None, "list": True}.get(t.schedule, False)
    in_order = {"in_order": 1, "in_order_rev": 2 if q_side else 1}.get(t.schedule, 0)
    grid, sched = _schedule_args(offsets, other_offsets, rows, max_len, block, heads, tile_list, in_order)
    return grid, (heads, sched["CUM"], sched["ORDER"]), {k: sched[k] for k in ("TILE_LIST", "LOG2B", "IN_ORDER")}


def _tanh(t: GdpaTiles, dtype: torch.dtype) -> bool:
    """Whether the kernels compute sigmoid with PTX tanh.approx (see `GdpaTiles.tanh_sigmoid`)."""
    return t.tanh_sigmoid and dtype != torch.float32 and os.environ.get("TRITON_INTERPRET", "0") != "1"


def _prec(dtype: torch.dtype) -> str:
    """Dot precision: exact fp32 for fp32 inputs; fp32-upcast 16-bit dots in the interpreter."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if os.environ.get("TRITON_INTERPRET", "0") == "1" else "tf32"


def gdpa_forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, activation: str,
    scale: float, divisor: float, causal: bool, window: int | None,
) -> torch.Tensor:
    """Launches the Triton forward. Returns `[Tq, H, D]`."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_offsets, kv_offsets = q_offsets.contiguous(), kv_offsets.contiguous()  # (read with unit stride)
    check_row_offsets(max_q_len, max_kv_len, q, k, v)
    out = torch.empty_like(q)
    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    if tq == 0 or b == 0:
        return out.zero_()
    t = gdpa_tiles(max_kv_len, d)
    if max_kv_len <= t.block_n:  # short kv: the whole kv of a sample in one tile
        from gem_kernels._triton_gdpa import _gdpa_fwd_short_kernel

        chunk = t.block_m * t.q_tiles
        _gdpa_fwd_short_kernel[_grid(tq, b, max_q_len, chunk, h)](
            q, k, v, out, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1),
            scale, 1.0 / divisor, window or 0, b,
            D=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_B=_block_b(b), Q_TILES=t.q_tiles, ACT=activation,
            TANH=_tanh(t, q.dtype), CAUSAL=causal, HAS_WINDOW=window is not None, PREC=_prec(q.dtype),
            num_warps=t.num_warps, num_stages=t.num_stages,
        )
        return out
    grid, args, consts = _long_fwd(t, q, k, v, out, q_offsets, kv_offsets, max_q_len, activation, scale, divisor,
                                   causal, window)
    _kernel_launch("fwd")(grid, args, consts)
    return out


def _long_fwd(
    t: GdpaTiles, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_q_len: int, activation: str, scale: float, divisor: float, causal: bool,
    window: int | None,
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, runtime arguments, constexprs and launch options) of the long-kv forward kernel."""
    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    grid, sched, sc = _schedule(t, q_offsets, kv_offsets, tq, max_q_len, t.block_m, h)
    args = (q, k, v, out, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), scale, 1.0 / divisor, window or 0, b, *sched)
    consts = dict(D=d, BLOCK_M=t.block_m, BLOCK_N=t.block_n, ACT=activation, TANH=_tanh(t, q.dtype), CAUSAL=causal,
                  HAS_WINDOW=window is not None, PREC=_prec(q.dtype), **sc,
                  num_warps=t.num_warps, num_stages=t.num_stages)
    return grid, args, consts


_KERNELS = {"fwd": "_gdpa_fwd_kernel", "dq": "_gdpa_bwd_dq_kernel", "dkdv": "_gdpa_bwd_dkdv_kernel"}


def _kernel_launch(kind: str) -> CachedLaunch:
    """The cached launch (`_launch.launch_of`) of the long-kv "fwd", "dq" or "dkdv" kernel, as
    `_triton_gdpa` holds it now (a test's stand-in included)."""
    from gem_kernels import _triton_gdpa

    return launch_of(getattr(_triton_gdpa, _KERNELS[kind]))


def gdpa_backward_triton(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int,
    activation: str, scale: float, divisor: float, causal: bool, window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launches the Triton backward: a dQ kernel and a dK/dV kernel; or the dK/dV kernel alone,
    adding dQ into an fp32 workspace with atomics (one-pass, `GdpaTiles.one_pass`), then a
    cast; or for short kv one kernel for all three (`_triton_gdpa._gdpa_bwd_short_kernel`).
    Returns (dq, dk, dv)."""
    q, k, v, dout = q.contiguous(), k.contiguous(), v.contiguous(), dout.contiguous()
    q_offsets, kv_offsets = q_offsets.contiguous(), kv_offsets.contiguous()
    check_row_offsets(max_q_len, max_kv_len, q, k, v)
    tq, h, d = q.shape
    tkv = k.shape[0]
    b = q_offsets.numel() - 1
    if b == 0 or tq == 0 or tkv == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    common = dict(D=d, ACT=activation, CAUSAL=causal, HAS_WINDOW=window is not None, PREC=_prec(q.dtype))
    t = gdpa_tiles(max_kv_len, d, kind="dq")
    if max_kv_len <= t.block_n and not _FORCE_SPLIT_BWD and not torch.are_deterministic_algorithms_enabled():
        # Short kv (the whole kv of every sample in one tile): one kernel; each program walks
        # q tiles of one sample and adds its dK/dV sums to fp32 buffers (atomics, so not under
        # torch's deterministic algorithms: the two kernels below are bitwise repeatable).
        # Two separate buffers: returned outputs of a custom op must not alias.
        from gem_kernels._triton_gdpa import _gdpa_bwd_short_kernel

        dq = torch.empty_like(q)
        dka = torch.zeros((tkv, h, d), dtype=torch.float32, device=q.device)
        dva = torch.zeros((tkv, h, d), dtype=torch.float32, device=q.device)
        chunk = t.block_m * t.q_tiles
        _gdpa_bwd_short_kernel[_grid(tq, b, max_q_len, chunk, h)](
            q, k, v, dout, dq, dka, dva, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1), dka.stride(0), dka.stride(1),
            scale, 1.0 / divisor, window or 0, b, Q_TILES=t.q_tiles, TANH=_tanh(t, q.dtype), **common,
            BLOCK_B=_block_b(b), BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages,
        )
        return dq, dka.to(k.dtype), dva.to(v.dtype)
    t_kv = gdpa_tiles(max_kv_len, d, kind="dkdv")
    if _one_pass(t_kv, "dkdv" in _TILE_OVERRIDE):
        dqa = torch.zeros((tq, h, d), dtype=torch.float32, device=q.device)
        dk, dv = _dkdv(t_kv, q, k, v, dout, dqa, q_offsets, kv_offsets, max_kv_len, scale, divisor, window, b,
                       common, dq_atomic=True)
        return dqa.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
    _kernel_launch("dq")(*_dq_args(t, q, k, v, dout, dq, q_offsets, kv_offsets, max_q_len, scale, divisor, window, b, common))
    dk, dv = _dkdv(t_kv, q, k, v, dout, dq, q_offsets, kv_offsets, max_kv_len, scale, divisor, window, b, common,
                   dq_atomic=False)
    return dq, dk, dv


_Launch = tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]  # (grid, runtime arguments, constexprs)


def _dq_args(
    t: GdpaTiles, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, dq: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, scale: float, divisor: float,
    window: int | None, b: int, common: dict[str, Any],
) -> _Launch:
    """(grid, runtime arguments, constexprs and launch options) of the long-kv dQ kernel."""
    grid, sched, sc = _schedule(t, q_offsets, kv_offsets, q.shape[0], max_q_len, t.block_m, q.shape[1])
    args = (q, k, v, dout, dq, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1),
            scale, 1.0 / divisor, window or 0, b, *sched)
    consts = dict(**common, BLOCK_M=t.block_m, BLOCK_N=t.block_n, TANH=_tanh(t, q.dtype), **sc,
                  num_warps=t.num_warps, num_stages=t.num_stages)
    return grid, args, consts


def _dkdv_args(
    t: GdpaTiles, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, dk: torch.Tensor,
    dv: torch.Tensor, dqa: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_kv_len: int,
    scale: float, divisor: float, window: int | None, b: int, common: dict[str, Any], dq_atomic: bool,
) -> _Launch:
    """(grid, runtime arguments, constexprs and launch options) of the long-kv dK/dV kernel."""
    grid, sched, sc = _schedule(t, kv_offsets, q_offsets, k.shape[0], max_kv_len, t.block_n, k.shape[1],
                                q_side=False)
    args = (q, k, v, dout, dk, dv, dqa, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            dqa.stride(0), dqa.stride(1),
            scale, 1.0 / divisor, window or 0, b, *sched)
    consts = dict(**common, BLOCK_M=t.block_m, BLOCK_N=t.block_n, TANH=_tanh(t, q.dtype), **sc,
                  DQ_ATOMIC=dq_atomic, num_warps=t.num_warps, num_stages=t.num_stages)
    return grid, args, consts


def _dkdv(
    t: GdpaTiles, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, dqa: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_kv_len: int, scale: float, divisor: float,
    window: int | None, b: int, common: dict[str, Any], *, dq_atomic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The long-kv dK/dV kernel; with `dq_atomic` it also adds dQ into the fp32 `dqa` (else
    `dqa` is not read: any tensor)."""
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _kernel_launch("dkdv")(*_dkdv_args(t, q, k, v, dout, dk, dv, dqa, q_offsets, kv_offsets, max_kv_len, scale, divisor,
                                   window, b, common, dq_atomic))
    return dk, dv


# --- torch.library registration of the Triton path -------------------------------------------


@torch.library.custom_op("gem_kernels::gdpa_fwd", mutates_args=())
def _gdpa_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    return gdpa_forward_triton(
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation, scale, divisor, causal, window
    )


@_gdpa_fwd.register_fake
def _gdpa_fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    return q.new_empty(q.shape)  # contiguous, as the launcher's output


@torch.library.custom_op("gem_kernels::gdpa_bwd", mutates_args=())
def _gdpa_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return gdpa_backward_triton(
        dout, q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, activation, scale, divisor, causal, window
    )


@_gdpa_bwd.register_fake
def _gdpa_bwd_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    activation: str,
    scale: float,
    divisor: float,
    causal: bool,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _gdpa_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    q, k, v, q_offsets, kv_offsets, *meta = inputs
    ctx.save_for_backward(q, k, v, q_offsets, kv_offsets)
    ctx.meta = tuple(meta)


def _gdpa_backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, k, v, q_offsets, kv_offsets = ctx.saved_tensors
    dq, dk, dv = torch.ops.gem_kernels.gdpa_bwd(dout.contiguous(), q, k, v, q_offsets, kv_offsets, *ctx.meta)
    return (dq, dk, dv) + (None,) * 9


_gdpa_fwd.register_autograd(_gdpa_backward, setup_context=_gdpa_setup_context)
