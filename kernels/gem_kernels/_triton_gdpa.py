# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""Triton kernels for Generalized Dot-Product Attention (elementwise activations).

GDPA computes `out_i = sum_j act(scale * q_i . k_j) * v_j / divisor` over the visible keys of
the same sample. Unlike softmax there is no row normalisation, so the forward is one pass with
no running max / rescale and the backward needs no `rowsum(dO * O)` correction term:

    S = scale * Q K^T,   P = act(S) * mask / divisor,   O = P V
    dV = P^T dO,   dP = dO V^T,   dS = dP * act'(S) * mask / divisor
    dQ = scale * dS K,   dK = scale * dS^T Q

Grid: one program per (q tile, head) for the forward and dQ, one per (kv tile, head) for
dK/dV, in the order `GdpaTiles.schedule` names (JFA's `_triton_jfa._schedule`). The default,
batch order, enumerates the tiles over the *jagged* batch (the grid size is the host-known
upper bound `T // BLOCK + B`), so no program is wasted on padding and no host sync is
needed; each program finds its sample from the offsets itself (`_locate`: cumsum of
per-sample tile counts), so a call is one kernel launch with no helper kernels before it.

Within a tile's key loop, blocks fully visible to every row run without masking; only the
(at most two) boundary ranges pay for the mask.

Activations are selected by the constexpr string `ACT`; `_act` / `_dact` below must have one
branch per entry of `gem_kernels._gdpa.ACTIVATIONS` (value and derivative).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gem_kernels._triton_jfa import _locate, _schedule

_GELU_C = 0.7978845608028654  # sqrt(2 / pi)
_GELU_A = 0.044715


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b in fp32. PREC "upcast" works around the CPU interpreter, whose bf16 dot is wrong."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _sigmoid(x, TANH: tl.constexpr):
    """Fast sigmoid in fp32.

    TANH (16-bit inputs on the GPU): sigma(x) = 1/2 + tanh(x/2)/2 with PTX `tanh.approx.f32`,
    one special-function (MUFU) op per score instead of two (exp2 + reciprocal); max relative
    error of tanh.approx ~2^-11, below bf16/fp16 rounding. The SFU is what bounds the GDPA
    loop (kernels/BENCHMARKS.md, GDPA). Otherwise: exp2 and the approximate division, ~2 ulp
    (also the interpreter's path: it cannot run inline PTX).
    """
    if TANH:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x * 0.5], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return 0.5 + 0.5 * t
    return tl.fdiv(1.0, 1.0 + tl.exp2(x * -1.4426950408889634), ieee_rounding=False)


@triton.jit
def _act(x, ACT: tl.constexpr, TANH: tl.constexpr):
    """act(x) in fp32. One branch per activation (keep in sync with _gdpa.ACTIVATIONS)."""
    if ACT == "silu":
        y = x * _sigmoid(x, TANH)
    elif ACT == "gelu":
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = x * _sigmoid(2.0 * u, TANH)  # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u)
    elif ACT == "relu":
        y = tl.maximum(x, 0.0)
    elif ACT == "relu2":
        r = tl.maximum(x, 0.0)
        y = r * r
    elif ACT == "sigmoid":
        y = _sigmoid(x, TANH)
    elif ACT == "identity":
        y = x
    else:
        tl.static_assert(False, "unknown activation")
    return y


@triton.jit
def _act_and_grad(x, ACT: tl.constexpr, TANH: tl.constexpr):
    """(act(x), act'(x)) in fp32."""
    if ACT == "silu":
        s = _sigmoid(x, TANH)
        y = x * s
        g = s * (1.0 + x * (1.0 - s))
    elif ACT == "gelu":
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        s = _sigmoid(2.0 * u, TANH)  # (1 + tanh(u)) / 2
        y = x * s
        # d/dx [x * (1 + t) / 2] = (1 + t) / 2 + x * (1 - t^2) / 2 * u'
        # with (1 + t) / 2 = s and (1 - t^2) / 2 = 2 s (1 - s)
        g = s + 2.0 * x * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    elif ACT == "relu":
        y = tl.maximum(x, 0.0)
        g = tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == "relu2":
        r = tl.maximum(x, 0.0)
        y = r * r
        g = 2.0 * r
    elif ACT == "sigmoid":
        s = _sigmoid(x, TANH)
        y = s
        g = s * (1.0 - s)
    elif ACT == "identity":
        y = x
        g = x * 0.0 + 1.0
    else:
        tl.static_assert(False, "unknown activation")
    return y, g


@triton.jit
def _visible(offs_i, offs_j, shift, window, lo, hi, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Visibility [BM, BN] of key j to query i (the JFA rule) restricted to keys [lo, hi)."""
    return _vis(offs_i[:, None] + shift, offs_j[None, :], window, lo, hi, CAUSAL, HAS_WINDOW)


@triton.jit
def _vis(ip, j, window, lo, hi, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """The rule on broadcast operands: ip = query position on the key axis, j = key."""
    m = (j >= lo) & (j < hi)
    if CAUSAL:
        m = m & (j <= ip)
    if HAS_WINDOW:
        m = m & (j > ip - window)
        if not CAUSAL:
            m = m & (j < ip + window)
    return m


@triton.jit
def _q_tile_ranges(first_i, last_i, shift, window, kv_len, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key ranges for query rows [first_i, last_i]: any row sees [lo, hi), all rows see [flo, fhi)."""
    lo = 0
    flo = 0
    hi = kv_len
    fhi = kv_len
    if CAUSAL:
        hi = tl.minimum(hi, last_i + shift + 1)
        fhi = tl.minimum(fhi, first_i + shift + 1)
    if HAS_WINDOW:
        lo = tl.maximum(lo, first_i + shift - window + 1)
        flo = tl.maximum(flo, last_i + shift - window + 1)
        if not CAUSAL:
            hi = tl.minimum(hi, last_i + shift + window)
            fhi = tl.minimum(fhi, first_i + shift + window)
    return lo, hi, flo, fhi


@triton.jit
def _kv_tile_ranges(first_j, last_j, shift, window, q_len, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Query ranges for key columns [first_j, last_j]: any col seen by [lo, hi), all by [flo, fhi)."""
    lo = 0
    flo = 0
    hi = q_len
    fhi = q_len
    if CAUSAL:  # j <= i + shift  <=>  i >= j - shift
        lo = tl.maximum(lo, first_j - shift)
        flo = tl.maximum(flo, last_j - shift)
    if HAS_WINDOW:  # j > i + shift - w  <=>  i < j - shift + w
        hi = tl.minimum(hi, last_j - shift + window)
        fhi = tl.minimum(fhi, first_j - shift + window)
        if not CAUSAL:  # j < i + shift + w  <=>  i > j - shift - w
            lo = tl.maximum(lo, first_j - shift - window + 1)
            flo = tl.maximum(flo, last_j - shift - window + 1)
    return lo, hi, flo, fhi


@triton.jit
def _split(lo, hi, flo, fhi, BLOCK: tl.constexpr):
    """Split [lo, hi) into masked [lo, m1), unmasked whole blocks [m1, m2), masked [m2, hi)."""
    m1 = tl.minimum(tl.maximum(flo, lo), hi)
    n_full = tl.maximum(fhi - m1, 0) // BLOCK
    m2 = m1 + n_full * BLOCK
    return m1, m2


@triton.jit
def _fwd_inner(acc, q, K, V, stride_kt, stride_vt, offs_m, offs_d, start, end, r_lo, r_hi,
               shift, window, scale, ACT: tl.constexpr, TANH: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASKED:
            ld = (offs_n >= r_lo) & (offs_n < r_hi)
            k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :], mask=ld[:, None], other=0.0)
            v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :], mask=ld[:, None], other=0.0)
        else:
            k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :])
            v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :])
        s = _dot(q, tl.trans(k), PREC) * scale
        p = _act(s, ACT, TANH)
        if MASKED:
            p = tl.where(_visible(offs_m, offs_n, shift, window, r_lo, r_hi, CAUSAL, HAS_WINDOW), p, 0.0)
        acc += _dot(p.to(v.dtype), v, PREC)
    return acc


@triton.jit
def _gdpa_fwd_kernel(Q, K, V, O, q_offsets, kv_offsets,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                     scale, inv_div, window, B, H, CUM, ORDER,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     ACT: tl.constexpr, TANH: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
                     TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr):
    b, h, start, ok = _schedule(q_offsets, CUM, ORDER, H, B, BLOCK_M, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    m_block = start // BLOCK_M
    q_start = tl.load(q_offsets + b)
    q_len = (tl.load(q_offsets + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(kv_offsets + b)
    kv_len = (tl.load(kv_offsets + b + 1) - kv_start).to(tl.int32)
    shift = kv_len - q_len

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    q = tl.load((Q + h * stride_qh + q_start * stride_qt) + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    Kh = K + h * stride_kh + kv_start * stride_kt  # this sample's first key row: 32-bit offsets below
    Vh = V + h * stride_vh + kv_start * stride_vt

    first_i = m_block * BLOCK_M
    last_i = tl.minimum(first_i + BLOCK_M, q_len) - 1
    lo, hi, flo, fhi = _q_tile_ranges(first_i, last_i, shift, window, kv_len, CAUSAL, HAS_WINDOW)
    m1, m2 = _split(lo, hi, flo, fhi, BLOCK_N)

    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    acc = _fwd_inner(acc, q, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, lo, m1, lo, m1,
                     shift, window, scale, ACT, TANH, True, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    acc = _fwd_inner(acc, q, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, m1, m2, m1, m2,
                     shift, window, scale, ACT, TANH, False, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    acc = _fwd_inner(acc, q, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, m2, hi, m2, hi,
                     shift, window, scale, ACT, TANH, True, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    out = acc * inv_div
    tl.store((O + h * stride_oh + q_start * stride_ot) + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dq_inner(dq, q, do, K, V, stride_kt, stride_vt, offs_m, offs_d, start, end,
              r_lo, r_hi, shift, window, scale, inv_div, ACT: tl.constexpr, TANH: tl.constexpr, MASKED: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ld = (offs_n >= r_lo) & (offs_n < r_hi)
        if MASKED:
            k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :], mask=ld[:, None], other=0.0)
            v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :], mask=ld[:, None], other=0.0)
        else:
            k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :])
            v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :])
        s = _dot(q, tl.trans(k), PREC) * scale
        _, g = _act_and_grad(s, ACT, TANH)
        dp = _dot(do, tl.trans(v), PREC)
        ds = dp * g * inv_div
        if MASKED:
            vis = _visible(offs_m, offs_n, shift, window, r_lo, r_hi, CAUSAL, HAS_WINDOW)
            ds = tl.where(vis, ds, 0.0)
        dq += _dot(ds.to(k.dtype), k, PREC)
    return dq


@triton.jit
def _gdpa_bwd_dq_kernel(Q, K, V, DO, DQ, q_offsets, kv_offsets,
                        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                        stride_dot, stride_doh, stride_dqt, stride_dqh,
                        scale, inv_div, window, B, H, CUM, ORDER,
                        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        ACT: tl.constexpr, TANH: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
                        TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr):
    b, h, start, ok = _schedule(q_offsets, CUM, ORDER, H, B, BLOCK_M, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    m_block = start // BLOCK_M
    q_start = tl.load(q_offsets + b)
    q_len = (tl.load(q_offsets + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(kv_offsets + b)
    kv_len = (tl.load(kv_offsets + b + 1) - kv_start).to(tl.int32)
    shift = kv_len - q_len

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    q = tl.load((Q + h * stride_qh + q_start * stride_qt) + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load((DO + h * stride_doh + q_start * stride_dot) + offs_m[:, None] * stride_dot + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    Kh = K + h * stride_kh + kv_start * stride_kt  # this sample's first key row: 32-bit offsets below
    Vh = V + h * stride_vh + kv_start * stride_vt

    first_i = m_block * BLOCK_M
    last_i = tl.minimum(first_i + BLOCK_M, q_len) - 1
    lo, hi, flo, fhi = _q_tile_ranges(first_i, last_i, shift, window, kv_len, CAUSAL, HAS_WINDOW)
    m1, m2 = _split(lo, hi, flo, fhi, BLOCK_N)

    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    dq = _dq_inner(dq, q, do, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, lo, m1, lo, m1,
                   shift, window, scale, inv_div, ACT, TANH, True, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    dq = _dq_inner(dq, q, do, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, m1, m2, m1, m2,
                   shift, window, scale, inv_div, ACT, TANH, False, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    dq = _dq_inner(dq, q, do, Kh, Vh, stride_kt, stride_vt, offs_m, offs_d, m2, hi, m2, hi,
                   shift, window, scale, inv_div, ACT, TANH, True, CAUSAL, HAS_WINDOW, BLOCK_N, PREC)
    dq = dq * scale
    tl.store((DQ + h * stride_dqh + q_start * stride_dqt) + offs_m[:, None] * stride_dqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q, DO, DQA, stride_qt, stride_dot, stride_dqat, offs_n, offs_d, start, end,
                r_lo, r_hi, shift, window, scale, inv_div, ACT: tl.constexpr, TANH: tl.constexpr, MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr,
                DQ_ATOMIC: tl.constexpr):
    """dV += Pᵀ dO and dK += dSᵀ Q over the q rows [start, end) (transposed tiles). DQ_ATOMIC
    (the one-pass backward): also dQ[rows] += scale · dS K, added with relaxed atomics into the
    fp32 workspace `DQA` (this head's base; other kv tiles of the sample add to the same rows,
    so the sum's order, and its last bits, vary from run to run). Rows outside [r_lo, r_hi) of
    a masked tile (another sample's, or past the end) are never touched."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if MASKED:
            ld = (offs_m >= r_lo) & (offs_m < r_hi)
            q = tl.load(Q + offs_m[:, None] * stride_qt + offs_d[None, :], mask=ld[:, None], other=0.0)
            do = tl.load(DO + offs_m[:, None] * stride_dot + offs_d[None, :], mask=ld[:, None], other=0.0)
        else:
            q = tl.load(Q + offs_m[:, None] * stride_qt + offs_d[None, :])
            do = tl.load(DO + offs_m[:, None] * stride_dot + offs_d[None, :])
        # Transposed scores: sT[j, i] = scale * k_j . q_i
        st = _dot(k, tl.trans(q), PREC) * scale
        pt, g = _act_and_grad(st, ACT, TANH)
        dpt = _dot(v, tl.trans(do), PREC)
        pt = pt * inv_div
        dst = dpt * g * inv_div
        if MASKED:
            # [BN, BM] directly (no transpose of a bool tile); rows outside [r_lo, r_hi) off.
            vis = _vis(offs_m[None, :] + shift, offs_n[:, None], window, 0, 2147483647, CAUSAL, HAS_WINDOW)
            vis = vis & ld[None, :]
            pt = tl.where(vis, pt, 0.0)
            dst = tl.where(vis, dst, 0.0)
        dv += _dot(pt.to(do.dtype), do, PREC)
        ds16 = dst.to(q.dtype)
        dk += _dot(ds16, q, PREC)
        if DQ_ATOMIC:
            dq = _dot(tl.trans(ds16), k, PREC) * scale
            dq_ptrs = DQA + offs_m[:, None] * stride_dqat + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq, mask=ld[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _gdpa_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, DQA, q_offsets, kv_offsets,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                          stride_dot, stride_doh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                          stride_dqat, stride_dqah,
                          scale, inv_div, window, B, H, CUM, ORDER,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          ACT: tl.constexpr, TANH: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
                          TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr,
                          DQ_ATOMIC: tl.constexpr):
    b, h, start, ok = _schedule(kv_offsets, CUM, ORDER, H, B, BLOCK_N, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    n_block = start // BLOCK_N
    q_start = tl.load(q_offsets + b)
    q_len = (tl.load(q_offsets + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(kv_offsets + b)
    kv_len = (tl.load(kv_offsets + b + 1) - kv_start).to(tl.int32)
    shift = kv_len - q_len

    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < kv_len
    k = tl.load((K + h * stride_kh + kv_start * stride_kt) + offs_n[:, None] * stride_kt + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    v = tl.load((V + h * stride_vh + kv_start * stride_vt) + offs_n[:, None] * stride_vt + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    Qh = Q + h * stride_qh + q_start * stride_qt  # this sample's first query row: 32-bit offsets below
    DOh = DO + h * stride_doh + q_start * stride_dot
    DQAh = DQA + h * stride_dqah + q_start * stride_dqat

    first_j = n_block * BLOCK_N
    last_j = tl.minimum(first_j + BLOCK_N, kv_len) - 1
    lo, hi, flo, fhi = _kv_tile_ranges(first_j, last_j, shift, window, q_len, CAUSAL, HAS_WINDOW)
    m1, m2 = _split(lo, hi, flo, fhi, BLOCK_M)

    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, DQAh, stride_qt, stride_dot, stride_dqat, offs_n, offs_d,
                         lo, m1, lo, m1, shift, window, scale, inv_div, ACT, TANH, True, CAUSAL,
                         HAS_WINDOW, BLOCK_M, PREC, DQ_ATOMIC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, DQAh, stride_qt, stride_dot, stride_dqat, offs_n, offs_d,
                         m1, m2, m1, m2, shift, window, scale, inv_div, ACT, TANH, False, CAUSAL,
                         HAS_WINDOW, BLOCK_M, PREC, DQ_ATOMIC)
    dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, DQAh, stride_qt, stride_dot, stride_dqat, offs_n, offs_d,
                         m2, hi, m2, hi, shift, window, scale, inv_div, ACT, TANH, True, CAUSAL,
                         HAS_WINDOW, BLOCK_M, PREC, DQ_ATOMIC)
    dk = dk * scale
    tl.store((DK + h * stride_dkh + kv_start * stride_dkt) + offs_n[:, None] * stride_dkt + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store((DV + h * stride_dvh + kv_start * stride_dvt) + offs_n[:, None] * stride_dvt + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


# --- Short kv: the whole kv of a sample in one tile, several q tiles per program -------------
#
# The personalized-FFN shape (tens of keys per sample, thousands of queries): one program per
# (chunk of Q_TILES consecutive q tiles of one sample, head). It loads the sample's k and v once
# and walks its q tiles in a loop, so the loads of the next tile overlap this tile's math; the
# backward keeps the chunk's dK/dV partial sums in registers and adds them to the fp32
# buffers once per chunk (Q_TILES times fewer atomics than one add per q tile).


@triton.jit
def _short_setup(q_offsets, kv_offsets, pid, B, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    """(sample, q_start, q_len, kv_start, kv_len, first row of the chunk, q tiles in the chunk, total)."""
    b, chunk, total = _locate(q_offsets, pid, B, CHUNK, BLOCK_B)
    b = tl.minimum(b, B - 1)  # pid >= total: clamp for the loads; the caller returns
    q_start = tl.load(q_offsets + b)
    q_len = (tl.load(q_offsets + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(kv_offsets + b)
    kv_len = (tl.load(kv_offsets + b + 1) - kv_start).to(tl.int32)
    first = chunk * CHUNK
    n_tiles = tl.minimum(CHUNK, q_len - first)
    n_tiles = (n_tiles + BLOCK_M - 1) // BLOCK_M
    return q_start, q_len, kv_start, kv_len, first, n_tiles, total


@triton.jit
def _short_kv(K, V, h, stride_kt, stride_kh, stride_vt, stride_vh, kv_start, kv_len,
              D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The sample's whole k and v `[BLOCK_N, D]` for head h (rows past kv_len zero), with the
    column offsets, head-dim offsets and the valid-column mask."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    col_ok = offs_n < kv_len
    k = tl.load((K + h * stride_kh + kv_start * stride_kt) + offs_n[:, None] * stride_kt + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    v = tl.load((V + h * stride_vh + kv_start * stride_vt) + offs_n[:, None] * stride_vt + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    return k, v, offs_n, offs_d, col_ok


@triton.jit
def _gdpa_fwd_short_kernel(Q, K, V, O, q_offsets, kv_offsets,
                           stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                           scale, inv_div, window, B,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                           Q_TILES: tl.constexpr, ACT: tl.constexpr, TANH: tl.constexpr, CAUSAL: tl.constexpr,
                           HAS_WINDOW: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    q_start, q_len, kv_start, kv_len, first, n_tiles, total = _short_setup(
        q_offsets, kv_offsets, pid, B, BLOCK_M * Q_TILES, BLOCK_M, BLOCK_B)
    if pid >= total:
        return
    shift = kv_len - q_len
    k, v, offs_n, offs_d, col_ok = _short_kv(K, V, h, stride_kt, stride_kh, stride_vt, stride_vh, kv_start, kv_len,
                                             D, BLOCK_N)
    for t in range(0, n_tiles):
        offs_m = first + t * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < q_len
        q = tl.load((Q + h * stride_qh + q_start * stride_qt) + offs_m[:, None] * stride_qt + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        p = _act(_dot(q, tl.trans(k), PREC) * scale, ACT, TANH)
        p = tl.where(_visible(offs_m, offs_n, shift, window, 0, kv_len, CAUSAL, HAS_WINDOW), p, 0.0)
        out = _dot(p.to(v.dtype), v, PREC) * inv_div
        tl.store((O + h * stride_oh + q_start * stride_ot) + offs_m[:, None] * stride_ot + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _gdpa_bwd_short_kernel(Q, K, V, DO, DQ, DKA, DVA, q_offsets, kv_offsets,
                           stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                           stride_dot, stride_doh, stride_dqt, stride_dqh, stride_at, stride_ah,
                           scale, inv_div, window, B,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                           Q_TILES: tl.constexpr, ACT: tl.constexpr, TANH: tl.constexpr, CAUSAL: tl.constexpr,
                           HAS_WINDOW: tl.constexpr, PREC: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    q_start, q_len, kv_start, kv_len, first, n_tiles, total = _short_setup(
        q_offsets, kv_offsets, pid, B, BLOCK_M * Q_TILES, BLOCK_M, BLOCK_B)
    if pid >= total:
        return
    shift = kv_len - q_len
    k, v, offs_n, offs_d, col_ok = _short_kv(K, V, h, stride_kt, stride_kh, stride_vt, stride_vh, kv_start, kv_len,
                                             D, BLOCK_N)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for t in range(0, n_tiles):
        offs_m = first + t * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < q_len
        q = tl.load((Q + h * stride_qh + q_start * stride_qt) + offs_m[:, None] * stride_qt + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        do = tl.load((DO + h * stride_doh + q_start * stride_dot) + offs_m[:, None] * stride_dot + offs_d[None, :],
                     mask=row_ok[:, None], other=0.0)
        y, g = _act_and_grad(_dot(q, tl.trans(k), PREC) * scale, ACT, TANH)
        vis = _visible(offs_m, offs_n, shift, window, 0, kv_len, CAUSAL, HAS_WINDOW) & row_ok[:, None]
        ds = tl.where(vis, _dot(do, tl.trans(v), PREC) * g * inv_div, 0.0)
        p = tl.where(vis, y * inv_div, 0.0)
        dq = _dot(ds.to(k.dtype), k, PREC) * scale
        tl.store((DQ + h * stride_dqh + q_start * stride_dqt) + offs_m[:, None] * stride_dqt + offs_d[None, :],
                 dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
        dv += _dot(tl.trans(p.to(do.dtype)), do, PREC)
        dk += _dot(tl.trans(ds.to(q.dtype)), q, PREC)
    rows = offs_n[:, None] * stride_at + offs_d[None, :]
    tl.atomic_add((DVA + h * stride_ah + kv_start * stride_at) + rows, dv, mask=col_ok[:, None], sem="relaxed")
    tl.atomic_add((DKA + h * stride_ah + kv_start * stride_at) + rows, dk * scale, mask=col_ok[:, None], sem="relaxed")
