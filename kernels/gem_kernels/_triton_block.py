# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""Triton kernels for BlockAttention (softmax inside fixed blocks, optional fused RoPE).

A block of `block_size` tokens (cut from the start of its sequence; the last may be partial)
only attends to itself, so one program owns one (block, head): it loads q, k, v of the block
once, applies the rotary embedding in registers, does the whole softmax in one tile (no
online rescale) and writes out once. The backward recomputes the block's probabilities from
q and k (no saved log-sum-exp, no O read: `rowsum(P * dP)` replaces `rowsum(dO * O)`), and
rotates dq/dk back in registers, so rotated q/k never touch memory in either direction.

The op is memory-bound (4 * block_size * D * 2 bytes per 2 * block_size^2 * D * 2 FLOPs), so
the grid enumerates only real blocks of the jagged batch (each program finds its sample from
the offsets, `_triton_jfa._locate`), with no padding programs and no helper kernels.

RoPE convention ("rotate half", GPT-NeoX / Llama): with x = [x1, x2] split at D/2,
rot(x) = [x1 cos - x2 sin, x2 cos + x1 sin], `cos`/`sin` of shape [positions, D/2].
"""

from __future__ import annotations

import triton
import triton.language as tl

from gem_kernels._triton_gdpa import _dot
from gem_kernels._triton_jfa import _locate


@triton.jit
def _load_block(X, base, stride_t, rows, ok, offs_h):
    return tl.load(X + base + rows[:, None] * stride_t + offs_h[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _rope(x1, x2, c, s):
    """Rotate-half RoPE in fp32; returns the two rotated halves."""
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _block_head(H, HEADS_INNER: tl.constexpr):
    """(block index, head) of this program: heads inner (a 1-D grid, the heads of one block in
    neighbouring programs, so they read neighbouring bytes of each token's row) or a 2-D grid
    (block, head)."""
    if HEADS_INNER:
        pid0 = tl.program_id(0)
        return pid0 // H, pid0 % H
    return tl.program_id(0), tl.program_id(1)


@triton.jit
def _block_setup(offsets, b, blk, BS: tl.constexpr, BSP: tl.constexpr):
    start = tl.load(offsets + b)
    length = (tl.load(offsets + b + 1) - start).to(tl.int32)
    r = tl.arange(0, BSP)
    pos = blk * BS + r
    ok = (r < BS) & (pos < length)
    return start, pos, ok


@triton.jit
def _block_fwd_kernel(Q, K, V, O, COS, SIN, offsets,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                      stride_c, scale, B, H,
                      D: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, BLOCK_B: tl.constexpr,
                      ROPE: tl.constexpr, PREC: tl.constexpr, HEADS_INNER: tl.constexpr):
    pid, h = _block_head(H, HEADS_INNER)
    b, blk, total = _locate(offsets, pid, B, BS, BLOCK_B)
    if pid >= total:
        return
    start, pos, ok = _block_setup(offsets, b, blk, BS, BSP)
    rows = start + pos
    HALF: tl.constexpr = D // 2
    oh = tl.arange(0, HALF)
    q1 = _load_block(Q, h * stride_qh, stride_qt, rows, ok, oh)
    q2 = _load_block(Q, h * stride_qh + HALF, stride_qt, rows, ok, oh)
    k1 = _load_block(K, h * stride_kh, stride_kt, rows, ok, oh)
    k2 = _load_block(K, h * stride_kh + HALF, stride_kt, rows, ok, oh)
    od = tl.arange(0, D)
    v = _load_block(V, h * stride_vh, stride_vt, rows, ok, od)
    if ROPE:
        c = tl.load(COS + pos[:, None] * stride_c + oh[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.load(SIN + pos[:, None] * stride_c + oh[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        a1, a2 = _rope(q1, q2, c, s)
        q1, q2 = a1.to(v.dtype), a2.to(v.dtype)
        b1, b2 = _rope(k1, k2, c, s)
        k1, k2 = b1.to(v.dtype), b2.to(v.dtype)
    sc = _dot(q1, tl.trans(k1), PREC)
    sc += _dot(q2, tl.trans(k2), PREC)
    sc = tl.where(ok[None, :], sc * (scale * 1.4426950408889634), float("-inf"))
    m = tl.max(sc, 1)
    p = tl.exp2(sc - m[:, None])
    p = p / tl.sum(p, 1)[:, None]
    out = _dot(p.to(v.dtype), v, PREC)
    tl.store(O + h * stride_oh + rows[:, None] * stride_ot + od[None, :], out.to(O.dtype.element_ty),
             mask=ok[:, None])


@triton.jit
def _block_bwd_kernel(Q, K, V, DO, DQ, DK, DV, COS, SIN, offsets,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
                      stride_dqt, stride_dqh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                      stride_c, scale, B, H,
                      D: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, BLOCK_B: tl.constexpr,
                      ROPE: tl.constexpr, PREC: tl.constexpr, HEADS_INNER: tl.constexpr):
    pid, h = _block_head(H, HEADS_INNER)
    b, blk, total = _locate(offsets, pid, B, BS, BLOCK_B)
    if pid >= total:
        return
    start, pos, ok = _block_setup(offsets, b, blk, BS, BSP)
    rows = start + pos
    HALF: tl.constexpr = D // 2
    oh = tl.arange(0, HALF)
    od = tl.arange(0, D)
    q1 = _load_block(Q, h * stride_qh, stride_qt, rows, ok, oh)
    q2 = _load_block(Q, h * stride_qh + HALF, stride_qt, rows, ok, oh)
    k1 = _load_block(K, h * stride_kh, stride_kt, rows, ok, oh)
    k2 = _load_block(K, h * stride_kh + HALF, stride_kt, rows, ok, oh)
    v = _load_block(V, h * stride_vh, stride_vt, rows, ok, od)
    do = _load_block(DO, h * stride_doh, stride_dot, rows, ok, od)
    if ROPE:
        c = tl.load(COS + pos[:, None] * stride_c + oh[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.load(SIN + pos[:, None] * stride_c + oh[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        a1, a2 = _rope(q1, q2, c, s)
        q1, q2 = a1.to(v.dtype), a2.to(v.dtype)
        b1, b2 = _rope(k1, k2, c, s)
        k1, k2 = b1.to(v.dtype), b2.to(v.dtype)
    sc = _dot(q1, tl.trans(k1), PREC)
    sc += _dot(q2, tl.trans(k2), PREC)
    sc = tl.where(ok[None, :], sc * (scale * 1.4426950408889634), float("-inf"))
    m = tl.max(sc, 1)
    p = tl.exp2(sc - m[:, None])
    p = p / tl.sum(p, 1)[:, None]
    dv = _dot(tl.trans(p.to(do.dtype)), do, PREC)
    dp = _dot(do, tl.trans(v), PREC)
    ds = p * (dp - tl.sum(p * dp, 1)[:, None]) * scale
    ds = ds.to(v.dtype)
    dq1 = _dot(ds, k1, PREC)
    dq2 = _dot(ds, k2, PREC)
    dst = tl.trans(ds)
    dk1 = _dot(dst, q1, PREC)
    dk2 = _dot(dst, q2, PREC)
    if ROPE:  # the transpose of the rotation: [g1 cos + g2 sin, g2 cos - g1 sin]
        dq1, dq2 = dq1 * c + dq2 * s, dq2 * c - dq1 * s
        dk1, dk2 = dk1 * c + dk2 * s, dk2 * c - dk1 * s
    tl.store(DQ + h * stride_dqh + rows[:, None] * stride_dqt + oh[None, :], dq1.to(DQ.dtype.element_ty), mask=ok[:, None])
    tl.store(DQ + h * stride_dqh + HALF + rows[:, None] * stride_dqt + oh[None, :], dq2.to(DQ.dtype.element_ty), mask=ok[:, None])
    tl.store(DK + h * stride_dkh + rows[:, None] * stride_dkt + oh[None, :], dk1.to(DK.dtype.element_ty), mask=ok[:, None])
    tl.store(DK + h * stride_dkh + HALF + rows[:, None] * stride_dkt + oh[None, :], dk2.to(DK.dtype.element_ty), mask=ok[:, None])
    tl.store(DV + h * stride_dvh + rows[:, None] * stride_dvt + od[None, :], dv.to(DV.dtype.element_ty), mask=ok[:, None])
