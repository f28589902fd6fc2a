"""The JFA backward through torch's FlashAttention-2 varlen kernel (`aten._flash_attention_backward`).

Why: on the H200 torch's built-in FlashAttention-2 backward (CUDA, cu_seqlens) computes the
same dQ/dK/dV as our Triton one-pass backward faster on every measured length mix (the
register-bound dK/dV loop of ours spills; kernels/BENCHMARKS.md). Our Triton forward stays
(it is faster than FlashAttention-2's forward on the trainer's batches) and hands its output
and log-sum-exp to this backward, so no forward is recomputed.

The contract is the Triton backward's: q/k/v `[T, H, D]` (any row/head strides, unit stride
on D), int64 offsets `[B+1]`, our lse in the log2 domain `[Tq, H]` (+inf for a row that sees
no key, which makes every recomputed probability 0 here too). FlashAttention-2 wants int32
cu_seqlens and a natural-log lse `[H, Tq]`: two small conversions per call.

Used only where it runs and means the same thing (`unavailable_reason`): CUDA, fp16/bf16,
head dim a multiple of 8 up to 256, compute capability >= 8.0, no sliding window (ours is
not mapped onto FlashAttention's window arguments), and torch's deterministic algorithms
off (its dQ is summed with atomics, like our one-pass path).
"""

from __future__ import annotations

import math

import torch

_LN2 = math.log(2.0)


def unavailable_reason(q: torch.Tensor, window: int | None) -> str | None:
    """Why torch's FlashAttention-2 backward cannot stand in for ours here (None: it can)."""
    if not hasattr(torch.ops.aten, "_flash_attention_backward"):
        return "torch has no aten._flash_attention_backward"
    if q.device.type != "cuda":
        return f"q is on {q.device.type}, not CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q.dtype={q.dtype} (FlashAttention-2 takes fp16/bf16)"
    d = q.shape[-1]
    if d % 8 != 0 or d > 256:
        return f"head dim {d} (FlashAttention-2 takes multiples of 8 up to 256)"
    if window is not None:
        return "a sliding window"
    if torch.cuda.get_device_capability(q.device) < (8, 0):
        return "compute capability < 8.0"
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic algorithms on"
    return None


def flash_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse2: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of softmax attention (no window) from our forward's out and log2 lse."""
    dout, q, k, v, out = (t if t.stride(-1) == 1 else t.contiguous() for t in (dout, q, k, v, out))
    lse = (lse2 * _LN2).t().contiguous()  # [H, Tq], natural log
    cu_q = q_offsets.to(torch.int32)
    cu_k = cu_q if kv_offsets is q_offsets else kv_offsets.to(torch.int32)
    # No dropout: the philox seed/offset are not read; their dtypes follow torch's meta.
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    dq, dk, dv = _fa2_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max(max_q_len, 1), max(max_kv_len, 1), 0.0, bool(causal),
        seed, offset, scale=float(scale),
    )
    return dq, dk, dv


def _fa2_backward(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch's op, looked up at call time (the CPU tests put a plain-PyTorch stand-in of its
    contract here to check the conversions above)."""
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.ops.aten._flash_attention_backward(*args, **kwargs)
    return out
