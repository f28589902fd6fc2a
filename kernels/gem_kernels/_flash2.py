"""JFA through torch's FlashAttention-2 varlen kernels (`aten._flash_attention_forward/_backward`).

Why: on the H200 torch's built-in FlashAttention-2 kernels beat ours in two places
(kernels/BENCHMARKS.md, `python3 -m gem_kernels.bench.bwd`):
- the backward, on 6 of 7 length mixes (our dK/dV loop is register-bound and spills); it is
  fed with *our* forward's output and log-sum-exp, so no forward is recomputed;
- the forward on short mixes (mean length 112: 145 vs 75 TFLOP/s; 297: 278 vs 221), where
  ours wastes most of its 128-row tiles; on long mixes ours is faster (407 vs 340 at ~1,000).

The contract is our Triton kernels': q/k/v `[T, H, D]` (any row/head strides, unit stride on
D), int64 offsets `[B+1]`, the lse in the log2 domain `[Tq, H]` with +inf for a row that sees
no key (its output is 0 and every recomputed probability 0). FlashAttention-2 takes int32
cu_seqlens and a natural-log lse `[H, Tq]`: small conversions per call, both ways.

Used only where it runs and means the same thing (`unavailable_reason`): CUDA, fp16/bf16, head
dim a multiple of 8 up to 256, compute capability >= 8.0, no sliding window (ours is not mapped
onto FlashAttention's window arguments), non-empty q and k; the backward also needs torch's
deterministic algorithms off (its dQ is summed with atomics, like our one-pass path).
"""

from __future__ import annotations

import math

import torch

from gem_kernels._triton_jfa import _last_dim_contiguous

_LN2 = math.log(2.0)


def unavailable_reason(q: torch.Tensor, window: int | None, *, backward: bool = True,
                       k: torch.Tensor | None = None) -> str | None:
    """Why torch's FlashAttention-2 kernel cannot stand in for ours here (None: it can)."""
    name = "_flash_attention_backward" if backward else "_flash_attention_forward"
    if not hasattr(torch.ops.aten, name):
        return f"torch has no aten.{name}"
    if q.device.type != "cuda":
        return f"q is on {q.device.type}, not CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q.dtype={q.dtype} (FlashAttention-2 takes fp16/bf16)"
    d = q.shape[-1]
    if d % 8 != 0 or d > 256:
        return f"head dim {d} (FlashAttention-2 takes multiples of 8 up to 256)"
    if window is not None:
        return "a sliding window"
    if q.shape[0] == 0 or (k is not None and k.shape[0] == 0):
        return "no queries or no keys"
    if torch.cuda.get_device_capability(q.device) < (8, 0):
        return "compute capability < 8.0"
    if backward and torch.are_deterministic_algorithms_enabled():
        return "deterministic algorithms on"
    return None


def _cu(q_offsets: torch.Tensor, kv_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cu_q = q_offsets.to(torch.int32)
    return cu_q, (cu_q if kv_offsets is q_offsets else kv_offsets.to(torch.int32))


def lse_to_ours(lse: torch.Tensor) -> torch.Tensor:
    """FlashAttention's natural-log lse `[H, Tq]` (±inf for a row that sees no key) -> our log2
    lse `[Tq, H]` (+inf there). Shared with `_flash4`."""
    return torch.where(torch.isinf(lse), math.inf, lse * (1.0 / _LN2)).t().contiguous()


def lse_from_ours(lse2: torch.Tensor) -> torch.Tensor:
    """Our log2 lse `[Tq, H]` -> FlashAttention's natural-log `[H, Tq]` (+inf rows stay +inf: P = 0)."""
    return (lse2 * _LN2).t().contiguous()


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out `[Tq, H, D]` and our log2 lse `[Tq, H]` (no window) by FlashAttention-2's forward."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    cu_q, cu_k = _cu(q_offsets, kv_offsets)
    out, lse = _fa2_forward(q, k, v, cu_q, cu_k, max(max_q_len, 1), max(max_kv_len, 1), 0.0, bool(causal),
                            False, scale=float(scale))[:2]
    # A row that sees no key: FlashAttention-2 writes +inf (-inf on its split-kv path); ours is +inf.
    return out, lse_to_ours(lse)


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
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    lse = lse_from_ours(lse2)
    cu_q, cu_k = _cu(q_offsets, kv_offsets)
    # No dropout: the philox seed/offset are not read; their dtypes follow torch's meta.
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    dq, dk, dv = _fa2_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max(max_q_len, 1), max(max_kv_len, 1), 0.0, bool(causal),
        seed, offset, scale=float(scale),
    )
    return dq, dk, dv


# torch's ops, looked up at call time (the CPU tests put plain-PyTorch stand-ins of their
# contracts here to check the conversions above).
def _fa2_forward(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    out: tuple[torch.Tensor, ...] = torch.ops.aten._flash_attention_forward(*args, **kwargs)
    return out


def _fa2_backward(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.ops.aten._flash_attention_backward(*args, **kwargs)
    return out
