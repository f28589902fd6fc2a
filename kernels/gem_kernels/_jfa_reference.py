"""Plain-PyTorch Jagged Flash Attention: the specification the Triton kernel is tested against.

`jfa_reference`: one sequence at a time, fp32 math, the visibility rule of
`_jagged.visible_mask`. A query that sees no key outputs 0 and gets zero gradient (no NaN):
its scores are replaced by 0 before the softmax and its probabilities multiplied by 0.

`jfa_padded`: the same function batched — pad at the edges to `[B, H, L, D]`, one masked
softmax, unpad. No host sync and O(T) autograd (slicing per sequence makes every slice's
backward write a full-size gradient), so it is what `backend="reference"` runs when the
padded scores fit (`PADDED_LIMIT`); tests hold it to the per-sequence specification.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gem_kernels._jagged import pad_jagged, unpad_jagged, visible_mask

# Largest B·H·max_q_len·max_kv_len for the padded path (fp32 scores: 4 bytes each).
PADDED_LIMIT = 1 << 27


def jfa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    *,
    causal: bool,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """Reference JFA. q `[Tq, H, D]`, k/v `[Tkv, H, D]`, offsets int64 `[B+1]` -> `[Tq, H, D]`.

    Reads the offsets on the host (one sync): this is the specification, not the fast path.
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
        any_visible = mask.any(dim=1, keepdim=True)  # [Lq, 1]
        s = torch.matmul(qb, kb.transpose(1, 2)) * scale
        s = s.masked_fill(~mask, -math.inf)
        s = torch.where(any_visible, s, torch.zeros_like(s))
        p = torch.softmax(s, dim=-1) * any_visible
        outs.append(torch.matmul(p, vb).transpose(0, 1).to(q.dtype))
    if not outs:
        # No queries at all (Tq == 0): an empty output still wired to q, k, v for autograd.
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2]) + 0.0 * (q.sum() + k.sum() + v.sum())
    return torch.cat(outs, dim=0)


def padded_mask(
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """The visibility rule on padded tensors: bool `[B, 1, Lq, Lkv]`, False on padding."""
    len_q = (q_offsets[1:] - q_offsets[:-1]).view(-1, 1, 1)
    len_kv = (kv_offsets[1:] - kv_offsets[:-1]).view(-1, 1, 1)
    i = torch.arange(max_q_len, device=q_offsets.device).view(1, -1, 1)
    j = torch.arange(max_kv_len, device=q_offsets.device).view(1, 1, -1)
    ipos = i + (len_kv - len_q)  # bottom-right alignment, per sample
    mask = (i < len_q) & (j < len_kv)
    if causal:
        mask &= j <= ipos
    if window is not None:
        mask &= (j > ipos - window) if causal else ((ipos - j).abs() < window)
    return mask.unsqueeze(1)


def jfa_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    *,
    causal: bool,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """Batched reference JFA on padded tensors; same contract as `jfa_reference`."""
    qp = pad_jagged(q, q_offsets, max_q_len).float().transpose(1, 2)  # [B, H, Lq, D]
    kp = pad_jagged(k, kv_offsets, max_kv_len).float().transpose(1, 2)
    vp = pad_jagged(v, kv_offsets, max_kv_len).float().transpose(1, 2)
    mask = padded_mask(q_offsets, kv_offsets, max_q_len, max_kv_len, causal=causal, window=window)
    any_visible = mask.any(dim=-1, keepdim=True)
    s = torch.matmul(qp, kp.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, -math.inf)
    s = torch.where(any_visible, s, torch.zeros_like(s))
    p = torch.softmax(s, dim=-1) * any_visible
    out = torch.matmul(p, vp).transpose(1, 2)  # [B, Lq, H, D]
    return unpad_jagged(out, q_offsets, total=q.shape[0]).to(q.dtype)


# Sequences per bucket of the CPU reference: sorting by length and padding each bucket to its
# own maximum brings the padded work close to the jagged Σ len_q·len_kv (padding a long-tailed
# batch to its global max costs ~7x more on the tiny preset), at one host read of the offsets
# — free on CPU, which is the only place the reference runs in training.
BUCKET = 16


def bucketed(
    fn: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    **kw: Any,
) -> torch.Tensor:
    """Runs the padded reference `fn` on length-sorted buckets of `BUCKET` sequences.

    `fn(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, **kw)` for each bucket; the
    rows are gathered per bucket and the outputs scattered back, so autograd is O(T).
    """
    lq = (q_offsets[1:] - q_offsets[:-1]).tolist()
    lk = (kv_offsets[1:] - kv_offsets[:-1]).tolist()
    qo, ko = q_offsets.tolist(), kv_offsets.tolist()
    order = sorted(range(len(lq)), key=lambda b: (lq[b] * max(lk[b], 1), b))
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
    for s in range(0, len(order), BUCKET):
        group = order[s : s + BUCKET]
        if not any(lq[b] for b in group):
            continue
        qrows = torch.cat([torch.arange(qo[b], qo[b + 1]) for b in group]).to(q.device)
        krows = torch.cat([torch.arange(ko[b], ko[b + 1]) for b in group]).to(q.device)
        gq = torch.tensor([0] + [lq[b] for b in group], device=q.device).cumsum(0)
        gk = torch.tensor([0] + [lk[b] for b in group], device=q.device).cumsum(0)
        o = fn(q.index_select(0, qrows), k.index_select(0, krows), v.index_select(0, krows), gq, gk,
               max(lq[b] for b in group), max(max(lk[b] for b in group), 1), **kw)
        pieces.append((qrows, o))
    if not pieces:
        return out + 0.0 * (q.sum() + k.sum() + v.sum())
    rows = torch.cat([r for r, _ in pieces])
    return out.index_copy(0, rows, torch.cat([o for _, o in pieces]).to(out.dtype))


def run_reference(
    padded: Callable[..., torch.Tensor],
    spec: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    **kw: Any,
) -> torch.Tensor:
    """What `backend="reference"` runs: length-bucketed padded on CPU for more than `BUCKET`
    sequences, one padded batch when its scores fit `PADDED_LIMIT`, else the per-sequence
    specification. `padded(q, k, v, qo, ko, max_q, max_kv, **kw)`, `spec(q, k, v, qo, ko, **kw)`."""
    b = q_offsets.shape[0] - 1
    if q.device.type == "cpu" and b > BUCKET:
        return bucketed(padded, q, k, v, q_offsets, kv_offsets, **kw)
    mk = max(max_kv_len, 1)
    if b * q.shape[1] * max_q_len * mk <= PADDED_LIMIT:
        return padded(q, k, v, q_offsets, kv_offsets, max_q_len, mk, **kw)
    return spec(q, k, v, q_offsets, kv_offsets, **kw)
