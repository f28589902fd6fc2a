"""MX formats (OCP Microscaling Formats v1.0) and the plain-PyTorch reference cast.

This file is the specification the Triton kernels are tested against bit for bit.

An MX block is `block_size` (32 in the spec) consecutive elements along one dim sharing one
E8M0 scale X = 2^(byte - 127) (byte 255 = NaN, spec §5.4); each element P_i is FP8 and
decodes to X * P_i (spec §6.2). Conversion (spec §6.3):

* scale rule "floor" (the spec): X = 2^(floor(log2 amax) - emax_elem), emax_elem = 8 for
  E4M3 and 15 for E5M2. amax / X lies in [2^emax, 2^(emax+1)), so the largest elements of a
  block can exceed the element max (448 / 57344) and saturate.
* scale rule "rceil" (NVIDIA's cuBLAS/Blackwell rule): X = the smallest power of two with
  amax / X <= max_elem; nothing saturates. Computed exactly from amax's exponent and
  mantissa (max_elem = 1.75 * 2^emax for both formats). Near fp32's max (amax > 1.9375 *
  2^127) an element can round up to X * P = 2^128, beyond fp32: `dequantize` saturates it to
  fp32's max rather than return Inf (floor mode saturates the element instead).
* the exponent is clamped to the E8M0 range [-127, 127]; an all-zero block gets byte 0.
* elements: x / X rounded to nearest, ties to even, then saturated to +-max_elem (the spec's
  "saturating" conversion; E4M3FN has no Inf). Signed zeros keep their sign.
* NaN: a block holding a NaN gets scale byte 255 and every element stores the NaN code 0x7F.
* Inf (a rule the spec leaves to the implementation; ours): a block holding +-Inf is treated
  like a NaN block (scale 255, elements 0x7F), because E8M0 x FP8 cannot represent Inf and
  saturating it would silently turn an overflow into a finite number. Dequantizing gives NaN.
* inputs may be fp32, bf16 or fp16; subnormal inputs are handled exactly (fp32 arithmetic on
  powers of two is exact here, see `to_mx_reference`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

ScaleMode = Literal["floor", "rceil"]

E8M0_BIAS = 127
E8M0_NAN = 255
FP8_NAN_CODE = 0x7F
SUPPORTED_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ElemFormat:
    """Constants of one FP8 element format (OCP MX v1.0 §5.3)."""

    dtype: torch.dtype
    mbits: int  # explicit mantissa bits
    emax: int  # exponent of the largest normal binade
    emin: int  # exponent of the smallest normal binade
    max_normal: float
    max_code: int  # bit pattern of +max_normal


E4M3 = ElemFormat(dtype=torch.float8_e4m3fn, mbits=3, emax=8, emin=-6, max_normal=448.0, max_code=0x7E)
E5M2 = ElemFormat(dtype=torch.float8_e5m2, mbits=2, emax=15, emin=-14, max_normal=57344.0, max_code=0x7B)
FORMATS = {E4M3.dtype: E4M3, E5M2.dtype: E5M2}


def elem_format(elem_dtype: torch.dtype) -> ElemFormat:
    """The `ElemFormat` of `elem_dtype`; TypeError for anything but E4M3FN / E5M2."""
    if elem_dtype not in FORMATS:
        raise TypeError(f"elem_dtype={elem_dtype} must be torch.float8_e4m3fn or torch.float8_e5m2")
    return FORMATS[elem_dtype]


@dataclasses.dataclass(frozen=True)
class MXTensor:
    """An MX-quantized tensor.

    Attributes:
        data: FP8 elements, same shape as the source tensor.
        scale: uint8 E8M0 bytes, the source shape with `dim` replaced by
            ceil(size / block_size).
        dim: the (non-negative) blocked dimension.
        block_size: elements per scale.
        elem_dtype: torch.float8_e4m3fn or torch.float8_e5m2.
    """

    data: torch.Tensor
    scale: torch.Tensor
    dim: int
    block_size: int
    elem_dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decode to `dtype`: exact in fp32, saturated to +-max where X * P_i is beyond `dtype`'s
        range (see `dequantize_reference`; only "rceil" blocks near fp32's max reach it in fp32)."""
        return dequantize_reference(self, dtype)


def scale_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> fp32 2^(byte-127), exactly (byte 0 -> the subnormal 2^-127; 255 -> NaN)."""
    b = scale.to(torch.int32)
    normal = (b.clamp(1, 254) << 23).view(torch.float32)
    out = torch.where(b == 0, torch.full_like(normal, 2.0**-127), normal)
    return torch.where(b == E8M0_NAN, torch.full_like(out, float("nan")), out)


def _blocked(x: torch.Tensor, dim: int, block_size: int) -> torch.Tensor:
    """x with `dim` moved last, zero-padded to a multiple of block_size: [..., nb, block]."""
    xm = x.movedim(dim, -1)
    n = xm.shape[-1]
    pad = (-n) % block_size
    if pad:
        xm = torch.nn.functional.pad(xm, (0, pad))
    return xm.reshape(*xm.shape[:-1], (n + pad) // block_size, block_size)


def scale_bytes_reference(amax: torch.Tensor, fmt: ElemFormat, scale_mode: ScaleMode) -> torch.Tensor:
    """E8M0 scale bytes (uint8) from block maxima |x| (fp32), per the rules in the module doc."""
    mant, exp = torch.frexp(amax)  # amax = mant * 2^exp, mant in [0.5, 1); exact, subnormals too
    e = exp.to(torch.int32) - 1  # floor(log2 amax)
    if scale_mode == "rceil":
        e = e + (mant > 0.875).to(torch.int32)  # amax > 1.75 * 2^e = max_elem * 2^(e - emax)
    byte = (e - fmt.emax + E8M0_BIAS).clamp(0, 254)
    byte = torch.where(amax == 0, torch.zeros_like(byte), byte)
    byte = torch.where(torch.isfinite(amax), byte, torch.full_like(byte, E8M0_NAN))
    return byte.to(torch.uint8)


def to_mx_reference(
    x: torch.Tensor,
    *,
    elem_dtype: torch.dtype = torch.float8_e4m3fn,
    block_size: int = 32,
    dim: int = -1,
    scale_mode: ScaleMode = "floor",
) -> MXTensor:
    """Plain-PyTorch MX cast: the specification. Pads `dim` with zeros to whole blocks.

    Args:
        x: [..., n, ...] fp32 / bf16 / fp16.
    Returns:
        MXTensor with data x.shape (elem_dtype) and scale x.shape with n -> ceil(n / block).
    """
    fmt = elem_format(elem_dtype)
    d = dim % x.dim()
    n = x.shape[d]
    xb = _blocked(x.float(), d, block_size)  # [..., nb, block]
    amax = xb.abs().amax(-1)  # NaN propagates
    byte = scale_bytes_reference(amax, fmt, scale_mode)
    # x / 2^k is exact in fp32 (k in [-127, 127]; a result below fp32's normal range is far
    # below half the smallest FP8 subnormal, so its rounding cannot change the FP8 result).
    v = xb / scale_to_float(byte).nan_to_num(1.0).unsqueeze(-1)
    # Clamping before the RNE cast equals RNE then saturate: values in (max, next) round to max.
    q = v.clamp(-fmt.max_normal, fmt.max_normal).to(elem_dtype).view(torch.uint8)
    q = torch.where((byte == E8M0_NAN).unsqueeze(-1), torch.full_like(q, FP8_NAN_CODE), q)
    q = q.reshape(*q.shape[:-2], q.shape[-2] * q.shape[-1])[..., :n].movedim(-1, d).contiguous()
    return MXTensor(
        data=q.view(elem_dtype),
        scale=byte.movedim(-1, d).contiguous(),
        dim=d,
        block_size=block_size,
        elem_dtype=elem_dtype,
    )


def dequantize_reference(t: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """X * P_i for every element in `dtype`, saturated to +-finfo(dtype).max.

    Exact in fp32 except where X * P_i is beyond fp32's range: "rceil" can round a block
    whose amax is within 1/16 of fp32's max up to 2^128 (e.g. amax 3.3e38: X = 2^120, the
    element 255 rounds to 256), a valid MX value that fp32 cannot hold. Like the spec's
    saturating element conversion, such a finite MX value decodes to +-max, never to Inf
    (also when `dtype`'s range is smaller, e.g. fp16). NaN-scale blocks decode to NaN; an
    E5M2 Inf element (never written by `to_mx`) stays Inf.
    """
    s = scale_to_float(t.scale).movedim(t.dim, -1)
    n = t.data.shape[t.dim]
    s = s.repeat_interleave(t.block_size, dim=-1)[..., :n].movedim(-1, t.dim)
    p = t.data.float()
    out = (p * s).to(dtype)
    big = torch.finfo(dtype).max
    sat = out.nan_to_num_(nan=float("nan"), posinf=big, neginf=-big)
    if t.elem_dtype == torch.float8_e5m2:
        sat = torch.where(p.isinf(), p.to(dtype), sat)
    return sat
