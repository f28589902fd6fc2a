# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"
"""Triton MX quantization: one read of a 2-D tile, row-blocked and/or column-blocked output.

Rounding is done with integer bit operations on the fp32 pattern (no fp8 conversion
instruction, no fp32 multiply), so the result is bit-exact with `to_mx_reference` on GPU and
under TRITON_INTERPRET=1 alike, subnormals and flush-to-zero settings included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gem_precision._formats import E8M0_NAN, FP8_NAN_CODE, ElemFormat, MXTensor


@triton.jit
def _scale_byte(amax_bits, EMAX: tl.constexpr, RCEIL: tl.constexpr):
    # amax_bits: the fp32 pattern of max|x| (an int max of |x|'s bits also propagates NaN/Inf).
    e = amax_bits >> 23
    byte = e - EMAX  # floor(log2 amax) - emax + 127
    if RCEIL:
        byte += ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32)  # mantissa > 1.75
    byte = tl.minimum(tl.maximum(byte, 0), 254)  # zero / subnormal amax -> 0
    return tl.where(e == 255, 255, byte)


@triton.jit
def _encode(bits, byte, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr):
    # x = (-1)^sign * S * 2^t; v = x / 2^(byte-127) = S * 2^d; round v to the FP8 grid (RNE).
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF
    ex = a >> 23
    sig = tl.where(ex > 0, (a & 0x7FFFFF) | 0x800000, a)
    d = tl.maximum(ex, 1) - 150 - (byte - 127)
    # floor(log2 sig) through an exact int -> fp32 conversion (sig < 2^24).
    psig = (sig.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    pe = tl.maximum(d + psig, EMIN)  # binade of v, clamped to the subnormal binade
    sh = pe - MBITS - d  # bits to drop so the LSB becomes the quantum 2^(pe - MBITS)
    shr = tl.minimum(tl.maximum(sh, 0), 30)
    shl = tl.minimum(tl.maximum(-sh, 0), 30)
    q = sig >> shr
    rem = sig & ((1 << shr) - 1)
    half = (1 << shr) >> 1
    up = (rem > half) | ((rem == half) & (shr > 0) & ((q & 1) == 1))
    n = tl.where(sh > 0, q + up.to(tl.int32), sig << shl)
    code = tl.minimum(((pe - EMIN) << MBITS) + n, MAX_CODE)  # carries and saturation for free
    code = code | (sign << 7)
    return tl.where(byte == 255, 0x7F, code)


@triton.jit
def _mx_quant_kernel(
    x_ptr, R, C, sxr, sxc,
    qr_ptr, sqr_r, sqr_c, sr_ptr, ssr_r, ssr_c,
    qc_ptr, sqc_r, sqc_c, sc_ptr, ssc_r, ssc_c,
    BR: tl.constexpr, BC: tl.constexpr, BLOCK: tl.constexpr,
    DO_ROW: tl.constexpr, DO_COL: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    RCEIL: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxc, mask=mask, other=0.0)
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    if DO_ROW:  # blocks of BLOCK along the columns
        b3 = tl.reshape(bits, (BR, BC // BLOCK, BLOCK))
        byte = _scale_byte(tl.max(b3 & 0x7FFFFFFF, axis=2), EMAX, RCEIL)
        code = tl.reshape(_encode(b3, byte[:, :, None], MBITS, EMIN, MAX_CODE), (BR, BC))
        tl.store(qr_ptr + rows[:, None] * sqr_r + cols[None, :] * sqr_c, code.to(tl.uint8), mask=mask)
        bcol = pid_c * (BC // BLOCK) + tl.arange(0, BC // BLOCK)
        smask = (rows[:, None] < R) & (bcol[None, :] < tl.cdiv(C, BLOCK))
        tl.store(sr_ptr + rows[:, None] * ssr_r + bcol[None, :] * ssr_c, byte.to(tl.uint8), mask=smask)
    if DO_COL:  # blocks of BLOCK along the rows
        b3 = tl.reshape(bits, (BR // BLOCK, BLOCK, BC))
        byte = _scale_byte(tl.max(b3 & 0x7FFFFFFF, axis=1), EMAX, RCEIL)
        code = tl.reshape(_encode(b3, byte[:, None, :], MBITS, EMIN, MAX_CODE), (BR, BC))
        tl.store(qc_ptr + rows[:, None] * sqc_r + cols[None, :] * sqc_c, code.to(tl.uint8), mask=mask)
        brow = pid_r * (BR // BLOCK) + tl.arange(0, BR // BLOCK)
        smask = (brow[:, None] < tl.cdiv(R, BLOCK)) & (cols[None, :] < C)
        tl.store(sc_ptr + brow[:, None] * ssc_r + cols[None, :] * ssc_c, byte.to(tl.uint8), mask=smask)


def quantize_2d(
    x: torch.Tensor,
    fmt: ElemFormat,
    *,
    block_size: int,
    rceil: bool,
    row: bool,
    col: str | None,
) -> tuple[MXTensor | None, MXTensor | None]:
    """Quantize a 2-D [R, C] tensor with one read.

    Args:
        x: [R, C], any strides, fp32/bf16/fp16.
        row: produce x blocked along C: data [R, C], scale [R, ceil(C/b)].
        col: None; "same" for x blocked along R with data [R, C], scale [ceil(R/b), C];
            or "t" for x.T blocked along its last dim, written contiguously: data [C, R],
            scale [C, ceil(R/b)] (the K-major operand layout the GEMM wants).
    Returns:
        (row MXTensor or None, col MXTensor or None).
    """
    R, C = x.shape
    dev = x.device
    u8 = torch.uint8
    qr = sr = qc = sc = None
    dummy = torch.empty(1, dtype=u8, device=dev)
    if row:
        qr = torch.empty((R, C), dtype=u8, device=dev)
        sr = torch.empty((R, triton.cdiv(C, block_size)), dtype=u8, device=dev)
    if col == "same":
        qc = torch.empty((R, C), dtype=u8, device=dev)
        sc = torch.empty((triton.cdiv(R, block_size), C), dtype=u8, device=dev)
        qc_strides = (qc.stride(0), qc.stride(1))
        sc_strides = (sc.stride(0), sc.stride(1))
    elif col == "t":
        qc = torch.empty((C, R), dtype=u8, device=dev)
        sc = torch.empty((C, triton.cdiv(R, block_size)), dtype=u8, device=dev)
        qc_strides = (qc.stride(1), qc.stride(0))
        sc_strides = (sc.stride(1), sc.stride(0))
    elif col is not None:
        raise ValueError(f"{col=} must be None, 'same' or 't'")
    else:
        qc_strides = sc_strides = (0, 0)
    if R == 0 or C == 0:
        pass
    else:
        if row and col:
            br, bc, warps = 64, 128, 8
        elif row:
            br, bc, warps = 16, 512, 8
        else:
            br, bc, warps = 64, 128, 4
        br = max(br, block_size) if col else br
        bc = max(bc, block_size) if row else bc
        grid = (triton.cdiv(R, br), triton.cdiv(C, bc))
        _mx_quant_kernel[grid](
            x, R, C, x.stride(0), x.stride(1),
            qr if qr is not None else dummy,
            *(qr.stride() if qr is not None else (0, 0)),
            sr if sr is not None else dummy,
            *(sr.stride() if sr is not None else (0, 0)),
            qc if qc is not None else dummy, *qc_strides,
            sc if sc is not None else dummy, *sc_strides,
            BR=br, BC=bc, BLOCK=block_size, DO_ROW=row, DO_COL=col is not None,
            MBITS=fmt.mbits, EMIN=fmt.emin, EMAX=fmt.emax, MAX_CODE=fmt.max_code,
            RCEIL=rceil, num_warps=warps,
        )
    assert E8M0_NAN == 255 and FP8_NAN_CODE == 0x7F  # constants baked into the kernel
    out_r = out_c = None
    if qr is not None and sr is not None:
        out_r = MXTensor(data=qr.view(fmt.dtype), scale=sr, dim=1, block_size=block_size, elem_dtype=fmt.dtype)
    if qc is not None and sc is not None:
        dim = 0 if col == "same" else 1
        out_c = MXTensor(data=qc.view(fmt.dtype), scale=sc, dim=dim, block_size=block_size, elem_dtype=fmt.dtype)
    return out_r, out_c
