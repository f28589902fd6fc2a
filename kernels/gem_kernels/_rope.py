# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""The gradient of a fused q/k/v projection behind rotary embeddings, in one pass.

`rope_qkv_grad(dq, dk, dv, cos, sin)` returns `dqkv [T, 3, H, D]`: slot 0 and 1 are dq and dk
rotated back (the rotate-half rotation's transpose, the rotation by -θ), slot 2 is dv. It is
the backward of "q, k = rope(qkv[:, :2]); v = qkv[:, 2]" (gem_model's `_jagged.rope_qkv`).

Why a kernel: in the h200 trainer the attention backward hands back dq, dk, dv as three
tensors, and the projection's backward wants them as one `[T, 3, H, D]` gradient. Compiled by
inductor, autograd's form of that took two passes over the gradient per layer, and a single
`torch.stack` of the three slots took one pass at ~2.6 TB/s (1.23 ms for 3.2 GB on an H200;
its cat lowering selects among the three sources per element). This kernel reads each source
once and writes its slot with plain row blocks.

Tables as `gem_model._jagged.rope_tables`: fp32 `[T, D]`, cos = [cos θ, cos θ] and
sin = [-sin θ, sin θ]. As the torch form, the tables are rounded to the gradient's dtype
before the products, which run in fp32 with one rounding at the store.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from gem_kernels._jagged import check_triton_device, resolve_backend, same_view
from gem_kernels._launch import cdiv


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of `x [T, ..., D]` with tables `[T, D]` (cos = [cos θ,
    cos θ], sin = [-sin θ, sin θ]), in plain PyTorch (differentiable):
    `(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)`. The middle axes broadcast, so q and k
    rotate in one pass as `[T, 2, H, D]` (three kernels in eager, one compiled). The rotary
    ops' reference paths and gem-model's layers use it."""
    half = x.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    c, s = cos.reshape(shape).to(x.dtype), sin.reshape(shape).to(x.dtype)
    return torch.addcmul(x * c, torch.cat((x[..., half:], x[..., :half]), dim=-1), s)


def rope_tables_checked(rope: Any, t: int, d: int, device: torch.device) -> tuple[torch.Tensor | None,
                                                                                 torch.Tensor | None]:
    """(cos, sin) from `rope` after its checks (`[T, D]` floating tables on the values'
    device, an even D), or (None, None)."""
    if rope is None:
        return None, None
    if not isinstance(rope, tuple) or len(rope) != 2 or not all(isinstance(x, torch.Tensor) for x in rope):
        raise TypeError(f"rope must be None or a (cos, sin) tuple of two tensors, got {type(rope).__name__}")
    for name, tab in zip(("cos", "sin"), rope):
        if tuple(tab.shape) != (t, d):
            raise ValueError(f"rope's {name}.shape={tuple(tab.shape)} must be [T, D] = {(t, d)} (one row per token)")
        if not tab.dtype.is_floating_point or tab.device != device:
            raise ValueError(f"rope's {name} must be a floating tensor on {device}, got {tab.dtype} on {tab.device}")
    if d % 2:
        raise ValueError(f"rope needs an even head dim, got D={d}")
    return rope[0], rope[1]


def rope_qkv_grad_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: stack(rot(dq), rot(dk), dv) with rot(g) = g*cos + swap_halves(g)*(-sin)."""
    half = dq.shape[-1] // 2

    def rot(g: torch.Tensor) -> torch.Tensor:
        c = cos[:, None, :].to(g.dtype).float()
        s = sin[:, None, :].to(g.dtype).float()
        gf = g.float()
        swapped = torch.cat((gf[..., half:], gf[..., :half]), dim=-1)
        return (gf * c - swapped * s).to(g.dtype)

    return torch.stack((rot(dq), rot(dk), dv.to(dq.dtype)), dim=1)


@triton.jit
def _rot_slot(SRC, s_t, s_h, o_row, h, r64, cols, ok, c, s, HALF: tl.constexpr):
    """One head of one slot: (g1, g2) -> (g1 c + g2 s, g2 c - g1 s) into o_row. Both halves are
    loaded before either is stored, so SRC may be the output slot itself (in place)."""
    dt = o_row.dtype.element_ty
    row = SRC + r64 * s_t + h * s_h + cols[None, :]
    g1 = tl.load(row, mask=ok, other=0.0).to(tl.float32)
    g2 = tl.load(row + HALF, mask=ok, other=0.0).to(tl.float32)
    tl.store(o_row, (g1 * c + g2 * s).to(dt), mask=ok)
    tl.store(o_row + HALF, (g2 * c - g1 * s).to(dt), mask=ok)


@triton.jit
def _one_head(S0, S1, SV, OUT, h, r64, cols, ok, c, s, s0t, s0h, s1t, s1h, svt, svh, s_ot, s_os, s_oh,
              HALF: tl.constexpr, N_ROT: tl.constexpr, COPY_V: tl.constexpr):
    o_row = OUT + r64 * s_ot + h * s_oh + cols[None, :]
    _rot_slot(S0, s0t, s0h, o_row, h, r64, cols, ok, c, s, HALF)  # slot 0
    if N_ROT == 2:
        _rot_slot(S1, s1t, s1h, o_row + s_os, h, r64, cols, ok, c, s, HALF)  # slot 1
    if COPY_V:  # the next slot, as is
        dt = OUT.dtype.element_ty
        v_row = SV + r64 * svt + h * svh + cols[None, :]
        tl.store(o_row + N_ROT * s_os, tl.load(v_row, mask=ok, other=0.0).to(dt), mask=ok)
        tl.store(o_row + N_ROT * s_os + HALF, tl.load(v_row + HALF, mask=ok, other=0.0).to(dt), mask=ok)


@triton.jit
def _rope_slots_kernel(
    S0, S1, SV, COS, SIN, OUT, T, H,
    s0t, s0h, s1t, s1h, svt, svh, s_ct, s_ot, s_os, s_oh,
    HALF: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_LOOP: tl.constexpr, N_ROT: tl.constexpr,
    COPY_V: tl.constexpr, FORWARD: tl.constexpr,
):
    """OUT[:, i] = rot(S_i) for the N_ROT rotated slots, then OUT[:, N_ROT] = SV if COPY_V.
    rot is the rotation by -θ (a gradient's, the default) or by +θ (FORWARD).
    HEAD_LOOP: one program per row block walks every head (the tables are read once per
    row); else one program per (row block, head) (the tables are read once per head). A
    source may be its own output slot: every element is read and written by one program."""
    pid_t = tl.program_id(0)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, HALF)
    ok = rows[:, None] < T
    r64 = rows.to(tl.int64)[:, None]
    dt = OUT.dtype.element_ty
    # Tables: cos[:, :HALF] == cos[:, HALF:], sin[:, HALF:] == -sin[:, :HALF] == +sin θ.
    c = tl.load(COS + r64 * s_ct + cols[None, :], mask=ok, other=0.0).to(dt).to(tl.float32)
    s = tl.load(SIN + r64 * s_ct + HALF + cols[None, :], mask=ok, other=0.0).to(dt).to(tl.float32)
    if FORWARD:
        s = -s
    if HEAD_LOOP:
        for h in range(0, H):
            _one_head(S0, S1, SV, OUT, h, r64, cols, ok, c, s, s0t, s0h, s1t, s1h, svt, svh, s_ot, s_os, s_oh,
                      HALF, N_ROT, COPY_V)
    else:
        _one_head(S0, S1, SV, OUT, tl.program_id(1), r64, cols, ok, c, s, s0t, s0h, s1t, s1h, svt, svh, s_ot,
                  s_os, s_oh, HALF, N_ROT, COPY_V)


def _check(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, g in (("dk", dk), ("dv", dv)):
        if g.shape != dq.shape:
            raise ValueError(f"{name} must have dq's shape {tuple(dq.shape)}, got {tuple(g.shape)}")
    if dq.dim() != 3:
        raise ValueError(f"dq must be [T, H, D], got {tuple(dq.shape)}")
    t, _, d = dq.shape
    if d % 2:
        raise ValueError(f"the head dim D={d} must be even (rotate-half pairs)")
    for name, tab in (("cos", cos), ("sin", sin)):
        if tab.shape != (t, d):
            raise ValueError(f"{name} must be [T, D] = {(t, d)}, got {tuple(tab.shape)}")
    if not dq.dtype.is_floating_point or dk.dtype != dq.dtype or dv.dtype != dq.dtype:
        raise ValueError(f"dq, dk, dv must share one floating dtype, got {dq.dtype}, {dk.dtype}, {dv.dtype}")


def _triton_rule_broken(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot take these gradients (None: it can)."""
    d = dq.shape[-1]
    if (d // 2) & (d // 2 - 1):
        return f"backend='triton' needs D/2 a power of two, got D={d} (use backend='reference')"
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        if g.stride(2) != 1:
            return f"{name} must have a unit stride on D, got strides {g.stride()}"
    return None


# Rows per program, warps, and whether a program walks every head of its rows (the bench's
# sweep: `python3 -m gem_kernels.bench.rope`; H200: 64 rows, 8 warps, every head per program,
# 0.95 ms against 1.15 ms for the best one-head-per-program launch: the tables read once per row).
BLOCK_T, NUM_WARPS, HEAD_LOOP = 64, 8, True



def rope_qkv_grad_triton(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, block_t: int = 0, num_warps: int = 0,
                         head_loop: bool | None = None) -> torch.Tensor:
    reason = _triton_rule_broken(dq, dk, dv)
    if reason:
        raise ValueError(reason)
    t, h, d = dq.shape
    out = dq.new_empty((t, 3, h, d))
    return rotate_slots_triton((dq, dk), dv, cos, sin, out, block_t=block_t, num_warps=num_warps,
                               head_loop=head_loop)


def rotate_slots_triton(rot: tuple[torch.Tensor, ...], copy: torch.Tensor | None, cos: torch.Tensor,
                        sin: torch.Tensor, out: torch.Tensor, *, forward: bool = False, block_t: int = 0,
                        num_warps: int = 0, head_loop: bool | None = None) -> torch.Tensor:
    """`out[:, i] = rot⁻¹(rot[i])` (or rot by +θ with `forward`) for one or two `[T, H, D]`
    sources, then `out[:, len(rot)] = copy`, in one pass; returns `out` `[T, S, H, D]`.

    A source may be its own slot of `out` (the same view): it is rotated in place, and a
    `copy` that already is its slot is not copied. That is how the attention ops finish their
    backward: FlashAttention-4 writes dq, dk, dv into the slots of the projection's gradient,
    and only q's and k's slots are rotated back, in place (`_jfa_qkv`). Any row/head strides;
    a unit stride on D; D/2 a power of two (callers check `_triton_rule_broken`)."""
    t, h, d = rot[0].shape
    check_triton_device(rot[0].device)
    if t == 0 or h == 0:
        return out
    cos, sin = cos.contiguous(), sin.contiguous()
    s0 = rot[0]
    s1 = rot[1] if len(rot) > 1 else s0
    copy_v = copy is not None and not same_view(copy, out[:, len(rot)])
    sv = copy if copy is not None else s0
    block_t = block_t or BLOCK_T
    loop = HEAD_LOOP if head_loop is None else head_loop
    _rope_slots_kernel[(cdiv(t, block_t), 1 if loop else h)](
        s0, s1, sv, cos, sin, out, t, h,
        s0.stride(0), s0.stride(1), s1.stride(0), s1.stride(1), sv.stride(0), sv.stride(1),
        cos.stride(0), out.stride(0), out.stride(1), out.stride(2),
        HALF=d // 2, BLOCK_T=block_t, HEAD_LOOP=loop, N_ROT=len(rot), COPY_V=copy_v, FORWARD=forward,
        num_warps=num_warps or NUM_WARPS,
    )
    return out


def rotate_slots_reference(rot: tuple[torch.Tensor, ...], copy: torch.Tensor | None, cos: torch.Tensor,
                           sin: torch.Tensor, out: torch.Tensor, *, forward: bool = False) -> torch.Tensor:
    """Plain PyTorch `rotate_slots_triton` (the same roundings: tables to the dtype, fp32
    products, one rounding at the store); every value is computed before any is written."""
    half = rot[0].shape[-1] // 2
    c = cos[:, None, :].to(out.dtype).float()
    s = sin[:, None, :].to(out.dtype).float() * (-1.0 if forward else 1.0)

    def one(g: torch.Tensor) -> torch.Tensor:
        gf = g.float()
        swapped = torch.cat((gf[..., half:], gf[..., :half]), dim=-1)
        return (gf * c - swapped * s).to(out.dtype)

    vals = [one(g) for g in rot]
    for i, val in enumerate(vals):
        out[:, i].copy_(val)
    if copy is not None and not same_view(copy, out[:, len(rot)]):
        out[:, len(rot)].copy_(copy)
    return out


def rotate_slots(rot: tuple[torch.Tensor, ...], copy: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 out: torch.Tensor, *, forward: bool = False) -> torch.Tensor:
    """`rotate_slots_triton` where it runs (CUDA or the interpreter, its rules hold), else its
    reference. Internal to the attention ops' custom-op bodies (not differentiable)."""
    d = rot[0].shape[-1]
    runs = rot[0].device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    ok = not (d // 2) & (d // 2 - 1) and all(
        t.stride(-1) == 1 for t in (*rot, out, *((copy,) if copy is not None else ())))
    if runs and ok:
        return rotate_slots_triton(rot, copy, cos, sin, out, forward=forward)
    return rotate_slots_reference(rot, copy, cos, sin, out, forward=forward)


@torch.library.custom_op("gem_kernels::rope_qkv_grad", mutates_args=())
def _rope_qkv_grad_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
    return rope_qkv_grad_triton(dq, dk, dv, cos, sin)


@_rope_qkv_grad_op.register_fake
def _rope_qkv_grad_fake(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor) -> torch.Tensor:
    t, h, d = dq.shape
    return dq.new_empty((t, 3, h, d))


def rope_qkv_grad(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  *, backend: str = "auto") -> torch.Tensor:
    """`dqkv [T, 3, H, D]` = (rope⁻¹(dq), rope⁻¹(dk), dv) (see the module docstring).

    backend: "auto" (Triton on CUDA when the kernel's rules hold — D/2 a power of two, a unit
    stride on D — the reference otherwise), "triton", "reference".
    Not differentiable itself (it is a backward).
    """
    _check(dq, dk, dv, cos, sin)
    b = resolve_backend(backend, dq.device)
    if backend == "auto" and b == "triton" and _triton_rule_broken(dq, dk, dv):
        b = "reference"
    if b == "reference":
        return rope_qkv_grad_reference(dq, dk, dv, cos, sin)
    if b != "triton":
        raise ValueError(f"backend={backend!r} must be 'auto', 'triton' or 'reference'")
    out: torch.Tensor = torch.ops.gem_kernels.rope_qkv_grad(dq, dk, dv, cos, sin)
    return out
