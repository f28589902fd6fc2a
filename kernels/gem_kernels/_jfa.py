"""Jagged Flash Attention: the public function, its checks and the torch.library ops.

The Triton path is two custom ops, `gem_kernels::jfa_fwd` (returns out and the per-row
log-sum-exp) and `gem_kernels::jfa_bwd` (returns dq, dk, dv), tied by `register_autograd`
and given fake implementations, so `torch.compile` traces through them without graph breaks
(eager calls take an `autograd.Function` twin, skipping the dispatch). The reference backend
is plain PyTorch and is differentiated by torch autograd. `jagged_flash_attention_kv` is the
same attention for k and v packed in one `[Tkv, 2, H, D]` tensor, with its own pair of ops
(`jfa_fwd_kv`, `jfa_bwd_kv`) whose backward returns kv's gradient as one packed tensor.
"""

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from gem_kernels import _attn_plan, _gluon_jfa
from gem_kernels._jagged import check_attention, check_row_offsets, check_triton_device, resolve_backend
from gem_kernels._jfa_reference import jfa_padded, jfa_reference, run_reference

_BACKENDS = ("auto", "triton", "reference")
TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)


def jagged_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention on jagged sequences: sample b's queries attend to sample b's keys.

    Args:
        q: `[Tq, H, D]` jagged queries (bf16, fp16 or fp32).
        k: `[Tkv, H, D]` jagged keys.
        v: `[Tkv, H, D]` jagged values.
        q_offsets: int64 `[B+1]` offsets into q.
        kv_offsets: int64 `[B+1]` offsets into k/v (self-attention: pass q_offsets again).
        max_q_len: host int >= every query length (sizes the grid; no GPU sync).
        max_kv_len: host int >= every key length.
        causal: query i sees keys j <= i + (len_kv - len_q) (bottom-right aligned).
        window: sliding window w: additionally j > i + (len_kv - len_q) - w; without
            `causal` the symmetric band |i + len_kv - len_q - j| < w.
        scale: softmax scale, default 1/sqrt(D).
        backend: "triton", "reference" (plain PyTorch) or "auto" (Triton on CUDA, else
            reference).

    Returns:
        `[Tq, H, D]` in q's dtype. Queries that see no key output 0 (and get zero gradient).
    """
    # An eager call with a signature already checked takes its plan (`gem_kernels._attn_plan`).
    key, served = (None, None) if torch.compiler.is_compiling() else _planned(
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale, backend)
    if served is not None:
        return served
    given = (q_offsets, kv_offsets)
    backend, scale, q_offsets, kv_offsets = _prepare(
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window, scale, backend
    )
    if backend == "reference":
        return _reference(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, bool(causal), window, scale)
    args = (q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, bool(causal), window, scale)
    if torch.compiler.is_compiling():
        traced, _ = torch.ops.gem_kernels.jfa_fwd(*args)
        return traced  # type: ignore[no-any-return]
    # Eager: the same kernels without the custom-op dispatch (tens of µs per call).
    out: torch.Tensor
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out = _JfaFunction.apply(*args, None, None)  # type: ignore[no-untyped-call]
    else:
        out = _run_forward(*args)[0]
    # A plan launches the caller's offsets: none where _prepare made contiguous copies of them.
    _remember(key if given[0] is q_offsets and given[1] is kv_offsets else None, *args)
    return out


def jagged_flash_attention_kv(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """`jagged_flash_attention(q, kv[:, 0], kv[:, 1], ...)` for keys and values packed in one
    tensor (one fused projection, `kv = wkv(x).reshape(T, 2, H, D)`), with kv's gradient
    returned as one packed `[Tkv, 2, H, D]` tensor.

    Why: with separate k and v views of kv, autograd stacks dk and dv into kv's gradient
    (`unbind`'s backward, 0.5-0.7 ms per call at the trainer's size on an H100). Here the Triton
    path's backward (`gem_kernels::jfa_bwd_kv`) writes dk and dv straight into the halves of
    one buffer (ours and FlashAttention-4's backward; torch's FlashAttention-2 backward returns
    fresh tensors, stacked into the buffer). Same values as `jagged_flash_attention` on the same kernels.

    With `rope=(cos, sin)` (rotary tables `[Tkv, D]`, the rotate-half layout of
    `jagged_flash_attention_qkv`) the keys are rotated first, in one pass; the backward then
    rotates dk back in place in kv's gradient (the composed form's rotary backward moved dk and
    dv into a new buffer).

    Args:
        kv: `[Tkv, 2, H, D]`: keys `kv[:, 0]`, values `kv[:, 1]` (q's dtype, device, H and D).
        rope: optional `(cos, sin)` rotary tables for the keys, `[Tkv, D]`.
        Everything else as `jagged_flash_attention`.

    Returns:
        `[Tq, H, D]` in q's dtype.
    """
    from gem_kernels._rope import rope as rotary, rope_tables_checked

    k, v = _kv_halves(q, kv)
    cos, sin = rope_tables_checked(rope, kv.shape[0], kv.shape[3], kv.device)
    backend, scale, q_offsets, kv_offsets = _prepare(
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window, scale, backend
    )
    if backend == "reference":
        k, v = kv.unbind(1)  # autograd differentiates the reference (stacking dk, dv)
        if cos is not None and sin is not None:
            k = rotary(k, cos, sin)
        return _reference(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, bool(causal), window, scale)
    args = (q, kv, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len, bool(causal), window, scale)
    if torch.compiler.is_compiling():
        out, _, _ = torch.ops.gem_kernels.jfa_fwd_kv(*args)
        return out  # type: ignore[no-any-return]
    if torch.is_grad_enabled() and (q.requires_grad or kv.requires_grad):
        return _JfaKvFunction.apply(*args)  # type: ignore[no-untyped-call,no-any-return]
    return _run_forward_kv(*args)[0]


def _kv_halves(q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv's keys and values `kv[:, 0]`, `kv[:, 1]` after the checks that name `kv` (the rest,
    `check_attention`'s, run on the halves)."""
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv.shape={tuple(kv.shape)} must be [Tkv, 2, H, D] (keys kv[:, 0], values kv[:, 1])")
    if isinstance(q, torch.Tensor) and q.dim() == 3:
        if kv.shape[2:] != q.shape[1:]:
            raise ValueError(f"kv.shape={tuple(kv.shape)} and q.shape={tuple(q.shape)} must share [H, D]")
        if kv.device != q.device:
            raise ValueError(f"kv.device={kv.device} must match q's {q.device}")
        if kv.dtype != q.dtype:
            raise TypeError(f"kv.dtype={kv.dtype} must match q's {q.dtype}")
    return kv[:, 0], kv[:, 1]


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, max_kv_len: int, window: int | None, scale: float | None, backend: str,
) -> tuple[str, float, torch.Tensor, torch.Tensor]:
    """The public functions' shared front: checks, the scale, the backend; for Triton its own
    checks and unit-stride offsets. Returns (backend, scale, q_offsets, kv_offsets)."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {_BACKENDS}")
    device = check_attention(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    elif not math.isfinite(float(scale)):
        raise ValueError(f"scale={scale!r} must be a finite float")
    backend = resolve_backend(backend, device)
    if backend == "reference":
        return backend, float(scale), q_offsets, kv_offsets
    if q.shape[2] not in TRITON_HEAD_DIMS:
        raise ValueError(f"q.shape[2]={q.shape[2]} (head dim D) must be one of {TRITON_HEAD_DIMS} for backend='triton'")
    check_triton_device(device)
    check_row_offsets(max_q_len, max_kv_len, q, k, v)
    # Every path below reads the offsets with a unit stride (a strided view gave wrong results).
    return backend, float(scale), q_offsets.contiguous(), kv_offsets.contiguous()


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> torch.Tensor:
    """The plain-PyTorch path (differentiated by autograd)."""
    if torch.compiler.is_compiling():
        # Traced: the padded batch (sync-free); the CPU buckets read the offsets on the host.
        return jfa_padded(q, k, v, q_offsets, kv_offsets, max_q_len, max(max_kv_len, 1),
                          causal=causal, window=window, scale=scale)
    return run_reference(jfa_padded, jfa_reference, q, k, v, q_offsets, kv_offsets, max_q_len,
                         max_kv_len, causal=causal, window=window, scale=scale)


def jfa_backward_rule() -> str:
    """How this process picks the Triton JFA backward, in words (the trainer's summary records
    it: the one-pass path's dQ atomics make the last bits of dQ order-dependent)."""
    from gem_kernels._triton_jfa import bwd_rule

    return bwd_rule()


FWD_ENV = "GEM_JFA_FWD"
_FWD_CHOICES = ("pointer", "tma", "flash", "flash4")
# FlashAttention-4's forward (`_flash4`, the optional flash-attn-4 package) where it runs:
# `GEM_JFA_FWD=flash4` asks for it; unset, FLASH4_FWD_DEFAULT picks it when the mean query
# length (tokens / sequences, host ints) is at least FLASH4_FWD_MIN_MEAN. On the H200
# (kernels/BENCHMARKS.md, 2026-12-03, D=128, bf16) it is 571 vs 395 (ours) useful TFLOP/s on
# the trainer's self-attention batch, 340 vs 256 (FlashAttention-2) at mean length 297, but
# below FlashAttention-2 at mean 112 (96 vs 124) and below ours for the pooling's 32 seed
# queries per sample (57 vs 67): those keep the rule below (`fwd_uses_flash`).
FLASH4_FWD_DEFAULT = True
FLASH4_FWD_MIN_MEAN = 256
# Short mixes run torch's FlashAttention-2 forward (gem_kernels._flash2), long ones ours: on the
# H200 (kernels/BENCHMARKS.md, 2026-12-01, 8 heads, D=128, ~262k tokens) FlashAttention-2's
# forward is 1.94x ours at mean length 112 and 1.26x at 297, ours 1.12x it at 935 and 1.05x
# on the issue batch (mean 863, 4 heads). Both the mean query and the mean key length
# (tokens / sequences, host ints: no sync) must be below FLASH_FWD_MAX_MEAN.
FLASH_FWD_DEFAULT = True
FLASH_FWD_MAX_MEAN = 512


def fwd_uses_flash4(q: torch.Tensor, k: torch.Tensor, q_offsets: torch.Tensor, window: int | None) -> bool:
    """Whether the forward is FlashAttention-4's: `GEM_JFA_FWD=flash4`, or unset with
    FLASH4_FWD_DEFAULT and a mean query length >= FLASH4_FWD_MIN_MEAN; never under
    `force_config`; only where it runs (`_flash4.unavailable_reason`)."""
    from gem_kernels._flash4 import unavailable_reason
    from gem_kernels._triton_jfa import _FORCED, env_choice

    value = env_choice(FWD_ENV, _FWD_CHOICES)
    if _FORCED or (value != "flash4" and value is not None):
        return False
    if value is None:
        return q.shape[0] >= _flash4_rows(q, k, q_offsets, window)
    return unavailable_reason(q, window, k=k) is None


def _flash4_rows(q: torch.Tensor, k: torch.Tensor, q_offsets: torch.Tensor, window: int | None) -> int:
    """With `GEM_JFA_FWD` unset, the query rows from which FlashAttention-4 takes the forward
    (FLASH4_FWD_MIN_MEAN per sequence); sys.maxsize where it is off or cannot run."""
    from gem_kernels._flash4 import unavailable_reason

    if not FLASH4_FWD_DEFAULT or unavailable_reason(q, window, k=k) is not None:
        return sys.maxsize
    return FLASH4_FWD_MIN_MEAN * max(q_offsets.numel() - 1, 1)


def fwd_uses_flash(q: torch.Tensor, k: torch.Tensor, q_offsets: torch.Tensor, window: int | None) -> bool:
    """Whether the forward is torch's FlashAttention-2 kernel: `GEM_JFA_FWD=flash`, or unset
    with short sequences (`FLASH_FWD_MAX_MEAN`); never under `force_config` or where it
    cannot run (`_flash2.unavailable_reason`)."""
    from gem_kernels import _flash2
    from gem_kernels._triton_jfa import _FORCED, env_choice

    value = env_choice(FWD_ENV, _FWD_CHOICES)
    if _FORCED or value in ("pointer", "tma", "flash4"):
        return False
    if value is None:
        return max(q.shape[0], k.shape[0]) < _flash2_rows(q, k, q_offsets, window)
    return _flash2.unavailable_reason(q, window, backward=False, k=k) is None


def _flash2_rows(q: torch.Tensor, k: torch.Tensor, q_offsets: torch.Tensor, window: int | None) -> int:
    """With `GEM_JFA_FWD` unset, the rows (the longer of the query and key sides) below which
    FlashAttention-2 takes the forward (FLASH_FWD_MAX_MEAN per sequence); 0 where it is off
    or cannot run."""
    from gem_kernels import _flash2

    if not FLASH_FWD_DEFAULT or _flash2.unavailable_reason(q, window, backward=False, k=k) is not None:
        return 0
    return FLASH_FWD_MAX_MEAN * max(q_offsets.numel() - 1, 1)


def _forward_impl() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The Triton forward: `_triton_jfa.jfa_forward` (pointer loads; the default) or, with
    `GEM_JFA_FWD=tma`, `_triton_jfa_tma.jfa_forward_tma` (Hopper TMA descriptors; same
    contract, falls back to the pointer kernel where TMA cannot run), or with `GEM_JFA_GLUON`
    naming fwd, the pointer kernel's Gluon twin (`_gluon_jfa.jfa_forward_gluon`, same fallback). A per-process switch for
    GPU A/B runs of the whole trainer; read at each call, so it is not traced into graphs."""
    from gem_kernels._triton_jfa import env_choice, jfa_forward

    if env_choice(FWD_ENV, _FWD_CHOICES) != "tma":
        return _gluon_jfa.jfa_forward_gluon if _gluon_jfa.requested("fwd") else jfa_forward
    from gem_kernels._triton_jfa_tma import jfa_forward_tma

    return jfa_forward_tma


def _run_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, log2 lse `[Tq, H]`): torch's FlashAttention-2 forward where `fwd_uses_flash`, else
    the Triton forward `_forward_impl` picks, or FlashAttention-4's where `fwd_uses_flash4`.
    All give the backward the same contract."""
    if fwd_uses_flash4(q, k, q_offsets, window):
        from gem_kernels._flash4 import flash4_forward

        return flash4_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, scale)
    if fwd_uses_flash(q, k, q_offsets, window):
        from gem_kernels._flash2 import flash_forward

        return flash_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, scale)
    return _forward_impl()(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)


class _JfaFunction(torch.autograd.Function):
    """Eager autograd for the Triton path (the custom op's `register_autograd` twin)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_offsets: torch.Tensor,
        kv_offsets: torch.Tensor,
        max_q_len: int,
        max_kv_len: int,
        causal: bool,
        window: int | None,
        scale: float,
        plan: _attn_plan.Plan | None,
        ptrs: tuple[int, ...] | None,
    ) -> torch.Tensor:
        ctx.plan = None
        if plan is not None and ptrs is not None:  # a planned signature (`_planned`)
            out, lse = _plan_forward(plan, ptrs, q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window, scale)
            ctx.plan = plan
        else:
            out, lse = _run_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)
        ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
        ctx.meta = (max_q_len, max_kv_len, causal, window, scale)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from gem_kernels._triton_jfa import jfa_backward

        saved = ctx.saved_tensors
        plan = ctx.plan
        got = None if plan is None else _plan_backward(plan, dout, *saved, *ctx.meta)
        if got is None:
            got = jfa_backward(dout.contiguous(), *saved, *ctx.meta)
            if plan is not None:
                _remember_backward(plan, dout, *saved, *ctx.meta)
        return (*got, None, None, None, None, None, None, None, None, None)


# --- the eager fast path: one plan per call signature (gem_kernels._attn_plan) ------------------
#
# Kept where the first call with a signature ran our Triton forward (`_triton_jfa.jfa_forward`,
# heuristic tiles, no split-kv) on the caller's q, k, v (unit stride on D) and contiguous,
# 16-byte aligned offsets. The signature holds, besides `_attn_plan.signature`'s part: causal,
# window, scale, backend, the forward tiles and schedule the max lengths select
# (`_heuristic_config`), the path rules' constants, and Triton's specialization of the two
# T-dependent stride arguments. Per call the plan re-applies what the signature leaves out:
# `GEM_JFA_FWD` as it was, no `force_config`, the length rules that send a batch to
# FlashAttention-4 / FlashAttention-2 (`fwd_uses_flash4`, `fwd_uses_flash`), and
# `_attn_plan.admits`.
#
# The backward of a planned call has plans of its own (`_BwdPlan`), one per backward config
# (`pick_config`: the tiles, one- or two-pass), kept in the forward's by the first such backward
# that ran our kernels in batch order without TMA, split-kv or a tile list, on contiguous q, k,
# v: the binaries it launched (delta, dK/dV, and dQ for two-pass) and their stride arguments.
# Per call it re-applies what the forward's signature leaves out: no `force_config`, neither
# FlashAttention backward's rule (`bwd_uses_flash4`, `bwd_uses_flash`: GEM_JFA_BWD, torch's
# deterministic switch), the config `pick_config` picks now, and dO in q's dtype and shape,
# 16-byte aligned once contiguous. Anything else takes `jfa_backward`.

_PLANS: dict[tuple[Any, ...], _attn_plan.Plan] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class _BwdPlan:
    delta: _attn_plan.Plan  # the kept binaries; each `ints` holds the kernel's stride arguments
    dkdv: _attn_plan.Plan
    dq: _attn_plan.Plan | None  # None: one-pass (dQ by the dK/dV kernel's atomics)
    dkdv_block_n: int
    dq_block_m: int
    gluon_dkdv: bool = False  # dkdv / dq hold the Gluon kernels' binaries (`_gluon_jfa.dkdv` / `dq`)
    gluon_dq: bool = False


def _bwd_key(cfg: Any, q: torch.Tensor, k: torch.Tensor, window: int | None) -> tuple[Any, ...]:
    """A backward plan's key within its forward's: the backward config, and for each of dK/dV and
    dQ whether `GEM_JFA_GLUON` has it run as its Gluon twin, with that twin's tiles."""
    return (cfg, _gluon_jfa.serves("dkdv", q, k, window, cfg) and _gluon_jfa.DEFAULT_TILES,
            _gluon_jfa.serves("dq", q, k, window, cfg) and _gluon_jfa.DEFAULT_DQ_TILES)


@dataclasses.dataclass(frozen=True, slots=True)
class _PlanOp:
    env: str  # GEM_JFA_FWD's raw value when the plan was made
    flash4_rows: int  # FlashAttention-4 takes the batch from this many query rows (sys.maxsize: never)
    flash2_rows: int  # FlashAttention-2 takes it below this many query and key rows (0: never)
    block_m: int
    in_order: bool
    scale: float  # the default, 1/sqrt(D)
    # The Gluon forward's grid rule (`GEM_JFA_GLUON` naming fwd; `_gluon_jfa.fwd_grid_rule`), None
    # for the Triton kernel.
    gluon: int | None = None
    # The backward's plans by backward config (`_remember_backward`; this record is frozen).
    bwd: dict[Any, _BwdPlan] = dataclasses.field(default_factory=dict, compare=False)


def _signature(q: Any, k: Any, v: Any, q_offsets: Any, kv_offsets: Any, max_q_len: Any, max_kv_len: Any,
               causal: Any, window: Any, scale: Any, backend: Any) -> tuple[Any, ...] | None:
    from gem_kernels._triton_jfa import _heuristic_config

    try:
        tq, h, d = q.shape
        cfg = _heuristic_config(max_q_len, max_kv_len, d, q.dtype)
        extra = (causal.__class__, causal, window.__class__, window, scale.__class__, scale, backend,
                 cfg.fwd, cfg.fwd_in_order, FLASH4_FWD_DEFAULT, FLASH4_FWD_MIN_MEAN, FLASH_FWD_DEFAULT,
                 FLASH_FWD_MAX_MEAN, _attn_plan.int_spec(tq * h), _attn_plan.int_spec(tq * h * d),
                 _gluon_jfa.requested("fwd") and _gluon_jfa.DEFAULT_FWD_TILES)
    except (AttributeError, TypeError, ValueError):
        return None
    return _attn_plan.signature(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, extra)


def _planned(
    q: Any, k: Any, v: Any, q_offsets: Any, kv_offsets: Any, max_q_len: Any, max_kv_len: Any, causal: Any,
    window: Any, scale: Any, backend: Any,
) -> tuple[tuple[Any, ...] | None, torch.Tensor | None]:
    """(the call's signature, its result where a plan serves it, else None)."""
    from gem_kernels._triton_jfa import _FORCED

    key = _signature(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale, backend)
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: the ordinary checks name it
        return None, None
    if plan is None or _FORCED or os.environ.get(FWD_ENV, "") != plan.op.env:
        return key, None
    tq = q.shape[0]
    if tq >= plan.op.flash4_rows or (tq if tq > k.shape[0] else k.shape[0]) < plan.op.flash2_rows:
        return key, None
    ptrs = _attn_plan.admits(plan, q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len)
    if ptrs is None:
        return key, None
    s = plan.op.scale if scale is None else float(scale)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return key, _JfaFunction.apply(  # type: ignore[no-untyped-call]
            q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, bool(causal), window, s, plan, ptrs)
    return key, _plan_forward(plan, ptrs, q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, window, s)[0]


def _plan_forward(
    plan: _attn_plan.Plan, ptrs: tuple[int, ...], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_triton_jfa.jfa_forward`'s launch for a planned signature: (out, log2 lse)."""
    from gem_kernels._triton_jfa import _LOG2E, _NO_SPLIT, in_order_tiles

    tq, h, d = q.shape
    b, op = plan.b, plan.op
    out = torch.empty((tq, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((tq, h), dtype=torch.float32, device=q.device)
    if op.gluon is not None:  # the Gluon forward (`_gluon_jfa.forward` at the plan's tiles; its grid rule)
        grid = (*_gluon_jfa.fwd_grid(op.gluon, in_order_tiles(tq, b, max_q_len, op.block_m), h), 1)
        qp, kp, vp, qo, ko = ptrs
        tail = (b, h, scale * _LOG2E) if op.gluon < 0 else (b, h, scale * _LOG2E, 1.0)  # (the WS kernel's inv_div)
        _attn_plan.run(plan, grid, (qp, kp, vp, out.data_ptr(), lse.data_ptr(), qo, ko, *plan.ints, *tail),
                       (q, k, v, out, lse, q_offsets, kv_offsets, *plan.ints, *tail))
        return out, lse
    bm = op.block_m
    grid = (in_order_tiles(tq, b, max_q_len, bm), h, 1) if op.in_order else (b * h, -(-max_q_len // bm), 1)
    qp, kp, vp, qo, ko = ptrs
    ints = (*plan.ints, tq * h * d, tq * h, _NO_SPLIT)
    rest = (b, h, scale * _LOG2E, window if window is not None else 0)
    _attn_plan.run(plan, grid, (qp, kp, vp, out.data_ptr(), lse.data_ptr(), qo, ko, *ints, qo, qo, *rest),
                   (q, k, v, out, lse, q_offsets, kv_offsets, *ints, q_offsets, q_offsets, *rest))
    return out, lse


def _remember(
    key: tuple[Any, ...] | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> None:
    """Keeps a plan for `key` after the ordinary path checked and launched a call with it, where
    that launch is the plan's (see above)."""
    from gem_kernels._launch import launch_of
    from gem_kernels._triton_jfa import _FORCED, _LOG2E, _fwd_launch, _heuristic_config, fwd_launch_args

    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    env = os.environ.get(FWD_ENV, "")
    if (key is None or _FORCED or env not in ("", "pointer")
            or min(tq, k.shape[0], b, h, max_q_len, max_kv_len) == 0
            or any(x.stride(2) != 1 for x in (q, k, v)) or not (q_offsets.is_contiguous() and kv_offsets.is_contiguous())
            or _attn_plan.aligned_pointers(q, k, v, q_offsets, kv_offsets) is None):
        return
    cfg = _heuristic_config(max_q_len, max_kv_len, d, q.dtype)
    if cfg.kv_split or cfg.tile_list is not False:
        return
    # The length rules as this signature meets them (GEM_JFA_FWD unset; "pointer": never).
    # This call went to FlashAttention: no plan (our binary was not launched).
    flash4_rows = _flash4_rows(q, k, q_offsets, window) if env == "" else sys.maxsize
    flash2_rows = _flash2_rows(q, k, q_offsets, window) if env == "" else 0
    if tq >= flash4_rows or max(tq, k.shape[0]) < flash2_rows:
        return
    ints = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), h * d, d)
    if _gluon_jfa.serves("fwd", q, k, window, cfg):  # (asked for by the switch, and possible here)
        # The call ran `_gluon_jfa.forward` at DEFAULT_FWD_TILES (the key holds them): its kept
        # binary, with q standing in for out (same dtype and alignment) and a fresh lse.
        tiles = _gluon_jfa.DEFAULT_FWD_TILES
        sms = _gluon_jfa.sm_count(q.device)
        kern, _, _, consts = _gluon_jfa.fwd_plan(tiles, tq, q_offsets, max_q_len, h, d, causal, sms)
        lse = torch.empty((tq, h), dtype=torch.float32, device=q.device)
        args = _gluon_jfa.fwd_args(kern, q, k, v, q, lse, q_offsets, kv_offsets, b, scale * _LOG2E)
        op = _PlanOp(env=env, flash4_rows=flash4_rows, flash2_rows=flash2_rows, block_m=int(tiles[0]),
                     in_order=True, scale=1.0 / math.sqrt(d), gluon=_gluon_jfa.fwd_grid_rule(tiles, sms))
        _attn_plan.keep(_PLANS, key, _attn_plan.make(launch_of(kern), args, consts, q=q, k=k, v=v, b=b, ints=ints,
                                                     op=op))
        return
    # The call just made, as `jfa_forward` launched it: one split, out `[1, Tq, H, D]`
    # contiguous. q stands in for out (same dtype, both aligned); lse is made for the key
    # (Triton specializes on its fp32 dtype; a few bytes per row, once per signature).
    lse = torch.empty((1, tq, h), dtype=torch.float32, device=q.device)
    _, args, consts = fwd_launch_args(cfg, q, k, v, q, lse, (h * d, d, tq * h * d, tq * h), 1, q_offsets, kv_offsets,
                                      max_q_len, causal, window, scale)
    op = _PlanOp(env=env, flash4_rows=flash4_rows, flash2_rows=flash2_rows, block_m=cfg.fwd.block_m,
                 in_order=bool(consts["IN_ORDER"]), scale=1.0 / math.sqrt(d))
    _attn_plan.keep(_PLANS, key, _attn_plan.make(_fwd_launch(), args, consts, q=q, k=k, v=v, b=b, ints=ints, op=op))


def _plan_backward(
    plan: _attn_plan.Plan, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int,
    causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`_triton_jfa.jfa_backward`'s launches for the backward of a planned call, or None where no
    backward plan serves it (see above). q, k, v and the offsets are the forward's (its plan
    admitted them), out and lse its fresh outputs."""
    from gem_kernels._launch import cdiv
    from gem_kernels._triton_jfa import (_FORCED, _LOG2E, _NO_SPLIT, bwd_uses_flash, bwd_uses_flash4, in_order_tiles,
                                         pick_config)

    held = plan.op.bwd
    if not held or _FORCED or bwd_uses_flash4(q, k, window) or bwd_uses_flash(q, window):
        return None
    tq, h, d = q.shape
    bp = held.get(_bwd_key(pick_config(max_q_len, max_kv_len, d, q.dtype), q, k, window))
    if bp is None:
        return None
    dout = dout.contiguous()
    if dout.dtype != q.dtype or dout.shape != q.shape or dout.data_ptr() & 15:
        return None
    b, tk = plan.b, k.shape[0]
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    delta = torch.empty((tq, h), dtype=torch.float32, device=q.device)
    dq_acc = dk if bp.dq is not None else torch.empty((tq, h, d), dtype=torch.float32, device=q.device)
    qp, kp, vp, dp, lp = q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), lse.data_ptr()
    qo, ko, ep, ap = q_offsets.data_ptr(), kv_offsets.data_ptr(), delta.data_ptr(), dq_acc.data_ptr()
    _attn_plan.run(bp.delta, (cdiv(tq * h, 64), 1, 1), (out.data_ptr(), dp, ep, ap, tq * h, h, *bp.delta.ints),
                   (out, dout, delta, dq_acc, tq * h, h, *bp.delta.ints))
    rest = (b, h, scale, scale * _LOG2E, window if window is not None else 0)
    g_rest = (b, h, scale, scale * _LOG2E)  # the Gluon kernels' (no window)
    dkdv_grid = (in_order_tiles(tk, b, max_kv_len, bp.dkdv_block_n), h, 1)
    if bp.gluon_dkdv:
        _attn_plan.run(bp.dkdv, dkdv_grid,
                       (qp, kp, vp, dp, lp, ep, dk.data_ptr(), dv.data_ptr(), qo, ko, *bp.dkdv.ints, *g_rest),
                       (q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets, *bp.dkdv.ints, *g_rest))
    else:
        _attn_plan.run(bp.dkdv, dkdv_grid,
                       (qp, kp, vp, dp, lp, ep, dk.data_ptr(), dv.data_ptr(), ap, qo, ko, qp, dp, ap, *bp.dkdv.ints,
                        ko, ko, *rest),
                       (q, k, v, dout, lse, delta, dk, dv, dq_acc, q_offsets, kv_offsets, q, dout, dq_acc,
                        *bp.dkdv.ints, kv_offsets, kv_offsets, *rest))
    if bp.dq is None:
        return dq_acc.to(q.dtype), dk, dv
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dq_grid = (in_order_tiles(tq, b, max_q_len, bp.dq_block_m), h, 1)
    if bp.gluon_dq:
        _attn_plan.run(bp.dq, dq_grid, (qp, kp, vp, dp, lp, ep, dq.data_ptr(), qo, ko, *bp.dq.ints, *g_rest),
                       (q, k, v, dout, lse, delta, dq, q_offsets, kv_offsets, *bp.dq.ints, *g_rest))
        return dq, dk, dv
    ints = (*bp.dq.ints, tq * h * d, _NO_SPLIT)
    _attn_plan.run(bp.dq, dq_grid,
                   (qp, kp, vp, dp, lp, ep, dq.data_ptr(), qo, ko, *ints, qo, qo, *rest),
                   (q, k, v, dout, lse, delta, dq.unsqueeze(0), q_offsets, kv_offsets, *ints, q_offsets, q_offsets,
                    *rest))
    return dq, dk, dv


def _remember_backward(
    plan: _attn_plan.Plan, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int,
    causal: bool, window: int | None, scale: float,
) -> None:
    """Keeps a backward plan in the forward's `plan` after `jfa_backward` ran the backward of a
    planned call, where what it launched is the plan's (see above)."""
    from gem_kernels import _triton_jfa as tj
    from gem_kernels._launch import launch_of

    tq, h, d = q.shape
    if tj._FORCED or tj.bwd_uses_flash4(q, k, window) or tj.bwd_uses_flash(q, window):
        return
    cfg = tj.pick_config(max_q_len, max_kv_len, d, q.dtype)
    key = _bwd_key(cfg, q, k, window)
    contiguous = (h * d, d, 1)
    if (key in plan.op.bwd or not cfg.in_order or cfg.tile_list is not False or cfg.kv_split
            or (cfg.one_pass and (cfg.tma or cfg.tma_loads))
            or any(x.stride() != contiguous for x in (q, k, v, out)) or not lse.is_contiguous()):
        return
    dout = dout.contiguous()
    if dout.dtype != q.dtype or dout.shape != q.shape or _attn_plan.aligned_pointers(dout, out, lse) is None:
        return
    # The launches just made, as `jfa_backward` made them, with stand-ins of the same dtypes and
    # strides for its fresh buffers (lse for delta, k / v for dk / dv, q for dQ's workspace).
    dq_acc = torch.empty((tq, h, d), dtype=torch.float32, device=q.device) if cfg.one_pass else k
    b = plan.b
    grid, args, consts = tj.bwd_delta_args(cfg, out, dout, lse, dq_acc)
    delta = _attn_plan.make(launch_of(tj._jfa_bwd_delta_kernel), args, consts, q=q, k=k, v=v, b=b,
                            ints=args[6:10], op=None)
    _, g_dkdv, g_dq = key
    if g_dkdv:  # the Gluon twin ran (`_gluon_jfa.dkdv` at these tiles): its kept binary
        _, gb, consts = _gluon_jfa.dkdv_plan(g_dkdv, k.shape[0], kv_offsets, max_kv_len, h, d, causal)
        args = _gluon_jfa.dkdv_args(q, k, v, dout, lse, lse, k, v, q_offsets, kv_offsets, gb, scale,
                                    scale * tj._LOG2E)
        dkdv = _attn_plan.make(launch_of(_gluon_jfa._jfa_bwd_dkdv_gluon_kernel), args, consts, q=q, k=k, v=v, b=b,
                               ints=args[10:22], op=None)
    else:
        grid, args, consts = tj.bwd_dkdv_args(cfg, q, k, v, dout, lse, lse, k, v, dq_acc, q_offsets, kv_offsets,
                                              max_kv_len, causal, window, scale, False, False)
        dkdv = _attn_plan.make(launch_of(tj._jfa_bwd_dkdv_kernel), args, consts, q=q, k=k, v=v, b=b,
                               ints=args[14:28], op=None)
    dq = None
    if not cfg.one_pass:
        if g_dq:
            _, gb, consts = _gluon_jfa.dq_plan(g_dq, tq, q_offsets, max_q_len, h, d, causal)
            args = _gluon_jfa.dq_args(q, k, v, dout, lse, lse, q, q_offsets, kv_offsets, gb, scale, scale * tj._LOG2E)
            dq = _attn_plan.make(launch_of(_gluon_jfa._jfa_bwd_dq_gluon_kernel), args, consts, q=q, k=k, v=v, b=b,
                                 ints=args[9:19], op=None)
        else:
            grid, args, consts = tj.bwd_dq_args(cfg, q, k, v, dout, lse, lse, q.unsqueeze(0), 1, q_offsets,
                                                kv_offsets, max_q_len, causal, window, scale)
            dq = _attn_plan.make(launch_of(tj._jfa_bwd_dq_kernel), args, consts, q=q, k=k, v=v, b=b,
                                 ints=args[9:19], op=None)
        if dq is None:
            return
    if delta is not None and dkdv is not None:
        plan.op.bwd[key] = _BwdPlan(delta=delta, dkdv=dkdv, dq=dq,
                                    dkdv_block_n=g_dkdv[1] if g_dkdv else cfg.dkdv.block_n,
                                    dq_block_m=g_dq[0] if g_dq else cfg.dq.block_m,
                                    gluon_dkdv=bool(g_dkdv), gluon_dq=bool(g_dq))


class _JfaKvFunction(torch.autograd.Function):
    """Eager autograd for the packed-kv Triton path (`jfa_fwd_kv`'s `register_autograd` twin):
    kv's gradient is one `[Tkv, 2, H, D]` buffer that the backward writes dk and dv into."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        kv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        q_offsets: torch.Tensor,
        kv_offsets: torch.Tensor,
        max_q_len: int,
        max_kv_len: int,
        causal: bool,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        out, lse, k = _run_forward_kv(q, kv, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window,
                                      scale)
        ctx.save_for_backward(q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets)
        ctx.meta = (max_q_len, max_kv_len, causal, window, scale)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets = ctx.saved_tensors
        dq, dkv = _run_backward_kv(dout.contiguous(), q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets,
                                   *ctx.meta)
        return dq, dkv, None, None, None, None, None, None, None, None, None


def _run_forward_kv(
    q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, log2 lse, k): k the rotated keys `[Tkv, H, D]` with rope (one pass), else empty
    (the backward reads kv[:, 0])."""
    from gem_kernels._rope import rotate_slots

    if cos is None or sin is None:
        k = kv.new_empty((0,))
        keys = kv[:, 0]
    else:
        t, _, h, d = kv.shape
        k = rotate_slots((kv[:, 0],), None, cos, sin, kv.new_empty((t, 1, h, d)), forward=True)[:, 0]
        keys = k
    out, lse = _run_forward(q, keys, kv[:, 1], q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)
    return out.contiguous(), lse.contiguous(), k


def _run_backward_kv(
    dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, k: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cos: torch.Tensor | None, sin: torch.Tensor | None, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dkv): dk and dv written into the halves of one contiguous `[Tkv, 2, H, D]` buffer
    (`jfa_backward(into=)`); with rope, dk rotated back in place there, and fresh ones (torch's
    FlashAttention-2 backward) rotated and moved in by the same pass; without, `settle`."""
    from gem_kernels._rope import rotate_slots
    from gem_kernels._triton_jfa import jfa_backward, settle

    rot = cos is not None and sin is not None
    dkv = torch.empty(kv.shape, dtype=kv.dtype, device=kv.device)
    dq, dk, dv = jfa_backward(dout, q, k if rot else kv[:, 0], kv[:, 1], out, lse, q_offsets, kv_offsets, max_q_len,
                              max_kv_len, causal, window, scale, into=(None, dkv[:, 0], dkv[:, 1]))
    if rot:
        assert cos is not None and sin is not None
        rotate_slots((dk,), dv, cos, sin, dkv)
    else:
        settle((dk, dv), dkv)
    return dq, dkv


# --- torch.library registration of the Triton path -------------------------------------------


@torch.library.custom_op("gem_kernels::jfa_fwd", mutates_args=())
def _jfa_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = _run_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)
    # Contiguous whatever q's strides (the fake below promises it; a no-op in practice).
    return out.contiguous(), lse.contiguous()


# The fakes give shapes *and* strides (contiguous): q/k/v may be strided views of one fused
# qkv projection, and torch.compile plans the buffers from these.
@_jfa_fwd.register_fake
def _jfa_fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty(q.shape)
    lse = q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("gem_kernels::jfa_bwd", mutates_args=())
def _jfa_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from gem_kernels._triton_jfa import jfa_backward

    dq, dk, dv = jfa_backward(
        dout, q, k, v, out, lse, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale
    )
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@_jfa_bwd.register_fake
def _jfa_bwd_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _jfa_setup_context(
    ctx: torch.autograd.function.FunctionCtx,
    inputs: tuple[Any, ...],
    output: tuple[torch.Tensor, torch.Tensor],
) -> None:
    q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
    ctx.meta = (max_q_len, max_kv_len, causal, window, scale)  # type: ignore[attr-defined]


def _jfa_backward(
    ctx: torch.autograd.function.FunctionCtx, dout: torch.Tensor, _dlse: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors  # type: ignore[attr-defined]
    max_q_len, max_kv_len, causal, window, scale = ctx.meta  # type: ignore[attr-defined]
    dq, dk, dv = torch.ops.gem_kernels.jfa_bwd(
        dout.contiguous(), q, k, v, out, lse, q_offsets, kv_offsets,
        max_q_len, max_kv_len, causal, window, scale,
    )
    return dq, dk, dv, None, None, None, None, None, None, None


_jfa_fwd.register_autograd(_jfa_backward, setup_context=_jfa_setup_context)


# The packed-kv twins (`jagged_flash_attention_kv`): kv `[Tkv, 2, H, D]` in, dkv out as one
# contiguous buffer (the fake promises it), so no stack of dk and dv follows in the graph.
@torch.library.custom_op("gem_kernels::jfa_fwd_kv", mutates_args=())
def _jfa_fwd_kv(
    q: torch.Tensor,
    kv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_forward_kv(q, kv, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)


@_jfa_fwd_kv.register_fake
def _jfa_fwd_kv_fake(
    q: torch.Tensor,
    kv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k = kv.new_empty((0,)) if cos is None or sin is None else kv.new_empty((kv.shape[0], *kv.shape[2:]))
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32), k


@torch.library.custom_op("gem_kernels::jfa_bwd_kv", mutates_args=())
def _jfa_bwd_kv(
    dout: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    k: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    dq, dkv = _run_backward_kv(dout, q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len,
                               causal, window, scale)
    return dq.contiguous(), dkv


@_jfa_bwd_kv.register_fake
def _jfa_bwd_kv_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    k: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), kv.new_empty(kv.shape)


def _jfa_kv_setup_context(
    ctx: torch.autograd.function.FunctionCtx,
    inputs: tuple[Any, ...],
    output: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    q, kv, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale = inputs
    out, lse, k = output
    ctx.save_for_backward(q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets)
    ctx.meta = (max_q_len, max_kv_len, causal, window, scale)  # type: ignore[attr-defined]


def _jfa_kv_backward(
    ctx: torch.autograd.function.FunctionCtx, dout: torch.Tensor, _dlse: torch.Tensor | None,
    _dk: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets = ctx.saved_tensors  # type: ignore[attr-defined]
    max_q_len, max_kv_len, causal, window, scale = ctx.meta  # type: ignore[attr-defined]
    dq, dkv = torch.ops.gem_kernels.jfa_bwd_kv(
        dout.contiguous(), q, kv, k, out, lse, cos, sin, q_offsets, kv_offsets, max_q_len, max_kv_len, causal,
        window, scale,
    )
    return dq, dkv, None, None, None, None, None, None, None, None, None


_jfa_fwd_kv.register_autograd(_jfa_kv_backward, setup_context=_jfa_kv_setup_context)
