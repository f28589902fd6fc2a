"""Jagged-sequence plumbing of the model: token→sample index, CLS insertion, RoPE, kernel calls.

A sequence batch is flat values `[T, d]` + int64 offsets `[B+1]` + a host int `max_len`
(STYLE.md point 3). Everything here avoids host syncs: sizes come from tensor shapes and
host ints, never from reading offsets.
"""

from __future__ import annotations

import torch

import gem_kernels


def lengths_of(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def token_sample(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """`[T]` sample index of each jagged token (no host sync: output size is given)."""
    b = offsets.shape[0] - 1
    ar = torch.arange(b, device=offsets.device)
    return torch.repeat_interleave(ar, lengths_of(offsets), output_size=total)


def uniform_offsets(batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Offsets `[B+1]` of B sequences of exactly n tokens each."""
    return torch.arange(batch + 1, device=device, dtype=torch.int64) * n


def with_prefix(offsets: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layout of the sequences with n tokens prepended to each.

    Returns (new_offsets `[B+1]`, positions `[T]` of the old tokens in the new layout,
    positions `[B*n]` of the prefix tokens, sample-major).
    """
    b = offsets.shape[0] - 1
    dev = offsets.device
    shift = torch.arange(b + 1, device=dev, dtype=torch.int64) * n
    new_off = offsets + shift
    return new_off, shift, new_off[:-1, None] + torch.arange(n, device=dev)


def insert_prefix(
    seq: torch.Tensor, prefix: torch.Tensor, offsets: torch.Tensor, seq_sample: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prepend `prefix` `[B, n, d]` to each jagged sequence of `seq` `[T, d]`.

    Returns (combined `[T + B*n, d]`, new offsets, positions of seq tokens, positions of
    prefix tokens `[B*n]`).
    """
    b, n, d = prefix.shape
    new_off, shift, pre_pos = with_prefix(offsets, n)
    seq_pos = torch.arange(seq.shape[0], device=seq.device) + shift[1:][seq_sample]
    pre_pos = pre_pos.reshape(-1)
    out = seq.new_zeros(seq.shape[0] + b * n, d)
    out = out.index_copy(0, seq_pos, seq).index_copy(0, pre_pos, prefix.reshape(b * n, d).to(seq.dtype))
    return out, new_off, seq_pos, pre_pos


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of `[T, H, D]` at integer positions `[T]`."""
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [T, D/2]
    cos = torch.cos(ang)[:, None, :].to(x.dtype)
    sin = torch.sin(ang)[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """bf16 (the autocast dtype) on CUDA under autocast, else the tensor's own dtype."""
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return x.dtype


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q: int,
    max_kv: int,
    *,
    window: int | None = None,
    activation: str = "softmax",
    backend: str = "auto",
) -> torch.Tensor:
    """Jagged attention through gem_kernels: softmax → JFA, any other activation → GDPA."""
    dt = kernel_dtype(q)
    # Kernels read [T, H, D] with unit stride on D; q/k/v often arrive as views of one qkv GEMM.
    q, k, v = q.to(dt).contiguous(), k.to(dt).contiguous(), v.to(dt).contiguous()
    if activation == "softmax":
        return gem_kernels.jagged_flash_attention(
            q, k, v, q_offsets, kv_offsets, max_q, max_kv, window=window, backend=backend
        )
    return gem_kernels.generalized_dot_product_attention(
        q, k, v, q_offsets, kv_offsets, max_q, max_kv, activation=activation, backend=backend
    )
