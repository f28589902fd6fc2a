"""Public MX cast: argument checks and the backend dispatch (reference | triton)."""

from __future__ import annotations

import math
import os
from typing import Literal

import torch

from gem_precision._formats import (
    SUPPORTED_INPUT_DTYPES,
    MXTensor,
    ScaleMode,
    elem_format,
    to_mx_reference,
)

Backend = Literal["auto", "triton", "reference"]
_TRITON_BLOCKS = (16, 32, 64, 128)


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through TRITON_INTERPRET=1."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(backend: str, t: torch.Tensor) -> Literal["triton", "reference"]:
    """"auto" -> triton on CUDA tensors, reference elsewhere; checks an explicit choice."""
    if backend == "auto":
        return "triton" if t.is_cuda else "reference"
    if backend == "reference":
        return "reference"
    if backend == "triton":
        if not (t.is_cuda or interpreting()):
            raise ValueError(f"{backend=} needs a CUDA tensor or TRITON_INTERPRET=1 (got device {t.device})")
        return "triton"
    raise ValueError(f"{backend=} must be 'auto', 'triton' or 'reference'")


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a low-precision linear returns: nn.Linear's (the autocast dtype where autocast
    is on for x's device, else x's dtype). The GEMMs write bf16, and a cast gives the rest
    (inside the autograd function, so its backward receives dY in that dtype, unrounded)."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def weight_rows(lin: torch.nn.Linear, start: int, stop: int, block: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`lin`'s weight and bias rows `start:stop` for its `forward_slice`, after checking the
    bounds: 0 <= start < stop <= out_features, both multiples of the recipe's block (so the
    slice's weight blocks are the full weight's)."""
    for name, v in (("start", start), ("stop", stop)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name}={v!r} must be an int")
        if v % block:
            raise ValueError(f"{name}={v} must be a multiple of {block} (the recipe's weight block)")
    if not 0 <= start < stop <= lin.out_features:
        raise ValueError(f"start={start}, stop={stop} must satisfy 0 <= start < stop <= out_features={lin.out_features}")
    return lin.weight[start:stop], None if lin.bias is None else lin.bias[start:stop]


def check_mx_args(x: torch.Tensor, elem_dtype: torch.dtype, block_size: int, dim: int, scale_mode: str, pad: bool) -> int:
    """Validates to_mx's arguments; returns the non-negative dim."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"{x.dtype=} must be one of float32, bfloat16, float16")
    elem_format(elem_dtype)
    if scale_mode not in ("floor", "rceil"):
        raise ValueError(f"{scale_mode=} must be 'floor' (OCP MX spec) or 'rceil' (NVIDIA)")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{block_size=} must be a positive int")
    if x.dim() == 0:
        raise ValueError(f"{x.shape=} must have at least one dim")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{dim=} out of range for {x.dim()}-d x")
    d = dim % x.dim()
    if x.shape[d] % block_size and not pad:
        raise ValueError(
            f"x.shape[{dim}]={x.shape[d]} must be a multiple of {block_size=} (or pass pad=True to zero-pad the last block)"
        )
    return d


def to_mx(
    x: torch.Tensor,
    *,
    elem_dtype: torch.dtype = torch.float8_e4m3fn,
    block_size: int = 32,
    dim: int = -1,
    scale_mode: ScaleMode = "floor",
    pad: bool = False,
    backend: Backend = "auto",
) -> MXTensor:
    """Quantize x to MX (OCP MX v1.0) along `dim`.

    Runs the custom op `torch.ops.gem_precision.quantize`, so it traces under torch.compile.

    Args:
        x: [..., n, ...] fp32 / bf16 / fp16 tensor.
        elem_dtype: torch.float8_e4m3fn (max 448) or torch.float8_e5m2 (max 57344).
        block_size: elements sharing one E8M0 scale (32 in the spec).
        dim: the blocked dimension; its size must be a multiple of block_size unless pad.
        scale_mode: "floor" (spec) or "rceil" (smallest power of two >= amax / max_elem).
        pad: zero-pad the last partial block (zeros never change a block's scale).
        backend: "auto" (Triton on CUDA, reference elsewhere), "triton" or "reference".

    Returns:
        MXTensor: data x.shape in elem_dtype, scale uint8 x.shape with n -> ceil(n/block).
    """
    d = check_mx_args(x, elem_dtype, block_size, dim, scale_mode, pad)
    be = resolve_backend(backend, x)
    if not torch.compiler.is_compiling():  # eager: skip the op dispatch (~0.1 ms of host time)
        return _to_mx_impl(x, elem_dtype, block_size, d % x.dim(), scale_mode, be)
    data, scale = torch.ops.gem_precision.quantize(x, elem_dtype, block_size, d, scale_mode, be)
    return MXTensor(data=data.view(elem_dtype), scale=scale, dim=d, block_size=block_size, elem_dtype=elem_dtype)


@torch.library.custom_op("gem_precision::quantize", mutates_args=())
def quantize_op(x: torch.Tensor, elem_dtype: torch.dtype, block_size: int, dim: int, scale_mode: str,
                backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MX cast of x along `dim` (partial last block zero-padded) -> (data as uint8 codes, scale).

    `backend` is "triton" or "reference" (already resolved); arguments are checked by `to_mx`.
    """
    t = _to_mx_impl(x, elem_dtype, block_size, dim % x.dim(), scale_mode, backend)
    return t.data.view(torch.uint8), t.scale


@quantize_op.register_fake
def _quantize_fake(x: torch.Tensor, elem_dtype: torch.dtype, block_size: int, dim: int, scale_mode: str,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    d = dim % x.dim()
    sshape = list(x.shape)
    sshape[d] = -(-sshape[d] // block_size)
    return x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(sshape, dtype=torch.uint8)


def _to_mx_impl(x: torch.Tensor, elem_dtype: torch.dtype, block_size: int, d: int, scale_mode: str,
                be: str) -> MXTensor:
    mode: ScaleMode = "rceil" if scale_mode == "rceil" else "floor"
    if be == "reference" or block_size not in _TRITON_BLOCKS or x.numel() >= 2**31:
        return to_mx_reference(x, elem_dtype=elem_dtype, block_size=block_size, dim=d, scale_mode=mode)
    from gem_precision._triton_quant import quantize_2d

    fmt = elem_format(elem_dtype)
    rceil = mode == "rceil"
    # 2-D views with explicit sizes: reshape(-1, n) is ambiguous for an empty x ([4, 0])
    if d == x.dim() - 1:
        x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
        r, _ = quantize_2d(x2, fmt, block_size=block_size, rceil=rceil, row=True, col=None)
        assert r is not None
        return MXTensor(
            data=r.data.reshape(x.shape),
            scale=r.scale.reshape(*x.shape[:-1], r.scale.shape[-1]),
            dim=d, block_size=block_size, elem_dtype=elem_dtype,
        )
    if d == 0:
        x2 = x.reshape(x.shape[0], math.prod(x.shape[1:]))
        _, c = quantize_2d(x2, fmt, block_size=block_size, rceil=rceil, row=False, col="same")
        assert c is not None
        return MXTensor(
            data=c.data.reshape(x.shape),
            scale=c.scale.reshape(c.scale.shape[0], *x.shape[1:]),
            dim=0, block_size=block_size, elem_dtype=elem_dtype,
        )
    # A middle dim: move it last, cast, move back.
    t = _to_mx_impl(x.movedim(d, -1).contiguous(), elem_dtype, block_size, x.dim() - 1, mode, be)
    return MXTensor(
        data=t.data.movedim(-1, d).contiguous(), scale=t.scale.movedim(-1, d).contiguous(),
        dim=d, block_size=block_size, elem_dtype=elem_dtype,
    )


def to_mx_2d_both(
    x: torch.Tensor,
    *,
    elem_dtype: torch.dtype = torch.float8_e4m3fn,
    scale_mode: ScaleMode = "floor",
    backend: Backend = "auto",
) -> tuple[MXTensor, MXTensor]:
    """From one read of x [R, C]: x blocked along C, and x.T [C, R] blocked along R.

    Both outputs are K-major GEMM operands (their blocked dim is the last, contiguous one):
    a weight W [N, K] gives the forward operand (along K) and W.T for the input gradient
    (along N). Partial last blocks are zero-padded (pad=True semantics). Runs the custom op
    `torch.ops.gem_precision.quantize_both`.
    """
    if x.dim() != 2:
        raise ValueError(f"{x.shape=} must be 2-D [R, C]")
    check_mx_args(x, elem_dtype, 32, -1, scale_mode, True)
    be = resolve_backend(backend, x)
    if not torch.compiler.is_compiling():  # eager: skip the op dispatch
        return _quantize_both_impl(x, elem_dtype, scale_mode, be)
    rd, rs, td, ts = torch.ops.gem_precision.quantize_both(x, elem_dtype, scale_mode, be)
    return (MXTensor(data=rd.view(elem_dtype), scale=rs, dim=1, block_size=32, elem_dtype=elem_dtype),
            MXTensor(data=td.view(elem_dtype), scale=ts, dim=1, block_size=32, elem_dtype=elem_dtype))


@torch.library.custom_op("gem_precision::quantize_both", mutates_args=())
def quantize_both_op(x: torch.Tensor, elem_dtype: torch.dtype, scale_mode: str,
                     backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, C] -> (x along C: uint8 codes [R, C], scale [R, ceil(C/32)];
    x.T along R: codes [C, R], scale [C, ceil(R/32)]), from one read on the Triton path."""
    r, c = _quantize_both_impl(x, elem_dtype, scale_mode, backend)
    return r.data.view(torch.uint8), r.scale, c.data.view(torch.uint8), c.scale


def _quantize_both_impl(x: torch.Tensor, elem_dtype: torch.dtype, scale_mode: str,
                        backend: str) -> tuple[MXTensor, MXTensor]:
    mode: ScaleMode = "rceil" if scale_mode == "rceil" else "floor"
    if backend == "reference":
        return (to_mx_reference(x, elem_dtype=elem_dtype, dim=1, scale_mode=mode),
                to_mx_reference(x.t(), elem_dtype=elem_dtype, dim=1, scale_mode=mode))
    from gem_precision._triton_quant import quantize_2d

    r2, c2 = quantize_2d(x, elem_format(elem_dtype), block_size=32, rceil=mode == "rceil", row=True, col="t")
    assert r2 is not None and c2 is not None
    return r2, c2


@quantize_both_op.register_fake
def _quantize_both_fake(x: torch.Tensor, elem_dtype: torch.dtype, scale_mode: str,
                        backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    R, C = x.shape
    u8 = torch.uint8
    return (x.new_empty((R, C), dtype=u8), x.new_empty((R, -(-C // 32)), dtype=u8),
            x.new_empty((C, R), dtype=u8), x.new_empty((C, -(-R // 32)), dtype=u8))
