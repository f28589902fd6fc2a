"""Plain-PyTorch Jagged Flash Attention: the specification the Triton kernel is tested against.

One sequence at a time, fp32 math, the visibility rule of `_jagged.visible_mask`. A query
that sees no key outputs 0 and gets zero gradient (no NaN): its scores are replaced by 0
before the softmax and its probabilities multiplied by 0. Autograd is torch's own.
"""

from __future__ import annotations

import math

import torch

from gem_kernels._jagged import visible_mask


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
