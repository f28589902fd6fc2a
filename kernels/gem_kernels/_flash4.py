"""JFA through FlashAttention-4's CuTe kernels (the `flash-attn-4` package, `flash_attn.cute`).

Why: on Hopper the attention backward is the largest item of the h200 trainer's step, and
torch's built-in FlashAttention-2 backward (`_flash2`) is an Ampere-style kernel (no wgmma, no
TMA, no warp specialisation). FlashAttention-4's package carries Hopper (SM90) forward and
backward kernels written in NVIDIA's CuTe DSL with all three; they are JIT-compiled on first
use (seconds per kernel; `FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1` keeps them on disk).

The contract is our Triton kernels' (as in `_flash2`): q/k/v `[T, H, D]`, int64 offsets
`[B+1]`, the lse in the log2 domain `[Tq, H]` with +inf for a row that sees no key (its output
is 0 and every recomputed probability 0). FlashAttention-4 takes int32 cu_seqlens and a
natural-log lse `[H, Tq]`: small conversions per call, both ways. Causal is bottom-right
aligned in both. Its dQ is summed with atomics unless `deterministic=True`, which we pass
when torch's deterministic algorithms are on (semaphores order the sums: bitwise repeatable).

Optional: the package is not a dependency of gem-kernels (`pip install gem-kernels[flash4]`);
where it is missing or cannot run, `unavailable_reason` says why and the callers keep their
own path. Only the package's private `_flash_attn_fwd` / `_flash_attn_bwd` take a forward's
output and lse from outside (its autograd Function does not), so the version is pinned (the
`[flash4]` extra in pyproject.toml).
"""

from __future__ import annotations

import functools

import torch

from gem_kernels._flash2 import _cu, lse_from_ours, lse_to_ours
from gem_kernels._triton_jfa import _last_dim_contiguous


@functools.lru_cache(maxsize=1)
def _import_error() -> str | None:
    """None when `flash_attn.cute.interface` imports, else the reason (cached per process)."""
    try:
        import flash_attn.cute.interface  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA/driver error raised while it loads
        return f"flash_attn.cute does not import ({type(e).__name__}: {str(e)[:160]})"
    return None


def unavailable_reason(q: torch.Tensor, window: int | None, *, k: torch.Tensor | None = None) -> str | None:
    """Why FlashAttention-4 cannot stand in for our kernels here (None: it can)."""
    if q.device.type != "cuda":
        return f"q is on {q.device.type}, not CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q.dtype={q.dtype} (FlashAttention-4 takes fp16/bf16)"
    d = q.shape[-1]
    if d % 8 != 0 or not 8 <= d <= 256:
        return f"head dim {d} (FlashAttention-4 takes multiples of 8 from 8 to 256)"
    if window is not None:
        return "a sliding window"
    if q.shape[0] == 0 or (k is not None and k.shape[0] == 0):
        return "no queries or no keys"
    major = torch.cuda.get_device_capability(q.device)[0]
    if major not in (9, 10):
        return f"compute capability {major}.x (its SM90 / SM100 kernels are the ones used here)"
    return _import_error()


def flash4_forward(
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
    """out `[Tq, H, D]` and our log2 lse `[Tq, H]` (no window) by FlashAttention-4's forward."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    cu_q, cu_k = _cu(q_offsets, kv_offsets)
    out, lse = _fa4_forward(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(max_q_len, 1),
        max_seqlen_k=max(max_kv_len, 1), softmax_scale=float(scale), causal=bool(causal), return_lse=True,
    )[:2]
    # A row that sees no key: -inf (or +inf) there; ours is +inf, with an output of 0.
    return out, lse_to_ours(lse)


def flash4_backward(
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
    *,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of softmax attention (no window) from a forward's out and log2 lse.

    `dq`, `dk`, `dv`: optional outputs (q's / k's shape and dtype, any row/head strides, unit
    stride on D; `jfa_backward` passes the halves of a packed `[Tkv, 2, H, D]` dkv, or the
    slots of a fused `[T, 3, H, D]` dqkv). The package's `_flash_attn_bwd` writes into them (it
    checks only shape, dtype and device; its kernels take the strides at run time); they are
    returned. Not given: the package allocates them."""
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    lse = lse_from_ours(lse2)
    cu_q, cu_k = _cu(q_offsets, kv_offsets)
    # Passed only when given: the call is then the one the unpacked path always made.
    outs = {name: t for name, t in (("dq", dq), ("dk", dk), ("dv", dv)) if t is not None}
    dq_got, dk_got, dv_got = _fa4_backward(
        q, k, v, out, dout, lse, softmax_scale=float(scale), causal=bool(causal),
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(max_q_len, 1),
        max_seqlen_k=max(max_kv_len, 1), deterministic=torch.are_deterministic_algorithms_enabled(), **outs,
    )[:3]
    return _written(dq, dq_got), _written(dk, dk_got), _written(dv, dv_got)


def _written(given: torch.Tensor | None, got: torch.Tensor) -> torch.Tensor:
    """`given` holding `got`'s values (a package version that returned a fresh tensor instead of
    writing into the one given is copied in), or `got` when none was given."""
    if given is None:
        return got
    if got.data_ptr() != given.data_ptr() or got.stride() != given.stride():
        given.copy_(got)
    return given


# The package's functions, looked up at call time (the CPU tests put plain-PyTorch stand-ins
# of their contracts here to check the conversions above).
def _fa4_forward(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    from flash_attn.cute.interface import _flash_attn_fwd

    res: tuple[torch.Tensor, ...] = _flash_attn_fwd(*args, **kwargs)
    return res


def _fa4_backward(*args: object, **kwargs: object) -> tuple[torch.Tensor, ...]:
    from flash_attn.cute.interface import _flash_attn_bwd

    res: tuple[torch.Tensor, ...] = _flash_attn_bwd(*args, **kwargs)
    return res
