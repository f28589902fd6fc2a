# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"
"""fp8_block's activation / gradient quantization in one Triton pass (quant="triton"; also
quant="auto", the default, on CUDA).

Why: on the H200 the blockwise FP8 GEMMs are ~1.5x bf16, but a linear's fwd+bwd ran at ~0.5x
because the torch quantizers (`_fp8_block.quantize_rows` / `quantize_cols`, compiled) read x
twice and dY twice per step and write the transposed codes through a separate layout copy.
This kernel reads a [BM, BK] tile of t [M, K] once and writes, as asked:

    rows   codes [M, K] E4M3, scale [M, K/128] fp32        (1x128 along K: `quantize_rows`)
    cols   codes of t^T [K, M] E4M3, scale [M/128, K] fp32 (1x128 along M: `quantize_cols`;
           scale.t() is t^T's [K, M/128] scale with the strides (1, K) cuBLAS wants)

Bit-exact with those torch functions (the specification), which it mirrors rule by rule:
* scale = 2^e, e = clamp(E - 8 + [mantissa(amax) > 0.75], -126, 126) from amax's fp32 bits
  (`_pow2_scale`); the amax is an integer max of |x|'s bits, so NaN/Inf dominate as in
  torch's NaN-propagating amax, and a block holding NaN/Inf gets a NaN scale.
* codes = round-to-nearest-even E4M3 of x * 2^-e (exact: a power-of-two multiply; within
  +-448 for a finite block, so never saturated); a NaN element gives 0x7F | sign on CPU and
  0x7F on CUDA, as torch does there (the GPU's multiply drops a NaN's sign: a -NaN input
  made the first real-size H200 test differ in one code), an Inf element torch's own code for Inf
  (`_inf_code`: 0x7E, saturated, in torch >= 2.13; 0x7F, NaN, before) | sign.
* the finite elements of a block holding NaN/Inf: the torch path leaves these undefined (it
  scales them by 2^-e of whatever NaN its amax returns: torch's CPU amax gives 0x7FC00000 or
  0xFFFFFFFF depending on the reduction's vectorization, i.e. 2^-120 or 2^126, codes ~0 or
  saturated). Here: 2^-120 (the canonical NaN's and Inf's e). No GEMM output depends on them
  (the block's scale is NaN), and the tests compare every other code.
A tile without NaN/Inf (one max over its blocks' amax decides) skips the per-element NaN/Inf
codes: the same codes, fewer instructions per element (51-65 % of a copy's bandwidth on the
H200, 37-45 % before). Two element paths: integer bit arithmetic (`_triton_quant._encode`: exact anywhere, used
under TRITON_INTERPRET=1, whose fp8 casts neither round to even nor saturate) and the GPU's
fp8 conversion (used on CUDA once `_triton_quant.hw_cvt_ok` has matched the MX reference on
ties, subnormals and saturation with the same instruction).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from gem_precision._quant import interpreting
from gem_precision._triton_quant import _encode, hw_cvt_ok

BLOCK = 128
E4M3 = torch.float8_e4m3fn
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantTile:
    """One program's tile. bm, bk: multiples of 128 (the column / row blocks); a tile that
    does not divide [M, K] is halved down to 128 (M and K are multiples of 128), and k_loop
    is halved until its tiles divide K."""

    bm: int = 128
    bk: int = 128
    num_warps: int = 8
    # k_loop > 1: a program walks k_loop tiles along K in a software-pipelined loop (the next
    # tile's load in flight while this one is encoded: num_stages buffers); 1: one tile.
    k_loop: int = 1
    num_stages: int = 1


TILE = QuantTile(num_warps=4)
# What the bench sweeps on the GPU (the first is the default). On the H200 (2026-12-04, with the
# short path for tiles without NaN/Inf) 128x128 with 4 warps moved 2,690 GB/s at 262,144 x 1024
# and 2,169 at x 4096 (65 % / 51 % of a copy), 128x256 w8 2,207 / 2,170, 128x128 w8 1,895 /
# 1,838; the pipelined K loops (QuantTile.k_loop) were slower at every size (~970), so the
# sweep keeps only the best of them.
TILES = (TILE, QuantTile(bk=256, num_warps=8), QuantTile(num_warps=8), QuantTile(bm=256, num_warps=8),
         QuantTile(num_warps=8, k_loop=8, num_stages=3))


@triton.jit(do_not_specialize=["M_IN"])  # the token count: no JIT variant per divisibility class
def _fp8_block_quant_kernel(
    x_ptr, sxm, sxk, M,  # M: the padded row count (a multiple of 128: the outputs' rows)
    qr_ptr, sr_ptr,  # rows: codes [M, K], scale [M, K/128] (both contiguous)
    qc_ptr, sc_ptr,  # cols: codes of t^T [K, M], scale [M/128, K] (both contiguous)
    K, M_IN,  # M_IN: t's rows; rows M_IN..M-1 read as zeros (MASK_M)
    BM: tl.constexpr, BK: tl.constexpr, BLOCK: tl.constexpr,
    ROWS: tl.constexpr,  # write the 1x128-along-K codes + scales (t's own layout)
    COLS: tl.constexpr,  # write t^T's codes + the 128-along-M scales
    INT_CVT: tl.constexpr,  # integer encode (interpreter) vs the GPU's fp8 conversion
    INF_CODE: tl.constexpr,  # torch's E4M3 code for +Inf (0x7E or 0x7F, by torch version)
    NAN_SIGN: tl.constexpr,  # a NaN element keeps its sign (torch on CPU) or not (on CUDA)
    MASK_M: tl.constexpr,  # M_IN < M: the padding rows are masked loads, not a padded copy
    KT: tl.constexpr,  # tiles along K per program (QuantTile.k_loop)
    STAGES: tl.constexpr,  # the K loop's pipeline depth (QuantTile.num_stages)
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    for kt in tl.range(0, KT, num_stages=STAGES):
        _quant_tile(x_ptr, sxm, sxk, M, qr_ptr, sr_ptr, qc_ptr, sc_ptr, K, M_IN, rows, pid_m, pid_k * KT + kt,
                    BM, BK, BLOCK, ROWS, COLS, INT_CVT, INF_CODE, NAN_SIGN, MASK_M)


@triton.jit
def _quant_tile(x_ptr, sxm, sxk, M, qr_ptr, sr_ptr, qc_ptr, sc_ptr, K, M_IN, rows, pid_m, pid_k,
                BM: tl.constexpr, BK: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                INT_CVT: tl.constexpr, INF_CODE: tl.constexpr, NAN_SIGN: tl.constexpr, MASK_M: tl.constexpr):
    cols = pid_k * BK + tl.arange(0, BK)
    # The tile divides [M, K] (the wrapper's rule); only t's missing rows need a mask.
    ptrs = x_ptr + rows[:, None].to(tl.int64) * sxm + cols[None, :] * sxk
    if MASK_M:
        xf = tl.load(ptrs, mask=rows[:, None] < M_IN, other=0.0).to(tl.float32)
    else:
        xf = tl.load(ptrs).to(tl.float32)
    bits = xf.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    # The blocks' amax (integer max of |x|'s bits: NaN/Inf dominate), and the tile's.
    amax_r = tl.max(tl.reshape(a, (BM, BK // BLOCK, BLOCK)), axis=2)  # [BM, BK/128]
    amax_c = tl.max(tl.reshape(a, (BM // BLOCK, BLOCK, BK)), axis=1)  # [BM/128, BK]
    if ROWS:
        top = tl.max(tl.max(amax_r, axis=1), axis=0)
    else:
        top = tl.max(tl.max(amax_c, axis=1), axis=0)
    # A tile without NaN/Inf (nearly all) skips the per-element NaN/Inf codes: on the H200 that
    # took 128x128 w8 from 1,563 to 1,838 GB/s at 262,144 x 4096 (w4: 2,169, now the default).
    if top < 0x7F800000:
        _emit(bits, xf, a, amax_r, amax_c, rows, cols, pid_m, pid_k, M, K, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
              BM, BK, BLOCK, ROWS, COLS, INT_CVT, INF_CODE, NAN_SIGN, False)
    else:
        _emit(bits, xf, a, amax_r, amax_c, rows, cols, pid_m, pid_k, M, K, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
              BM, BK, BLOCK, ROWS, COLS, INT_CVT, INF_CODE, NAN_SIGN, True)


@triton.jit
def _emit(bits, xf, a, amax_r, amax_c, rows, cols, pid_m, pid_k, M, K, qr_ptr, sr_ptr, qc_ptr, sc_ptr,
          BM: tl.constexpr, BK: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
          INT_CVT: tl.constexpr, INF_CODE: tl.constexpr, NAN_SIGN: tl.constexpr, SPECIAL: tl.constexpr):
    # SPECIAL: the tile holds NaN/Inf, whose elements get torch's codes for them.
    if SPECIAL:
        sign = (bits >> 31) & 1
        if NAN_SIGN:
            special = tl.where(a > 0x7F800000, 0x7F, INF_CODE) | (sign << 7)  # NaN / Inf elements
        else:  # a NaN's sign dropped, as torch's multiply on this device does
            special = tl.where(a > 0x7F800000, 0x7F, INF_CODE | (sign << 7))
        special = special.to(tl.uint8)
        nonfinite = a >= 0x7F800000
    if ROWS:
        e = _exponent(amax_r)
        code = _codes(tl.reshape(bits, (BM, BK // BLOCK, BLOCK)), tl.reshape(xf, (BM, BK // BLOCK, BLOCK)),
                      e[:, :, None], INT_CVT)
        code = tl.reshape(code, (BM, BK))
        if SPECIAL:
            code = tl.where(nonfinite, special, code)
        tl.store(qr_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], code)
        kb = pid_k * (BK // BLOCK) + tl.arange(0, BK // BLOCK)
        tl.store(sr_ptr + rows[:, None].to(tl.int64) * (K // BLOCK) + kb[None, :], _scale(amax_r, e))
    if COLS:
        e = _exponent(amax_c)
        code = _codes(tl.reshape(bits, (BM // BLOCK, BLOCK, BK)), tl.reshape(xf, (BM // BLOCK, BLOCK, BK)),
                      e[:, None, :], INT_CVT)
        code = tl.reshape(code, (BM, BK))
        if SPECIAL:
            code = tl.where(nonfinite, special, code)
        # t^T [K, M]: the tile transposed, so the store runs along M (contiguous there)
        tl.store(qc_ptr + cols[:, None].to(tl.int64) * M + rows[None, :], tl.trans(code))
        mb = pid_m * (BM // BLOCK) + tl.arange(0, BM // BLOCK)
        tl.store(sc_ptr + mb[:, None].to(tl.int64) * K + cols[None, :], _scale(amax_c, e))


@triton.jit
def _exponent(amax_bits):
    # `_pow2_scale`'s e = E - 8 (+1 when 1.m > 1.75), clamped to [-126, 126]; a non-finite
    # amax -> 120, what Inf and the canonical NaN 0x7FC00000 give (module docstring).
    big = ((amax_bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum((amax_bits >> 23) - (127 + 8) + big, -126), 126)
    return tl.where(amax_bits >= 0x7F800000, 120, e)


@triton.jit
def _scale(amax_bits, e):
    # 2^e in fp32, NaN for a non-finite block (a finite amax can give e = 120 too).
    s = ((e + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(amax_bits >= 0x7F800000, float("nan"), s)


@triton.jit
def _codes(bits3, x3, e3, INT_CVT: tl.constexpr):
    # E4M3 code (uint8) of x * 2^-e, round to nearest even; |x * 2^-e| <= 448 here.
    if INT_CVT:
        code = _encode(bits3, e3 + 127, 3, -6, 0x7E).to(tl.uint8)  # E4M3: 3 mantissa bits, emin -6, max 0x7E
    else:
        inv = ((127 - e3) << 23).to(tl.float32, bitcast=True)
        code = (x3 * inv).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return code


# torch's own E4M3 behaviour, probed once: "inf" (its code for +Inf), "nan_sign_<device type>".
_TORCH_CODES: dict[str, int] = {}


def _inf_code() -> int:
    """torch's E4M3 code for +Inf (0x7E: saturated, torch >= 2.13; 0x7F: NaN, before)."""
    if "inf" not in _TORCH_CODES:
        _TORCH_CODES["inf"] = int(torch.tensor(float("inf")).to(E4M3).view(torch.uint8))
    return _TORCH_CODES["inf"]


def _nan_keeps_sign(device: torch.device) -> bool:
    """Whether torch's quantizers on `device` give a -NaN element the code 0xFF (CPU) or 0x7F
    (CUDA: the GPU's fp32 multiply returns the canonical, positive NaN), probed once per
    device type the way `quantize_rows` computes codes (x * 2^-e, then the E4M3 cast)."""
    key = "nan_sign_" + device.type
    if key not in _TORCH_CODES:
        x = torch.tensor([-float("nan")], device=device) * torch.tensor([2.0], device=device)
        _TORCH_CODES[key] = int(x.to(E4M3).view(torch.uint8)[0]) >> 7
    return bool(_TORCH_CODES[key])


def padded_rows(m: int) -> int:
    """m rounded up to a multiple of 128 (the 1x128 blocks along the rows of t^T)."""
    return (m + BLOCK - 1) // BLOCK * BLOCK


def _fit(n: int, b: int) -> int:
    while n % b:
        b //= 2
    return b


Pair = tuple[torch.Tensor, torch.Tensor]


def quantize_rows_cols_triton(t: torch.Tensor, rows: bool, cols: bool, *, tile: QuantTile = TILE,
                              int_cvt: bool | None = None) -> tuple[Pair | None, Pair | None]:
    """One read of t [M, K] -> (`quantize_rows(t)` if rows, `quantize_cols(t)` if cols), bit for bit.

    When M is not a multiple of 128 the outputs have Mp = M rounded up to 128 rows, equal to
    those of t padded with zero rows (`quantize_rows(F.pad(t, (0, 0, 0, Mp - M)))`), without
    the padded copy of t: the kernel reads the missing rows as zeros.

    Args:
        t: [M, K] fp32 / bf16 / fp16, any strides; K a multiple of 128, M any.
        rows: return (codes [Mp, K] E4M3, scale [Mp, K/128] fp32): 1x128 blocks along K.
        cols: return (codes of t^T [K, Mp] E4M3 contiguous, scale [Mp/128, K] fp32): 1x128
            blocks along M, laid out as `quantize_cols` returns them.
        tile: the program tile (QuantTile; the bench sweeps TILES).
        int_cvt: True: the integer encode; False: the GPU's fp8 conversion; None: the GPU's
            on CUDA where `hw_cvt_ok`, else the integer one (always under the interpreter).
    Returns:
        (rows pair or None, cols pair or None).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"t.dtype={t.dtype} must be one of {_FLOATS}")
    if t.dim() != 2 or t.shape[1] % BLOCK:
        raise ValueError(f"t.shape={tuple(t.shape)} must be 2-D [M, K] with K a multiple of {BLOCK}")
    if not (rows or cols):
        raise ValueError(f"{rows=}, {cols=}: ask for at least one")
    if not (t.is_cuda or interpreting()):
        raise ValueError(f"quantize_rows_cols_triton needs a CUDA tensor or TRITON_INTERPRET=1 (got device {t.device})")
    if tile.bm % BLOCK or tile.bk % BLOCK:
        raise ValueError(f"{tile=}: bm and bk must be multiples of {BLOCK}")
    if tile.k_loop < 1 or tile.num_stages < 1:
        raise ValueError(f"{tile=}: k_loop and num_stages must be >= 1")
    m_in, K = t.shape
    M = padded_rows(m_in)
    dev = t.device
    u8 = torch.uint8
    qr = torch.empty((M, K) if rows else (1,), dtype=u8, device=dev)
    sr = torch.empty((M, K // BLOCK) if rows else (1,), dtype=torch.float32, device=dev)
    qc = torch.empty((K, M) if cols else (1,), dtype=u8, device=dev)
    sc = torch.empty((M // BLOCK, K) if cols else (1,), dtype=torch.float32, device=dev)
    if M and K:
        if int_cvt is None:
            int_cvt = not (t.is_cuda and torch.cuda.get_device_capability(dev) >= (8, 9) and hw_cvt_ok(dev))
        bm, bk = _fit(M, tile.bm), _fit(K, tile.bk)
        kt = _fit(K // bk, tile.k_loop)
        _fp8_block_quant_kernel[(M // bm, K // (bk * kt))](
            t, t.stride(0), t.stride(1), M, qr, sr, qc, sc, K, m_in,
            BM=bm, BK=bk, BLOCK=BLOCK, ROWS=rows, COLS=cols, INT_CVT=int_cvt, INF_CODE=_inf_code(),
            NAN_SIGN=_nan_keeps_sign(dev), MASK_M=m_in != M, KT=kt, STAGES=tile.num_stages,
            num_warps=tile.num_warps)
    return ((qr.view(E4M3), sr) if rows else None), ((qc.view(E4M3), sc) if cols else None)


def fused_quant(t: torch.Tensor, rows: bool, cols: bool) -> tuple[Pair | None, Pair | None]:
    """`quantize_rows_cols_triton` eagerly, or (under torch.compile) through the custom op
    gem_precision::fp8_block_quant, which the compiled graph keeps as one opaque node."""
    if not torch.compiler.is_compiling():  # eager: skip the op dispatch (~0.1 ms of host time)
        return quantize_rows_cols_triton(t, rows, cols)
    qr, sr, qc, sc = torch.ops.gem_precision.fp8_block_quant(t, rows, cols)
    return ((qr.view(E4M3), sr) if rows else None), ((qc.view(E4M3), sc) if cols else None)


# FP8 codes travel as uint8 (torch's op checks cannot compare fp8 tensors); an output not
# asked for is a 1-element placeholder (an op returns a fixed number of tensors).
@torch.library.custom_op("gem_precision::fp8_block_quant", mutates_args=())
def _fp8_block_quant_op(t: torch.Tensor, rows: bool, cols: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r, c = quantize_rows_cols_triton(t, rows, cols)
    u8, dev = torch.uint8, t.device
    qr, sr = r if r is not None else (torch.empty(1, dtype=u8, device=dev), torch.empty(1, device=dev))
    qc, sc = c if c is not None else (torch.empty(1, dtype=u8, device=dev), torch.empty(1, device=dev))
    return qr.view(u8), sr, qc.view(u8), sc


@_fp8_block_quant_op.register_fake
def _fp8_block_quant_fake(t: torch.Tensor, rows: bool, cols: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    M, K = padded_rows(t.shape[0]), t.shape[1]
    u8, f32 = torch.uint8, torch.float32
    return (t.new_empty((M, K) if rows else (1,), dtype=u8), t.new_empty((M, K // BLOCK) if rows else (1,), dtype=f32),
            t.new_empty((K, M) if cols else (1,), dtype=u8), t.new_empty((M // BLOCK, K) if cols else (1,), dtype=f32))
