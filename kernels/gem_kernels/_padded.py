"""Batched plain-PyTorch attention on jagged inputs: pad at the edges, one masked matmul.

The per-sequence loops in `_jfa_reference` / `gdpa_reference` are the readable
specification; slicing one sequence at a time costs O(B·T) in autograd (every slice's
backward writes a full-size gradient), which makes them unusable as the CPU training path.
This file computes the same function on `[B, H, max_len, D]` padded tensors with one
visibility mask, so it is the `backend="reference"` fast enough for the model on CPU and is
tested against the per-sequence specification.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def _index(offsets: torch.Tensor, total: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sample id, position in sample, lengths) of each of the `total` jagged rows."""
    lengths = offsets[1:] - offsets[:-1]
    b = offsets.numel() - 1
    sample = torch.repeat_interleave(torch.arange(b, device=offsets.device), lengths, output_size=total)
    pos = torch.arange(total, device=offsets.device) - offsets[:-1][sample]
    return sample, pos, lengths


def to_padded(x: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """Jagged `[T, H, D]` -> zero-padded `[B, H, max_len, D]` (differentiable)."""
    t, h, d = x.shape
    b = offsets.numel() - 1
    sample, pos, _ = _index(offsets, t, max_len)
    out = x.new_zeros(b, max_len, h, d)
    out = out.index_put((sample, pos), x)
    return out.transpose(1, 2)


def visibility(len_q: torch.Tensor, len_kv: torch.Tensor, max_q: int, max_kv: int, *,
               causal: bool, window: int | None) -> torch.Tensor:
    """Bool `[B, 1, max_q, max_kv]`: query i of sample b sees key j (bottom-right aligned)."""
    dev = len_q.device
    i = torch.arange(max_q, device=dev).view(1, -1, 1)
    j = torch.arange(max_kv, device=dev).view(1, 1, -1)
    lq, lk = len_q.view(-1, 1, 1), len_kv.view(-1, 1, 1)
    ip = i + (lk - lq)
    mask = (i < lq) & (j < lk)
    if causal:
        mask = mask & (j <= ip)
    if window is not None:
        mask = mask & ((j > ip - window) if causal else ((ip - j).abs() < window))
    return mask.unsqueeze(1)


def padded_attention(
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
    act: Callable[[torch.Tensor], torch.Tensor] | None = None,
    divisor: float = 1.0,
) -> torch.Tensor:
    """`[Tq, H, D]` attention output; softmax when `act` is None, else act(s)·mask/divisor.

    Queries that see no key output 0 with zero gradient (no NaN), as in the specification.
    """
    tq = q.shape[0]
    if tq == 0 or q_offsets.numel() <= 1:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2]) + 0.0 * (q.sum() + k.sum() + v.sum())
    mq, mk = max(int(max_q_len), 1), max(int(max_kv_len), 1)
    qp = to_padded(q.float(), q_offsets, mq)
    kp = to_padded(k.float(), kv_offsets, mk)
    vp = to_padded(v.float(), kv_offsets, mk)
    len_q = q_offsets[1:] - q_offsets[:-1]
    len_kv = kv_offsets[1:] - kv_offsets[:-1]
    mask = visibility(len_q, len_kv, mq, mk, causal=causal, window=window)
    s = torch.matmul(qp, kp.transpose(-1, -2)) * scale  # [B, H, mq, mk]
    if act is None:
        any_vis = mask.any(dim=-1, keepdim=True)
        s = s.masked_fill(~mask, -math.inf)
        s = torch.where(any_vis, s, torch.zeros_like(s))
        p = torch.softmax(s, dim=-1) * any_vis
    else:
        p = act(s) * mask / divisor
    o = torch.matmul(p, vp).transpose(1, 2)  # [B, mq, H, D]
    sample, pos, _ = _index(q_offsets, tq, mq)
    return o[sample, pos].to(q.dtype)
