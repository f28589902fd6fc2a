"""Self-attention straight from one fused q/k/v projection, rotary embedding included.

`jagged_flash_attention_qkv(qkv, offsets, max_len, rope=(cos, sin))` is
`jagged_flash_attention(rope(q), rope(k), v, offsets, offsets, ...)` for `qkv [T, 3, H, D]`
(q, k, v = its slots), with the gradient returned as one `[T, 3, H, D]` tensor. Why one op:
composed from parts, autograd hands the projection dq, dk, dv as three tensors and the rotary
backward moves all three into a fresh `[T, 3, H, D]` gradient (`rope_qkv_grad`: 3 reads and 3
writes of a `[T, H, D]` slice; 4.3 ms of a 174 ms h200 step on an H100 for three layers). Here
the attention's backward writes dq, dk and dv into the slots of that gradient itself, and only
q's and k's slots are rotated back, in place (2 reads, 2 writes; v's slot is not touched):
- FlashAttention-4's backward writes all three slots;
- ours writes dk and dv into theirs (dq comes from an fp32 or split workspace and is rotated
  into its slot);
- torch's FlashAttention-2 backward returns fresh tensors: the one pass of `rope_qkv_grad`
  moves them, as before (no gain, no loss).

The forward rotates q and k into one `[T, 2, H, D]` buffer (one Triton pass, which the
backward reuses as the attention's saved q and k); v is read strided from `qkv`. Without
`rope` the op is the packed form of `jagged_flash_attention` (no rotation, dqkv written the
same way). The ops are `gem_kernels::jfa_fwd_qkv` / `jfa_bwd_qkv` (fakes, `register_autograd`,
an eager `autograd.Function` twin), so `torch.compile` traces them without graph breaks.

Tables as `gem_model._jagged.rope_tables` / `rope_qkv_grad`: fp32 `[T, D]`, cos = [cos θ,
cos θ], sin = [-sin θ, sin θ]; rounded to the values' dtype before the fp32 products.
"""

from __future__ import annotations

from typing import Any

import torch

from gem_kernels._jfa import _prepare, _reference, _run_forward
from gem_kernels._rope import rope as rotary, rope_tables_checked, rotate_slots


def jagged_flash_attention_qkv(
    qkv: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    *,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Jagged softmax self-attention of `qkv [T, 3, H, D]` (q, k, v its slots), q and k rotated
    by `rope` first; qkv's gradient is one `[T, 3, H, D]` tensor written by the backward.

    Args:
        qkv: `[T, 3, H, D]`, e.g. `wqkv(x).reshape(T, 3, H, D)` (bf16, fp16 or fp32; any row
            stride, a unit stride on D).
        offsets: int64 `[B+1]` offsets of the sequences (queries and keys alike).
        max_len: host int >= every sequence length.
        rope: optional `(cos, sin)` rotary tables `[T, D]` (fp32; cos = [cos θ, cos θ],
            sin = [-sin θ, sin θ] per row: the rotate-half form) applied to q and k.
        causal, window, scale, backend: as `jagged_flash_attention`.

    Returns:
        `[T, H, D]` in qkv's dtype.
    """
    q, k, v = _qkv_slots(qkv)
    cos, sin = rope_tables_checked(rope, qkv.shape[0], qkv.shape[3], qkv.device)
    backend, scale, offsets, _ = _prepare(q, k, v, offsets, offsets, max_len, max_len, window, scale, backend)
    if backend == "reference":
        if cos is not None and sin is not None:
            q, k = rotary(qkv[:, :2], cos, sin).unbind(1)  # autograd differentiates it
        return _reference(q, k, v, offsets, offsets, max_len, max_len, bool(causal), window, scale)
    args = (qkv, cos, sin, offsets, max_len, bool(causal), window, scale)
    if torch.compiler.is_compiling():
        out, _, _ = torch.ops.gem_kernels.jfa_fwd_qkv(*args)
        return out  # type: ignore[no-any-return]
    if torch.is_grad_enabled() and qkv.requires_grad:
        return _JfaQkvFunction.apply(*args)  # type: ignore[no-untyped-call,no-any-return]
    return _run_forward_qkv(*args)[0]


def _qkv_slots(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v = qkv's slots, after the checks that name `qkv` (the rest, `check_attention`'s,
    run on the slots)."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv.shape={tuple(qkv.shape)} must be [T, 3, H, D] (q, k, v = qkv[:, 0], [:, 1], [:, 2])")
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


def _run_forward_qkv(
    qkv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, offsets: torch.Tensor, max_len: int,
    causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, log2 lse, qk): qk `[T, 2, H, D]` holds rope(q), rope(k) (empty without rope: the
    backward reads q and k from qkv)."""
    if cos is None or sin is None:
        qk = qkv.new_empty((0,))
        q, k = qkv[:, 0], qkv[:, 1]
    else:
        t, _, h, d = qkv.shape
        qk = rotate_slots((qkv[:, 0], qkv[:, 1]), None, cos, sin, qkv.new_empty((t, 2, h, d)), forward=True)
        q, k = qk[:, 0], qk[:, 1]
    out, lse = _run_forward(q, k, qkv[:, 2], offsets, offsets, max_len, max_len, causal, window, scale)
    return out.contiguous(), lse.contiguous(), qk


def _run_backward_qkv(
    dout: torch.Tensor, qkv: torch.Tensor, qk: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cos: torch.Tensor | None, sin: torch.Tensor | None, offsets: torch.Tensor, max_len: int, causal: bool,
    window: int | None, scale: float,
) -> torch.Tensor:
    """dqkv `[T, 3, H, D]`: the attention's backward writes into its slots where its kernel can
    (`jfa_backward(into=)`), then q's and k's slots are rotated back in place; a slot the
    kernel returned fresh is moved in by the same pass (without rope: `settle`)."""
    from gem_kernels._triton_jfa import jfa_backward, settle

    rot = cos is not None and sin is not None
    q, k = (qk[:, 0], qk[:, 1]) if rot else (qkv[:, 0], qkv[:, 1])
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    slots = (dqkv[:, 0], dqkv[:, 1], dqkv[:, 2])
    dq, dk, dv = jfa_backward(dout, q, k, qkv[:, 2], out, lse, offsets, offsets, max_len, max_len, causal, window,
                              scale, into=slots)
    if rot:
        assert cos is not None and sin is not None
        rotate_slots((dq, dk), dv, cos, sin, dqkv)
        return dqkv
    return settle((dq, dk, dv), dqkv)


class _JfaQkvFunction(torch.autograd.Function):
    """Eager autograd for the Triton path (`jfa_fwd_qkv`'s `register_autograd` twin)."""

    @staticmethod
    def forward(ctx: Any, qkv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                offsets: torch.Tensor, max_len: int, causal: bool, window: int | None, scale: float) -> torch.Tensor:
        out, lse, qk = _run_forward_qkv(qkv, cos, sin, offsets, max_len, causal, window, scale)
        ctx.save_for_backward(qkv, qk, out, lse, cos, sin, offsets)
        ctx.meta = (max_len, causal, window, scale)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qkv, qk, out, lse, cos, sin, offsets = ctx.saved_tensors
        dqkv = _run_backward_qkv(dout.contiguous(), qkv, qk, out, lse, cos, sin, offsets, *ctx.meta)
        return dqkv, None, None, None, None, None, None, None


# --- torch.library registration ------------------------------------------------------------------


@torch.library.custom_op("gem_kernels::jfa_fwd_qkv", mutates_args=())
def _jfa_fwd_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    offsets: torch.Tensor,
    max_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_forward_qkv(qkv, cos, sin, offsets, max_len, causal, window, scale)


@_jfa_fwd_qkv.register_fake
def _jfa_fwd_qkv_fake(
    qkv: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    offsets: torch.Tensor,
    max_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, _, h, d = qkv.shape
    qk = qkv.new_empty((0,)) if cos is None or sin is None else qkv.new_empty((t, 2, h, d))
    return qkv.new_empty((t, h, d)), qkv.new_empty((t, h), dtype=torch.float32), qk


@torch.library.custom_op("gem_kernels::jfa_bwd_qkv", mutates_args=())
def _jfa_bwd_qkv(
    dout: torch.Tensor,
    qkv: torch.Tensor,
    qk: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    offsets: torch.Tensor,
    max_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    return _run_backward_qkv(dout, qkv, qk, out, lse, cos, sin, offsets, max_len, causal, window, scale)


@_jfa_bwd_qkv.register_fake
def _jfa_bwd_qkv_fake(
    dout: torch.Tensor,
    qkv: torch.Tensor,
    qk: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    offsets: torch.Tensor,
    max_len: int,
    causal: bool,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    return torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)


def _jfa_qkv_setup_context(
    ctx: torch.autograd.function.FunctionCtx, inputs: tuple[Any, ...],
    output: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    qkv, cos, sin, offsets, max_len, causal, window, scale = inputs
    out, lse, qk = output
    ctx.save_for_backward(qkv, qk, out, lse, cos, sin, offsets)
    ctx.meta = (max_len, causal, window, scale)  # type: ignore[attr-defined]


def _jfa_qkv_backward(
    ctx: torch.autograd.function.FunctionCtx, dout: torch.Tensor, _dlse: torch.Tensor | None,
    _dqk: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    qkv, qk, out, lse, cos, sin, offsets = ctx.saved_tensors  # type: ignore[attr-defined]
    max_len, causal, window, scale = ctx.meta  # type: ignore[attr-defined]
    dqkv = torch.ops.gem_kernels.jfa_bwd_qkv(
        dout.contiguous(), qkv, qk, out, lse, cos, sin, offsets, max_len, causal, window, scale,
    )
    return dqkv, None, None, None, None, None, None, None


_jfa_fwd_qkv.register_autograd(_jfa_qkv_backward, setup_context=_jfa_qkv_setup_context)
