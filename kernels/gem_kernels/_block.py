"""BlockAttention: softmax attention inside fixed-size blocks of each jagged sequence.

Why this op exists: GEM-style models attend over very long user histories where most of the
useful signal is local. Cutting each sequence into consecutive `block_size` (64) token blocks
from its start and letting a block attend only to itself makes attention linear in length
and memory-bound: per block, q, k, v are read once and out written once. The kernel is
therefore measured in bytes per second, not FLOP/s.

RoPE: `rope=(cos, sin)` rotates q and k inside the kernel (fwd and bwd), at each token's
position *within its sequence* (0 for the first token of every sample), "rotate half"
convention (GPT-NeoX / Llama): x = [x1, x2] split at D/2,
rot(x) = [x1 cos - x2 sin, x2 cos + x1 sin], with `cos`, `sin` of shape `[P, D/2]`,
P >= max_len (e.g. `cos = torch.cos(pos[:, None] * inv_freq[None, :])`). `rope_tables`
builds them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any

import torch

from gem_kernels._jagged import check_jagged, check_offsets, check_triton_device, debug_checks, resolve_backend
from gem_kernels._attn_plan import aligned_pointers
from gem_kernels._launch import CachedLaunch, DirectLaunch, cdiv

_BACKENDS = ("auto", "triton", "reference")
TRITON_HEAD_DIMS = (32, 64, 128, 256)
TRITON_MAX_BLOCK = 128


def rope_tables(max_len: int, head_dim: int, *, base: float = 10000.0, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each fp32 `[max_len, head_dim / 2]`, for the standard RoPE frequencies."""
    inv_freq = base ** (-torch.arange(0, head_dim // 2, dtype=torch.float32, device=device) * 2.0 / head_dim)
    ang = torch.arange(max_len, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return torch.cos(ang), torch.sin(ang)


def apply_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of `[L, H, D]` at positions 0..L-1 (fp32 math)."""
    half = x.shape[-1] // 2
    c = cos[: x.shape[0]].float()[:, None, :]
    s = sin[: x.shape[0]].float()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def block_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    block_size: int,
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    scale: float,
) -> torch.Tensor:
    """Plain-PyTorch BlockAttention (the specification). fp32 math; reads offsets on the host.

    Shapes: q/k/v `[T, H, D]`, offsets int64 `[B+1]` -> `[T, H, D]`.
    """
    off = offsets.tolist()
    outs: list[torch.Tensor] = []
    for b in range(len(off) - 1):
        qb, kb, vb = q[off[b] : off[b + 1]], k[off[b] : off[b + 1]], v[off[b] : off[b + 1]]
        length = qb.shape[0]
        if length == 0:
            continue
        if rope is not None:
            qf, kf = apply_rope_reference(qb, *rope), apply_rope_reference(kb, *rope)
        else:
            qf, kf = qb.float(), kb.float()
        vf = vb.float()
        for s in range(0, length, block_size):
            e = min(s + block_size, length)
            sc = torch.einsum("ihd,jhd->hij", qf[s:e], kf[s:e]) * scale
            p = torch.softmax(sc, dim=-1)
            outs.append(torch.einsum("hij,jhd->ihd", p, vf[s:e]).to(q.dtype))
    if not outs:  # no tokens at all: an empty [0, H, D] result, still part of q's graph
        return q * 0.0
    return torch.cat(outs, dim=0)


def _check_rope(rope: Any, head_dim: int, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    if rope is None:
        return None
    if not isinstance(rope, (tuple, list)) or len(rope) != 2:
        raise TypeError(f"rope must be None or a (cos, sin) pair of tensors, got {type(rope).__name__}")
    cos, sin = rope
    for name, t in (("rope[0] (cos)", cos), ("rope[1] (sin)", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name}.dtype={t.dtype} must be a float dtype")
        if t.dim() != 2 or t.shape[1] != head_dim // 2 or t.shape[0] < max_len:
            raise ValueError(
                f"{name}.shape={tuple(t.shape)} must be [P, D/2] = [>= max_len={max_len}, {head_dim // 2}]"
            )
        if t.device != device:
            raise ValueError(f"{name}.device={t.device} must be q's device {device}")
    if cos.shape != sin.shape:
        raise ValueError(f"rope cos.shape={tuple(cos.shape)} and sin.shape={tuple(sin.shape)} must be equal")
    if head_dim % 2:
        raise ValueError(f"q.shape[2]={head_dim} (head dim D) must be even with rope")
    return cos, sin


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    *,
    block_size: int = 64,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Softmax attention within consecutive `block_size` blocks of each jagged sequence.

    Blocks are cut from each sequence's start (the last may be partial); a query attends to
    all keys of its own block and nothing else (no causal mask inside the block).

    Args:
        q: `[T, H, D]` jagged queries (bf16, fp16 or fp32).
        k: `[T, H, D]` jagged keys (same offsets as q).
        v: `[T, H, D]` jagged values.
        offsets: int64 `[B+1]`.
        max_len: host int >= every sequence length.
        block_size: tokens per block (Triton: 1..128).
        rope: optional `(cos, sin)`, each `[P, D/2]` with P >= max_len, applied to q and k at
            positions within the sequence (rotate-half convention; see `rope_tables`).
        scale: softmax scale, default 1/sqrt(D).
        backend: "triton", "reference" (plain PyTorch) or "auto" (Triton on CUDA).

    Returns:
        `[T, H, D]` in q's dtype.
    """
    # An eager call with a signature already checked takes its plan (see `_Plan`).
    key, served = (None, None) if torch.compiler.is_compiling() else _planned(
        q, k, v, offsets, max_len, block_size, rope, scale, backend)
    if served is not None:
        return served
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {_BACKENDS}")
    device = check_jagged({"q": q, "k": k, "v": v})
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)} must be equal"
        )
    if isinstance(offsets, torch.Tensor) and offsets.device != device:
        raise ValueError(f"offsets.device={offsets.device} must be q's device {device}")
    check_offsets(offsets, "offsets", total=q.shape[0], max_len=max_len, max_len_name="max_len")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be an int >= 1")
    rope = _check_rope(rope, q.shape[2], max_len, device)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be a finite host float")
    backend = resolve_backend(backend, device)
    if backend == "reference":
        return block_attention_reference(q, k, v, offsets, block_size=block_size, rope=rope, scale=float(scale))
    if q.shape[2] not in TRITON_HEAD_DIMS:
        raise ValueError(f"q.shape[2]={q.shape[2]} (head dim D) must be one of {TRITON_HEAD_DIMS} for backend='triton'")
    if block_size > TRITON_MAX_BLOCK:
        raise ValueError(f"block_size={block_size} must be <= {TRITON_MAX_BLOCK} for backend='triton'")
    check_triton_device(device)
    cos, sin = rope if rope is not None else (None, None)
    args = (q, k, v, offsets, max_len, block_size, cos, sin, float(scale))
    if torch.compiler.is_compiling():
        traced: torch.Tensor = torch.ops.gem_kernels.block_attention_fwd(*args)
        return traced
    # Eager: a plain autograd.Function over the same launchers (the custom op's Python
    # dispatch costs more host time than this memory-bound kernel takes on the GPU), and the
    # bare launcher where no gradient is wanted (the Function's apply alone costs ~11 us of
    # host time, kernels/BENCHMARKS.md 2026-12-04).
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out: torch.Tensor = _BlockFunction.apply(*args)  # type: ignore[no-untyped-call]
    else:
        out = block_forward_triton(*args)
    _remember(key, q, k, v, offsets, max_len, block_size, cos, sin, float(scale))
    return out


class _BlockFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        q, k, v, offsets, max_len, block_size, cos, sin, scale = args
        ctx.save_for_backward(q, k, v, offsets, cos, sin)
        ctx.meta = (max_len, block_size, scale)
        return block_forward_triton(*args)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, offsets, cos, sin = ctx.saved_tensors
        max_len, block_size, scale = ctx.meta
        dq, dk, dv = block_backward_triton(dout, q, k, v, offsets, max_len, block_size, cos, sin, scale)
        return dq, dk, dv, None, None, None, None, None, None


# --- the eager fast path: one plan per call signature -----------------------------------------
#
# Issue 15: an eager call's checks and launch set-up took more host time than its kernel takes
# on the GPU (kernels/BENCHMARKS.md). All of it depends only on the call's signature: the
# tensors' classes, dtypes, devices, strides and [H, D], the offsets' [B+1], the host scalars'
# types, block_size, scale, backend, the rope tables' metadata. The first call with a signature
# runs every check and keeps a `_Plan`. A later call builds the signature, looks it up, checks
# what the signature leaves out (T and max_len change every batch; 16-byte alignment; grad
# mode; the offsets' contents wherever the ordinary path reads them) and launches the kept
# binary straight away. Anything else, or anything it does not vouch for, takes the ordinary path.

_PLANS: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 1024  # one per (dtype, H, D, B, ...) met; cleared when full


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """What the first call with one signature checked and worked out."""

    launch: dict[str, Any]  # LAUNCH then: a sweep's change makes a new plan
    recheck: bool  # not on CUDA: the offsets' contents and TRITON_INTERPRET are read every call
    max_len: int  # the largest max_len the checks allow (the rope tables' rows)
    scale: float  # the default, 1/sqrt(D)
    b: int
    heads: int
    heads_inner: bool
    ints: tuple[int, ...]  # the kernel's stride arguments (every tensor contiguous)
    meta: dict[str, Any]
    direct: DirectLaunch | None  # None: through the CachedLaunch (under Triton's interpreter)


def _planned(
    q: Any, k: Any, v: Any, offsets: Any, max_len: Any, block_size: Any, rope: Any, scale: Any, backend: Any,
) -> tuple[tuple[Any, ...] | None, torch.Tensor | None]:
    """(the call's signature, its result where a plan serves it, else None). The signature is
    None for arguments no plan is made for (the ordinary checks then name what is wrong)."""
    if rope is not None and not isinstance(rope, (tuple, list)):
        return None, None
    try:
        qs = q.shape
        # Classes before values: `True == 1` and `1 == 1.0` must not match.
        key = (backend, block_size.__class__, block_size, scale.__class__, scale, max_len.__class__,
               q.__class__, q.dtype, q.device, qs[1], qs[2], q.stride(),
               k.__class__, k.dtype, k.device, k.stride(), v.__class__, v.dtype, v.device, v.stride(),
               offsets.__class__, offsets.dtype, offsets.device, offsets.shape, offsets.stride(),
               None if rope is None else _tables_signature(rope))
        plan = _PLANS.get(key)
    except (AttributeError, IndexError, TypeError, ValueError):  # not tensors, an unhashable scale, ...
        return None, None
    # What the signature leaves out: T (k and v as q), max_len, LAUNCH, alignment.
    if plan is None or not (k.shape == qs and v.shape == qs and 0 <= max_len <= plan.max_len
                            and plan.launch == LAUNCH):
        return key, None
    qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), offsets.data_ptr()
    if rope is None:  # q stands in for the absent tables, as in the launcher
        cos = sin = None
        cos_t, sin_t, cp, sp = q, q, qp, qp
    else:
        cos, sin = cos_t, sin_t = rope
        cp, sp = cos.data_ptr(), sin.data_ptr()
    if (qp | kp | vp | op | cp | sp) & 15:
        return key, None
    if plan.recheck or debug_checks():  # what the ordinary path reads from values or the env
        check_offsets(offsets, "offsets", total=qs[0], max_len=max_len, max_len_name="max_len")
        check_triton_device(q.device)
    s = plan.scale if scale is None else float(scale)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        tracked: torch.Tensor = _BlockFunction.apply(  # type: ignore[no-untyped-call]
            q, k, v, offsets, max_len, block_size, cos, sin, s)
        return key, tracked
    out = torch.empty_like(q)
    t, b, h = qs[0], plan.b, plan.heads
    if t == 0:
        return key, out
    n = _blocks(t, b, max_len, block_size)
    grid = (n * h, 1, 1) if plan.heads_inner else (n, h, 1)
    outp = out.data_ptr()
    direct = plan.direct
    if direct is None or outp & 15 or not direct(grid, (qp, kp, vp, outp, cp, sp, op, *plan.ints, s, b, h)):
        _launchers()[0](grid, (q, k, v, out, cos_t, sin_t, offsets, *plan.ints, s, b, h), plan.meta)
    return key, out


def _tables_signature(rope: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    cos, sin = rope
    return (rope.__class__, cos.__class__, cos.dtype, cos.device, cos.shape, cos.stride(),
            sin.__class__, sin.dtype, sin.device, sin.shape, sin.stride())


def _remember(
    key: tuple[Any, ...] | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
    max_len: int, block_size: int, cos: torch.Tensor | None, sin: torch.Tensor | None, scale: float,
) -> None:
    """Keeps a plan for `key` after the ordinary path checked and launched a call with it, where
    that call's launch is the plan's: contiguous, 16-byte aligned inputs, T > 0, B > 0."""
    t, h, d = q.shape
    b = offsets.shape[0] - 1
    tables = () if cos is None or sin is None else (cos, sin)
    if (key is None or t == 0 or b == 0 or aligned_pointers(q, k, v, offsets, *tables) is None
            or not offsets.is_contiguous()
            or any(x.stride() != (h * d, d, 1) for x in (q, k, v))
            or any(x.stride() != (d // 2, 1) for x in tables)):
        return
    _, meta = _launch_common(q, offsets, max_len, block_size, rope=bool(tables))
    ints = (h * d, d) * 4 + ((d // 2) if tables else 0,)
    # q stands in for out (same dtype, both aligned): the specialization of the call just made.
    cos_t, sin_t = tables or (q, q)
    launcher = _launchers()[0]
    direct = launcher.direct((q, k, v, q, cos_t, sin_t, offsets, *ints, scale, b, h), meta)
    if direct is None and not launcher.interpret:  # e.g. launched under a profiler's hook
        return
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = _Plan(
        launch=dict(LAUNCH), recheck=q.device.type != "cuda",
        max_len=cos_t.shape[0] if tables else sys.maxsize, scale=1.0 / math.sqrt(d), b=b, heads=h,
        heads_inner=bool(meta["HEADS_INNER"]), ints=ints, meta=meta, direct=direct,
    )


# --- Triton launchers ------------------------------------------------------------------------


# Launch layout, module-level so a sweep (tools/sweep_block.py) can try others on the GPU:
# heads_inner puts the heads of one block in neighbouring programs of a 1-D grid (they read
# neighbouring bytes of each token's [H, D] row); num_warps None picks by tile size. On the
# H200 (issue 15's batch, CUDA-graph replay, 2026-12-04) the heads-inner forward moved 3.62 TB/s
# against 3.49 for the 2-D grid (a copy: 3.74); the backward was the same either way (2.92 vs
# 2.93), so it keeps the 2-D grid.
LAUNCH: dict[str, Any] = {"heads_inner": True, "heads_inner_bwd": False, "num_warps": None, "num_warps_bwd": None}


def _launch_common(
    q: torch.Tensor, offsets: torch.Tensor, max_len: int, block_size: int, *, bwd: bool = False, rope: bool = False,
) -> tuple[tuple[int, ...], dict[str, Any]]:
    """(grid, constexprs and launch options) of one launch; the dict is cached and shared: read it,
    never change it."""
    t, h, d = q.shape
    return _launch_meta(t, h, d, offsets.numel() - 1, max_len, block_size, q.dtype, bwd, rope,
                        tuple(LAUNCH.items()))


@functools.lru_cache(maxsize=256)
def _launch_meta(
    t: int, h: int, d: int, b: int, max_len: int, block_size: int, dtype: torch.dtype, bwd: bool, rope: bool,
    launch: tuple[tuple[str, Any], ...],
) -> tuple[tuple[int, ...], dict[str, Any]]:
    from gem_kernels._gdpa import _block_b, _prec

    lay = dict(launch)
    blocks = _blocks(t, b, max_len, block_size)
    heads_inner = bool(lay["heads_inner_bwd" if bwd else "heads_inner"])
    grid: tuple[int, ...] = (blocks * h,) if heads_inner else (blocks, h)
    bsp = max(16, 1 << (block_size - 1).bit_length())
    warps = lay["num_warps_bwd" if bwd else "num_warps"] or (4 if bsp * d <= 64 * 128 else 8)
    meta: dict[str, Any] = dict(
        D=d, BS=block_size, BSP=bsp, BLOCK_B=_block_b(b), PREC=_prec(dtype), HEADS_INNER=heads_inner, ROPE=rope,
        num_warps=warps, num_stages=1,
    )
    return grid, meta


def _blocks(t: int, b: int, max_len: int, block_size: int) -> int:
    """Programs per head: at most T // block_size + B blocks, and B * cdiv(max_len, block_size)."""
    by_tokens, by_len = t // block_size + b, b * (cdiv(max_len, block_size) or 1)
    return by_tokens if by_tokens < by_len else by_len  # (min() costs more, on the eager fast path)


@functools.cache
def _launchers() -> tuple[CachedLaunch, CachedLaunch]:
    """The forward's and backward's cached launches (`gem_kernels._launch`), made on first use."""
    from gem_kernels._triton_block import _block_bwd_kernel, _block_fwd_kernel

    return CachedLaunch(_block_fwd_kernel), CachedLaunch(_block_bwd_kernel)


def block_forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, max_len: int,
    block_size: int, cos: torch.Tensor | None, sin: torch.Tensor | None, scale: float,
) -> torch.Tensor:
    """Launches the Triton forward. Returns `[T, H, D]`."""
    q, k, v, offsets = q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous()
    out = torch.empty_like(q)
    b = offsets.numel() - 1
    if q.shape[0] == 0 or b == 0:
        return out
    rope = cos is not None and sin is not None
    grid, meta = _launch_common(q, offsets, max_len, block_size, rope=rope)
    cos_t = cos.contiguous() if cos is not None else q
    sin_t = sin.contiguous() if sin is not None else q
    _launchers()[0](grid, (
        q, k, v, out, cos_t, sin_t, offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), cos_t.stride(0) if rope else 0, scale, b, q.shape[1]), meta)
    return out


def block_backward_triton(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
    max_len: int, block_size: int, cos: torch.Tensor | None, sin: torch.Tensor | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launches the fused Triton backward (RoPE undone in-kernel). Returns (dq, dk, dv)."""
    q, k, v, dout, offsets = q.contiguous(), k.contiguous(), v.contiguous(), dout.contiguous(), offsets.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    b = offsets.numel() - 1
    if q.shape[0] == 0 or b == 0:
        return dq, dk, dv
    rope = cos is not None and sin is not None
    grid, meta = _launch_common(q, offsets, max_len, block_size, bwd=True, rope=rope)
    cos_t = cos.contiguous() if cos is not None else q
    sin_t = sin.contiguous() if sin is not None else q
    _launchers()[1](grid, (
        q, k, v, dout, dq, dk, dv, cos_t, sin_t, offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
        dv.stride(0), dv.stride(1), cos_t.stride(0) if rope else 0, scale, b, q.shape[1]), meta)
    return dq, dk, dv


# --- torch.library registration of the Triton path -------------------------------------------


@torch.library.custom_op("gem_kernels::block_attention_fwd", mutates_args=())
def _block_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    block_size: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    return block_forward_triton(q, k, v, offsets, max_len, block_size, cos, sin, scale)


@_block_fwd.register_fake
def _block_fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    block_size: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    return q.new_empty(q.shape)  # contiguous, as the launcher's output (q may be a strided view)


@torch.library.custom_op("gem_kernels::block_attention_bwd", mutates_args=())
def _block_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    block_size: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return block_backward_triton(dout, q, k, v, offsets, max_len, block_size, cos, sin, scale)


@_block_bwd.register_fake
def _block_bwd_fake(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    block_size: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _block_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    q, k, v, offsets, max_len, block_size, cos, sin, scale = inputs
    ctx.save_for_backward(q, k, v, offsets, cos, sin)
    ctx.meta = (max_len, block_size, scale)


def _block_backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, k, v, offsets, cos, sin = ctx.saved_tensors
    max_len, block_size, scale = ctx.meta
    dq, dk, dv = torch.ops.gem_kernels.block_attention_bwd(
        dout.contiguous(), q, k, v, offsets, max_len, block_size, cos, sin, scale
    )
    return dq, dk, dv, None, None, None, None, None, None


_block_fwd.register_autograd(_block_backward, setup_context=_block_setup_context)
