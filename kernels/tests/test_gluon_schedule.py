"""The Gluon kernels' tile schedules, modelled in PyTorch on the CPU, against the reference.

The Gluon kernels (`_gluon_jfa`) cannot run without a Hopper GPU. What can be checked here is
their arithmetic order and tile bounds: these models walk the tiles exactly as the kernels do
(the same `hi` / `f_hi` / `lo` / `f_lo` formulas, which tiles take an element mask, rows and
keys past a sample's end as zero-filled rows, the forward's rescale one tile late as in
FlashAttention-3's pipelining, the dQ kernel's missing column mask) in float64, and must give
the reference attention and its gradients on fresh random jagged batches, causal and full,
self- and cross-attention, with tile sizes that do and do not divide the lengths.
"""

from __future__ import annotations

import math

import pytest
import torch

from gem_kernels._jagged import visible_mask

LOG2E = 1.4426950408889634


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Softmax attention of one (sample, head) under the library's visibility rule
    (`_jagged.visible_mask`, bottom-right aligned); a row that sees no key gives 0."""
    mask = visible_mask(q.shape[0], k.shape[0], causal=causal, window=None)
    s = torch.where(mask, (q @ k.T) * scale, -math.inf)
    seen = mask.any(1, keepdim=True)
    return torch.where(seen, torch.softmax(torch.where(seen, s, 0.0), 1), 0.0) @ v


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x's first `rows` rows, zero rows past its end (cp.async's masked rows)."""
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: min(rows, x.shape[0])] = x[:rows]
    return out


def _fwd_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bm: int, bn: int,
               c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_jfa_fwd_gluon_kernel` for one (sample, head): q [lq, D], k/v [lk, D] -> out, lse2."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    out, lse = torch.zeros_like(q), torch.full((lq,), math.inf, dtype=q.dtype)
    for m_start in range(0, lq, bm):
        rows = torch.arange(m_start, m_start + bm)
        qt = _pad(q[m_start:], bm)
        hi, f_hi = (min(lk, max(m_start + bm + shift, 0)), min(lk, m_start + shift + 1)) if causal else (lk, lk)
        n_tiles = -(-hi // bn)
        m_i = torch.full((bm,), -math.inf, dtype=q.dtype)
        l_i = torch.zeros(bm, dtype=q.dtype)
        acc = torch.zeros(bm, q.shape[1], dtype=q.dtype)

        def softmax(j: int, m_i: torch.Tensor, l_i: torch.Tensor) -> tuple[torch.Tensor, ...]:
            s = (qt @ _pad(k[j * bn:], bn).T) * c
            if j * bn + bn > f_hi:
                cols = j * bn + torch.arange(bn)
                ok = (cols < lk)[None, :]
                if causal:
                    ok = ok & (cols[None, :] <= rows[:, None] + shift)
                s = torch.where(ok, s, -math.inf)
            m_new = torch.maximum(m_i, s.max(1).values)
            m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp2(s - m_safe[:, None])
            alpha = torch.exp2(m_i - m_safe)
            return p, alpha, l_i * alpha + p.sum(1), m_new

        if n_tiles > 0:
            p, _, l_i, m_i = softmax(0, m_i, l_i)
            for j in range(1, n_tiles):
                p_prev = p
                p, alpha, l_i, m_i = softmax(j, m_i, l_i)  # runs under O += P_{j-1} V_{j-1}
                acc = (acc + p_prev @ _pad(v[(j - 1) * bn:], bn)) * alpha[:, None]
            acc = acc + p @ _pad(v[(n_tiles - 1) * bn:], bn)
        empty = l_i == 0
        l_safe = torch.where(empty, 1.0, l_i)
        n = min(bm, lq - m_start)
        out[m_start:m_start + n] = (acc / l_safe[:, None])[:n]
        lse[m_start:m_start + n] = torch.where(empty, math.inf, m_i + torch.log2(l_safe))[:n]
    return out, lse


def _dkdv_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, causal: bool, bm: int, bn: int, scale: float) -> tuple[torch.Tensor, ...]:
    """`_jfa_bwd_dkdv_gluon_kernel` for one (sample, head) -> dk, dv."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for n_start in range(0, lk, bn):
        kt, vt = _pad(k[n_start:], bn), _pad(v[n_start:], bn)
        offs_n = n_start + torch.arange(bn)
        lo, f_lo = (max(n_start - shift, 0), max(n_start + bn - 1 - shift, 0)) if causal else (0, 0)
        lo = (lo // bm) * bm
        n_tiles = (max(lq, lo) - lo + bm - 1) // bm
        dkt, dvt = torch.zeros(bn, k.shape[1], dtype=k.dtype), torch.zeros(bn, v.shape[1], dtype=v.dtype)
        for it in range(n_tiles):
            start_m = lo + it * bm
            rows = start_m + torch.arange(bm)
            r_ok = rows < lq
            lse2 = torch.where(r_ok, _pad(lse[start_m:], bm), math.inf)
            dl = torch.where(r_ok, _pad(delta[start_m:], bm), 0.0)
            qt, dot = _pad(q[start_m:], bm), _pad(do[start_m:], bm)
            p = torch.exp2((kt @ qt.T) * scale * LOG2E - lse2[None, :])
            if causal and start_m < f_lo:
                p = torch.where(offs_n[:, None] <= rows[None, :] + shift, p, 0.0)
            ds = p * ((vt @ dot.T) - dl[None, :])
            dvt += p @ dot
            dkt += ds @ qt
        n = min(bn, lk - n_start)
        dk[n_start:n_start + n], dv[n_start:n_start + n] = (dkt * scale)[:n], dvt[:n]
    return dk, dv


def _dq_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
              delta: torch.Tensor, causal: bool, bm: int, bn: int, scale: float) -> torch.Tensor:
    """`_jfa_bwd_dq_gluon_kernel` for one (sample, head): no column mask past lk (zero K rows)."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    dq = torch.zeros_like(q)
    for m_start in range(0, lq, bm):
        rows = m_start + torch.arange(bm)
        r_ok = rows < lq
        qt, dot = _pad(q[m_start:], bm), _pad(do[m_start:], bm)
        lse2 = torch.where(r_ok, _pad(lse[m_start:], bm), math.inf)
        dl = torch.where(r_ok, _pad(delta[m_start:], bm), 0.0)
        hi, f_hi = (min(lk, max(m_start + bm + shift, 0)), max(m_start + shift + 1, 0)) if causal else (lk, lk)
        dqt = torch.zeros(bm, q.shape[1], dtype=q.dtype)
        for it in range(-(-hi // bn)):
            start_n = it * bn
            kt, vt = _pad(k[start_n:], bn), _pad(v[start_n:], bn)
            p = torch.exp2((qt @ kt.T) * scale * LOG2E - lse2[:, None])
            if causal and start_n + bn > f_hi:
                p = torch.where(start_n + torch.arange(bn)[None, :] <= rows[:, None] + shift, p, 0.0)
            dqt += (p * ((dot @ vt.T) - dl[:, None])) @ kt
        n = min(bm, lq - m_start)
        dq[m_start:m_start + n] = (dqt * scale)[:n]
    return dq


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("tiles", [(16, 16), (8, 32), (32, 8)])
def test_models_give_the_reference(causal: bool, cross: bool, tiles: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(hash((causal, cross, tiles)) % 2**31)
    b, h, d = 5, 2, 8
    lq = torch.randint(0, 60, (b,), generator=g).tolist()
    lk = torch.randint(0, 60, (b,), generator=g).tolist() if cross else lq
    lq[0], lk[0] = 0, 7 if cross else 0  # an empty side
    qo = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()])
    ko = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()])
    q = torch.randn(sum(lq), h, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(sum(lk), h, d, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    bm, bn = tiles
    for i in range(b):
        qs, ks = slice(int(qo[i]), int(qo[i + 1])), slice(int(ko[i]), int(ko[i + 1]))
        for hh in range(h):
            qb, kb, vb = (x[s_, hh].detach().requires_grad_() for x, s_ in ((q, qs), (k, ks), (v, ks)))
            ref = _reference(qb, kb, vb, causal, scale)
            dob = torch.randn(ref.shape, generator=g, dtype=torch.float64)
            ref_dq, ref_dk, ref_dv = torch.autograd.grad(ref, (qb, kb, vb), dob, allow_unused=True)
            with torch.no_grad():
                out, lse = _fwd_model(qb, kb, vb, causal, bm, bn, scale * LOG2E)
                torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
                delta = (dob * out).sum(1)
                dk, dv = _dkdv_model(qb, kb, vb, dob, lse, delta, causal, bm, bn, scale)
                dq = _dq_model(qb, kb, vb, dob, lse, delta, causal, bm, bn, scale)
            for got, want, like in ((dq, ref_dq, qb), (dk, ref_dk, kb), (dv, ref_dv, vb)):
                torch.testing.assert_close(got, torch.zeros_like(like) if want is None else want, atol=1e-10,
                                           rtol=1e-10)
