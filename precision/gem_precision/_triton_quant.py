# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"
"""Triton MX quantization: one read of a 2-D tile, row-blocked and/or column-blocked output.

Two element paths, both bit-exact with `to_mx_reference`:
* integer (INT_CVT): RNE and saturation with integer bit operations on the fp32 pattern; no
  fp8 conversion instruction and no fp32 multiply, so it is exact anywhere, including Triton's
  CPU interpreter (whose fp8 casts neither round to even nor saturate). ~40 integer ops per
  element, which makes it compute-bound on the GPU.
* hardware: x * 2^-k (exact: a power-of-two multiply) clamped to +-max, then the GPU's
  round-to-nearest-even fp8 conversion. Used on CUDA after a one-time probe (`hw_cvt_ok`)
  confirms it matches the reference on ties, subnormals and saturation; otherwise the integer
  path is used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.testing

from gem_precision._formats import E8M0_NAN, FP8_NAN_CODE, ElemFormat, MXTensor, ScaleMode
from gem_precision._quant import interpreting


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
def _encode_hw(xf, byte, E5M2: tl.constexpr, MAXV: tl.constexpr):
    # 2^(127 - byte): exponent field 254 - byte; byte 254 gives the subnormal 2^-127.
    fld = 254 - byte
    inv = tl.where(fld > 0, (tl.maximum(fld, 1) << 23).to(tl.float32, bitcast=True), 5.877471754111438e-39)
    v = tl.minimum(tl.maximum(xf * inv, -MAXV), MAXV)
    if E5M2:
        code = v.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.int32)
    else:
        code = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    return tl.where(byte == 255, 0x7F, code)


@triton.jit
def _mx_quant_kernel(
    x_ptr, R, C, sxr, sxc,
    qr_ptr, sqr_r, sqr_c, sr_ptr, ssr_r, ssr_c,
    qc_ptr, sqc_r, sqc_c, sc_ptr, ssc_r, ssc_c,
    BR: tl.constexpr, BC: tl.constexpr, BLOCK: tl.constexpr,
    DO_ROW: tl.constexpr, DO_COL: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    RCEIL: tl.constexpr, INT_CVT: tl.constexpr, E5M2: tl.constexpr, MAXV: tl.constexpr,
    EVEN: tl.constexpr = False,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    if EVEN:  # the tile divides the shape: no masks
        mask = None
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxc).to(tl.float32)
    else:
        mask = (rows[:, None] < R) & (cols[None, :] < C)
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxc, mask=mask, other=0.0).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    if DO_ROW:  # blocks of BLOCK along the columns
        b3 = tl.reshape(bits, (BR, BC // BLOCK, BLOCK))
        byte = _scale_byte(tl.max(b3 & 0x7FFFFFFF, axis=2), EMAX, RCEIL)
        if INT_CVT:
            code = tl.reshape(_encode(b3, byte[:, :, None], MBITS, EMIN, MAX_CODE), (BR, BC))
        else:
            x3 = tl.reshape(x, (BR, BC // BLOCK, BLOCK))
            code = tl.reshape(_encode_hw(x3, byte[:, :, None], E5M2, MAXV), (BR, BC))
        tl.store(qr_ptr + rows[:, None] * sqr_r + cols[None, :] * sqr_c, code.to(tl.uint8), mask=mask)
        bcol = pid_c * (BC // BLOCK) + tl.arange(0, BC // BLOCK)
        smask = None if EVEN else (rows[:, None] < R) & (bcol[None, :] < tl.cdiv(C, BLOCK))
        tl.store(sr_ptr + rows[:, None] * ssr_r + bcol[None, :] * ssr_c, byte.to(tl.uint8), mask=smask)
    if DO_COL:  # blocks of BLOCK along the rows
        b3 = tl.reshape(bits, (BR // BLOCK, BLOCK, BC))
        byte = _scale_byte(tl.max(b3 & 0x7FFFFFFF, axis=1), EMAX, RCEIL)
        if INT_CVT:
            code = tl.reshape(_encode(b3, byte[:, None, :], MBITS, EMIN, MAX_CODE), (BR, BC))
        else:
            x3 = tl.reshape(x, (BR // BLOCK, BLOCK, BC))
            code = tl.reshape(_encode_hw(x3, byte[:, None, :], E5M2, MAXV), (BR, BC))
        tl.store(qc_ptr + rows[:, None] * sqc_r + cols[None, :] * sqc_c, code.to(tl.uint8), mask=mask)
        brow = pid_r * (BR // BLOCK) + tl.arange(0, BR // BLOCK)
        smask = None if EVEN else (brow[:, None] < tl.cdiv(R, BLOCK)) & (cols[None, :] < C)
        tl.store(sc_ptr + brow[:, None] * ssc_r + cols[None, :] * ssc_c, byte.to(tl.uint8), mask=smask)


@triton.jit
def _abs_bits(x_ptr, offs, mask, EVEN: tl.constexpr):
    # Loads x, returns (x as fp32, the int pattern of |x| for a NaN-propagating int max).
    if EVEN:
        xf = tl.load(x_ptr + offs).to(tl.float32)
    else:
        xf = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return xf, xf.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _mx_quant_col_loop_kernel(
    x_ptr, R, C, sxr, sxc, q_ptr, sq_r, sq_c, s_ptr, ss_r, ss_c,
    BC: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    RCEIL: tl.constexpr, INT_CVT: tl.constexpr, E5M2: tl.constexpr, MAXV: tl.constexpr,
):
    # Blocks along dim 0, output in x's layout ("col same"), without any cross-thread work:
    # the program walks NB blocks of BLOCK rows over BC columns one row vector at a time. Pass
    # 1 keeps a running max per column (BLOCK independent row loads in flight), pass 2
    # reloads the same rows (L1/L2 hits: DRAM traffic is still one read), encodes and stores.
    # Every tensor is 1-D [BC], so there is no reduction layout, shared memory or barrier.
    pid_r = tl.program_id(0)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cols < C
    for nb in tl.static_range(NB):
        blk = pid_r * NB + nb
        amax = tl.zeros([BC], dtype=tl.int32)
        for i in tl.static_range(BLOCK):
            r = blk * BLOCK + i
            _, ab = _abs_bits(x_ptr, r * sxr + cols * sxc, cmask & (r < R), EVEN)
            amax = tl.maximum(amax, ab)
        byte = _scale_byte(amax, EMAX, RCEIL)
        for i in tl.static_range(BLOCK):
            r = blk * BLOCK + i
            xf, ab = _abs_bits(x_ptr, r * sxr + cols * sxc, cmask & (r < R), EVEN)
            if INT_CVT:
                code = _encode(xf.to(tl.int32, bitcast=True), byte, MBITS, EMIN, MAX_CODE)
            else:
                code = _encode_hw(xf, byte, E5M2, MAXV)
            if EVEN:
                tl.store(q_ptr + r * sq_r + cols * sq_c, code.to(tl.uint8))
            else:
                tl.store(q_ptr + r * sq_r + cols * sq_c, code.to(tl.uint8), mask=cmask & (r < R))
        if EVEN:
            tl.store(s_ptr + blk * ss_r + cols * ss_c, byte.to(tl.uint8))
        else:
            tl.store(s_ptr + blk * ss_r + cols * ss_c, byte.to(tl.uint8), mask=cmask & (blk < tl.cdiv(R, BLOCK)))


# A candidate launch: (variant, a, b, num_warps).
#   "v1"   _mx_quant_kernel, tile (a, b) = (BR, BC) with masks
#   "v1e"  the same kernel without masks when (BR, BC) divides the shape (else it is v1)
#   "loop" _mx_quant_col_loop_kernel, (a, b) = (NB blocks of 32 rows per program, BC columns)
# On CUDA the first call per size class (>= 4M elements) times every candidate of its kind and
# keeps the fastest (TILE_LOG records the times); the first entry is the default otherwise.
# Order and membership from the 2026-11-29 H200 runs (BENCHMARKS.md), fastest first: dim -1
# v1e 8x1024 (85.6 % of copy bandwidth), dim 0 loop 1x512 (60 %), dual v1 32x128 (44 %). A
# 3-D in-thread variant measured 9-13 % and was removed; few candidates keep the first-call
# compile short (the trainer's time to first step with --precision mxfp8_*).
_Tile = tuple[str, int, int, int]
VARIANTS = ("v1", "v1e", "loop")
_TILES: dict[str, list[_Tile]] = {
    "row": [("v1e", 8, 1024, 8), ("v1e", 16, 512, 8), ("v1", 32, 256, 8)],
    "col": [("loop", 1, 512, 4), ("loop", 1, 1024, 8), ("v1", 32, 256, 4)],
    "both": [("v1", 32, 128, 4), ("v1e", 32, 128, 4), ("v1", 32, 64, 4)],
}
# Restrict the candidates to one variant ("v1", "v1e", "loop"; None = all): the bench
# sets it to show the variants side by side; a kind without that variant keeps its list.
FORCE_VARIANT: dict[str, str | None] = {"variant": None}
TUNE: dict[str, bool] = {"enabled": True}  # False: always the first candidate (no timing)
_tile_cache: dict[tuple[object, ...], _Tile] = {}
TILE_LOG: dict[tuple[object, ...], list[tuple[_Tile, float]]] = {}
_hw_state: dict[str, bool] = {}


def hw_cvt_ok(device: torch.device) -> bool:
    """One-time probe: does the hardware fp8 path equal the reference bit for bit here?"""
    key = str(device)
    if key not in _hw_state:
        from gem_precision._formats import E4M3, E5M2, to_mx_reference

        _hw_state[key] = True  # the probe itself runs the hardware path
        vals = [1.0625, 1.1875, 1.07, 2.0**-10, 3 * 2.0**-10, 2.0**-9, -(2.0**-11), 449.0, 480.0, 511.0,
                -500.0, 2.0**-130, 2.0**-126, 2.0**-133, 2.0**-119, 1.75, 57344.0, 61440.0, 0.0, -0.0]
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-30, 30, (64, 64), generator=g).float())
        x[:, : len(vals)] = torch.tensor(vals)
        x[5, 40] = float("nan")
        x[9, 41] = float("inf")
        x[11, :] = 2.0**-128
        ok = True
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            for fmt in (E4M3, E5M2):
                for rceil in (False, True):
                    r, c = quantize_2d(xd.to(device), fmt, block_size=32, rceil=rceil, row=True, col="t", int_cvt=False)
                    mode: ScaleMode = "rceil" if rceil else "floor"
                    ref_r = to_mx_reference(xd, elem_dtype=fmt.dtype, scale_mode=mode)
                    ref_c = to_mx_reference(xd.t(), elem_dtype=fmt.dtype, scale_mode=mode)
                    assert r is not None and c is not None
                    for got, ref in ((r, ref_r), (c, ref_c)):
                        ok &= torch.equal(got.data.view(torch.uint8).cpu(), ref.data.view(torch.uint8))
                        ok &= torch.equal(got.scale.cpu(), ref.scale)
        _hw_state[key] = bool(ok)
        if not ok:
            import warnings

            warnings.warn("gem_precision: hardware fp8 conversion differs from the reference here; using the integer path")
    return _hw_state[key]


def _usable(tile: _Tile, kind: str, col: str | None, block_size: int, gpu_int_cvt: bool) -> bool:
    variant, a, b, _ = tile
    if variant in ("v1", "v1e"):
        return True
    if block_size != 32:  # the new kernels hold a whole block per thread: 32 rows only
        return False
    if gpu_int_cvt:  # integer path compiled for a GPU: the unrolled new kernels take 30 s+ to build
        return False
    return variant == "loop" and kind == "col" and col == "same"


def size_class(n: int) -> int:
    """n rounded up to a power of two: the tile choice depends on the size class, not on n."""
    return 1 << max(n - 1, 0).bit_length()


def _tile_key(kind: str, R: int, C: int, x: torch.Tensor, int_cvt: bool, force: str | None) -> tuple[object, ...]:
    """Cache key of the tuned tile. Sizes are bucketed to powers of two so that a stream of
    jagged batches (a new token count every step) tunes once per size class, not every call."""
    return (kind, size_class(R), size_class(C), x.dtype, x.stride(1) == 1, int_cvt, str(x.device), force)


def quantize_2d(
    x: torch.Tensor,
    fmt: ElemFormat,
    *,
    block_size: int,
    rceil: bool,
    row: bool,
    col: str | None,
    int_cvt: bool | None = None,
    variant: str | None = None,
) -> tuple[MXTensor | None, MXTensor | None]:
    """Quantize a 2-D [R, C] tensor with one read.

    Args:
        x: [R, C], any strides, fp32/bf16/fp16.
        row: produce x blocked along C: data [R, C], scale [R, ceil(C/b)].
        col: None; "same" for x blocked along R with data [R, C], scale [ceil(R/b), C];
            or "t" for x.T blocked along its last dim, written contiguously: data [C, R],
            scale [C, ceil(R/b)] (the K-major operand layout the GEMM wants).
        int_cvt: force the integer (True) or hardware (False) element path; None = probe.
        variant: only this kernel variant (see _TILES; None = FORCE_VARIANT, else all).
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
    if int_cvt is None:
        int_cvt = not (x.is_cuda and hw_cvt_ok(x.device))

    consts = dict(MBITS=fmt.mbits, EMIN=fmt.emin, EMAX=fmt.emax, MAX_CODE=fmt.max_code, RCEIL=rceil,
                  INT_CVT=int_cvt, E5M2=fmt.dtype == torch.float8_e5m2, MAXV=fmt.max_normal)

    def launch(tile: _Tile) -> None:
        kv, a, b, warps = tile
        if kv == "loop":  # col == "same" only
            assert qc is not None and sc is not None
            even = R % (a * block_size) == 0 and C % b == 0
            _mx_quant_col_loop_kernel[(triton.cdiv(R, a * block_size), triton.cdiv(C, b))](
                x, R, C, x.stride(0), x.stride(1), qc, qc.stride(0), qc.stride(1), sc, sc.stride(0), sc.stride(1),
                BC=b, NB=a, BLOCK=block_size, EVEN=even, num_warps=warps, **consts)
            return
        br = max(a, block_size) if col else a
        bc = max(b, block_size) if row else b
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
            EVEN=kv == "v1e" and R % br == 0 and C % bc == 0, num_warps=warps, **consts,
        )

    if R > 0 and C > 0:
        kind = "both" if (row and col) else ("row" if row else "col")
        force = variant if variant is not None else FORCE_VARIANT["variant"]
        gpu_int = int_cvt and not interpreting()
        cands = [t for t in _TILES[kind] if _usable(t, kind, col, block_size, gpu_int)]
        if force is not None:
            cands = [t for t in cands if t[0] == force] or cands
        key = _tile_key(kind, R, C, x, int_cvt, force)
        if key not in _tile_cache:
            _tile_cache[key] = cands[0]
            if TUNE["enabled"] and x.is_cuda and R * C >= 2**22 and len(cands) > 1:
                best: tuple[float, _Tile] | None = None
                for tile in cands:
                    try:
                        ms = triton.testing.do_bench(lambda: launch(tile), warmup=5, rep=20)
                    except Exception:  # noqa: BLE001 - a candidate that does not build here (regs/smem) is skipped
                        ms = float("inf")
                    TILE_LOG.setdefault(key, []).append((tile, ms))
                    if best is None or ms < best[0]:
                        best = (ms, tile)
                assert best is not None
                _tile_cache[key] = best[1]
        launch(_tile_cache[key])
    assert E8M0_NAN == 255 and FP8_NAN_CODE == 0x7F  # constants baked into the kernel
    out_r = out_c = None
    if qr is not None and sr is not None:
        out_r = MXTensor(data=qr.view(fmt.dtype), scale=sr, dim=1, block_size=block_size, elem_dtype=fmt.dtype)
    if qc is not None and sc is not None:
        dim = 0 if col == "same" else 1
        out_c = MXTensor(data=qc.view(fmt.dtype), scale=sc, dim=dim, block_size=block_size, elem_dtype=fmt.dtype)
    return out_r, out_c
