# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Row-wise Adagrad for embedding tables, in place, in one pass (fbgemm's exact row-wise rule).

Why this op exists: a trainer without fbgemm's fused table backward holds dense table
gradients, and the plain-PyTorch update walks every table several times per step (zero the
gradient on a skipped step, square, mean, divide, add: ~10 GB of traffic for the h200
preset's 1.8 GB of tables, ~6 ms of a 250 ms step on the H200). The Triton kernel reads each
gradient row once and touches the weight and accumulator only where the row's gradient is
not zero: in a Zipf id stream most rows are absent from a step, so their weights are not
even read.

    acc[r] += mean_j g[r, j]^2 ;  w[r] -= lr * g[r] / (sqrt(acc[r]) + eps)   (rows with g[r] != 0)

`skip` (a bool device scalar, e.g. "this step's loss is not finite"): when true the call
changes nothing, bit for bit, whatever the gradient holds (NaN included), and no host sync
decides it.

Sparse gradients (`nn.Embedding(..., sparse=True)` / `nn.EmbeddingBag(..., sparse=True)`: a
sparse COO tensor holding one row per looked-up id, duplicates not summed) take the same rule
without a dense `[R, D]` gradient ever existing: the ids are sorted, each distinct id gets a
compact row, torch's own deterministic segment sum (`embedding_dense_backward`) adds the
duplicates into an `[ids, D]` buffer, and the kernel updates the tables' rows through the id
of each compact row. No step of it waits on the host (the count of distinct ids stays on the
device: compact rows past it are zero and skipped), so a training step keeps no host sync.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gem_kernels._jagged import check_triton_device, resolve_backend
from gem_kernels._launch import cdiv

_BACKENDS = ("auto", "triton", "reference")


def rowwise_adagrad_(
    weight: torch.Tensor,
    acc: torch.Tensor,
    grad: torch.Tensor,
    *,
    lr: float,
    eps: float,
    skip: torch.Tensor | None = None,
    backend: str = "auto",
) -> None:
    """One exact row-wise Adagrad step on `weight` `[R, D]` and its accumulator `acc` `[R]`, in place.

    Args:
        weight: the table (float32, bf16 or fp16), rows with a unit column stride.
        acc: float32 `[R]` accumulator of mean squared row gradients.
        grad: `[R, D]`, the table's gradient: dense (all-zero rows are left untouched) or a
            sparse COO tensor with one sparse and one dense dimension, coalesced or not (what an
            embedding module with `sparse=True` produces; rows of absent ids are untouched).
        lr: step size (>= 0; 0 changes only the accumulator).
        eps: added to the root of the accumulator (>= 0).
        skip: optional bool scalar on the table's device; when true nothing changes.
        backend: "triton", "reference" (plain PyTorch) or "auto" (Triton on CUDA).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {_BACKENDS}")
    if weight.dim() != 2:
        raise ValueError(f"weight.shape={tuple(weight.shape)} must be [rows, dim]")
    if grad.shape != weight.shape:
        raise ValueError(f"grad.shape={tuple(grad.shape)} must equal weight.shape={tuple(weight.shape)}")
    if acc.shape != weight.shape[:1] or acc.dtype != torch.float32:
        raise ValueError(f"acc must be float32 [rows={weight.shape[0]}], got {acc.dtype} {tuple(acc.shape)}")
    sparse = grad.layout == torch.sparse_coo
    if sparse and (grad.sparse_dim() != 1 or grad.dense_dim() != 1):
        raise ValueError(f"a sparse grad must have 1 sparse and 1 dense dimension (rows of [rows, dim]), got "
                         f"sparse_dim={grad.sparse_dim()} dense_dim={grad.dense_dim()}")
    if not sparse and grad.layout != torch.strided:
        raise ValueError(f"grad.layout={grad.layout} must be torch.strided or torch.sparse_coo")
    if not weight.is_floating_point() or not grad.is_floating_point():
        raise ValueError(f"weight.dtype={weight.dtype} and grad.dtype={grad.dtype} must be floating point")
    # lr 0 is allowed (a no-op step): torch.distributed.checkpoint initialises an optimizer's
    # state by stepping it once with lr 0 and zero gradients.
    if not lr >= 0 or not eps >= 0 or not math.isfinite(lr):
        raise ValueError(f"lr={lr} must be finite and >= 0, and eps={eps} >= 0")
    if skip is not None and (skip.numel() != 1 or skip.dtype != torch.bool or skip.device != weight.device):
        raise ValueError(f"skip must be a bool scalar on {weight.device}, got {skip.dtype} "
                         f"{tuple(skip.shape)} on {skip.device}")
    if len({weight.device, acc.device, grad.device}) != 1:
        raise ValueError(f"weight, acc and grad must be on one device, got {weight.device}, {acc.device}, {grad.device}")
    backend = resolve_backend(backend, weight.device)
    if backend == "reference" or weight.numel() == 0:
        rowwise_adagrad_reference_(weight, acc, grad, lr=lr, eps=eps, skip=skip)
        return
    check_triton_device(weight.device)
    ids: torch.Tensor | None = None
    if sparse:
        ids, grad = _compact(grad)
        if grad.shape[0] == 0:
            return
    if weight.stride(1) != 1 or grad.stride(1) != 1 or not acc.is_contiguous():
        raise ValueError("backend='triton' needs weight and grad with a unit column stride and a contiguous acc")
    rows, dim = grad.shape
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, min(16, 4096 // block_d))
    _rowwise_adagrad_kernel[(cdiv(rows, block_r),)](
        weight, acc, grad, ids if ids is not None else acc, skip if skip is not None else acc, rows, dim,
        weight.stride(0), grad.stride(0), float(lr), float(eps), HAS_IDS=ids is not None,
        HAS_SKIP=skip is not None, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4,
    )


def _compact(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse COO gradient as (ids `[N]`, rows `[N, D]` float32): row i is the sum of the
    gradient rows of the i-th distinct id (in id order) for i below the number of distinct
    ids, zero after it (id 0 there; the kernel skips zero rows). N = the looked-up ids, so the
    count of distinct ids never has to reach the host."""
    idx, vals = grad._indices()[0], grad._values()
    n = idx.numel()
    if n == 0:
        return idx, vals.reshape(0, grad.shape[1])
    sidx, order = torch.sort(idx, stable=True)
    start = torch.ones(n, dtype=torch.bool, device=idx.device)
    torch.ne(sidx[1:], sidx[:-1], out=start[1:])
    run = torch.cumsum(start, 0) - 1  # compact row of each sorted position
    rid = torch.empty_like(run).scatter_(0, order, run)  # ... of each position as given
    ids = torch.zeros_like(sidx).scatter_(0, run, sidx)  # a run's positions all write its id
    # torch's embedding backward: a deterministic segment sum (sort, then per-segment adds).
    rows = torch.ops.aten.embedding_dense_backward(vals.float(), rid, n, -1, False)
    return ids, rows


@torch.no_grad()
def rowwise_adagrad_reference_(
    weight: torch.Tensor, acc: torch.Tensor, grad: torch.Tensor, *, lr: float, eps: float,
    skip: torch.Tensor | None = None,
) -> None:
    """The plain-PyTorch update (the specification); a sparse `grad` is coalesced (duplicate
    ids summed in float32, as the kernel does) and only its rows are updated."""
    if grad.layout == torch.sparse_coo:
        c = grad.float().coalesce()
        ids, v = c.indices()[0], c.values()
        if skip is not None:
            v = torch.where(skip, 0.0, v)
        acc.index_add_(0, ids, v.square().mean(dim=1))
        weight.index_add_(0, ids, (v / (acc[ids].sqrt() + eps)[:, None]).to(weight.dtype), alpha=-lr)
        return
    g = grad.float()
    if skip is not None:
        g = torch.where(skip, 0.0, g)
    acc.add_(g.square().mean(dim=1))
    # A zero-gradient row gets a zero update: g is 0 there, whatever acc is.
    weight.add_((g / (acc.sqrt() + eps)[:, None]).to(weight.dtype), alpha=-lr)


# `rows` is not specialised on: for a compacted sparse gradient it is the step's id count, which
# changes every step (each new divisibility class would compile once more, ~1-2 s on the H200).
@triton.jit(do_not_specialize=["rows"])
def _rowwise_adagrad_kernel(W, ACC, G, IDS, SKIP, rows, dim, stride_w, stride_g, lr, eps, HAS_IDS: tl.constexpr,
                            HAS_SKIP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # Gradient row r updates table row IDS[r] (HAS_IDS: a compacted sparse gradient), else row r.
    if HAS_SKIP:  # (else SKIP is an unused stand-in pointer)
        if tl.load(SKIP):
            return
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    r_ok = r < rows
    m = r_ok[:, None] & (c < dim)[None, :]
    r64 = r.to(tl.int64)
    g = tl.load(G + r64[:, None] * stride_g + c[None, :], mask=m, other=0.0).to(tl.float32)
    sq = tl.sum(g * g, axis=1)
    # NaN != 0: a non-finite row is updated (and poisoned) as the reference does.
    hit = r_ok & (sq != 0.0)
    if HAS_IDS:
        t = tl.load(IDS + r64, mask=hit, other=0).to(tl.int64)
    else:
        t = r64
    a = tl.load(ACC + t, mask=hit, other=0.0) + sq / dim
    tl.store(ACC + t, a, mask=hit)
    wm = hit[:, None] & m
    w_ptr = W + t[:, None] * stride_w + c[None, :]
    w = tl.load(w_ptr, mask=wm, other=0.0)
    step = g / (tl.sqrt(a) + eps)[:, None]
    new = w.to(tl.float32) - lr * step.to(w.dtype).to(tl.float32)
    tl.store(w_ptr, new.to(w.dtype), mask=wm)
