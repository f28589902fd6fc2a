# mypy: disable-error-code="untyped-decorator,no-untyped-def,misc"
"""MXFP8 GEMM on Hopper: C[M, N] = A[M, K] . B[N, K]^T with per-32 E8M0 scales, two exact paths.

Hopper has no block-scaled MMA. Both paths give dequantize-then-fp32-matmul up to fp32
accumulation order:

- "dequant" (default, `GEMM_PATH`): one Triton pass per operand writes its bf16
  dequantization (an FP8 element times a power of two has <= 4 significant bits, so bf16 holds
  it exactly for scale bytes >= 10), then cuBLAS multiplies in bf16 with fp32 accumulation.
  Runs near the bf16 GEMM rate; costs one extra read + write of each operand.
- "fused": one Triton kernel; every 32-wide K slice is one FP8 tensor-core dot (a wgmma k32
  step) whose fp32 result is multiplied by 2^(sa_i + sb_j) (exact) and added to the fp32
  accumulator. Exact for every scale, but the rescale needs each dot's result before the next
  (two CUDA-core fp32 ops per output element per 32 K), which serialises the tensor cores:
  ~0.16x bf16 on the H200. The design exploration (`gem_precision.bench.gemm_explore`, figures
  in BENCHMARKS.md) found no Triton formulation that beats bf16 with per-32 scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gem_precision._formats import MXTensor
from gem_precision._triton_quant import size_class


@triton.jit
def _e8m0_to_f32(byte):
    b = byte.to(tl.int32)
    f = (tl.minimum(tl.maximum(b, 1), 254) << 23).to(tl.float32, bitcast=True)
    f = tl.where(b == 0, 5.877471754111438e-39, f)  # 2^-127, the E8M0 byte 0
    return tl.where(b == 255, float("nan"), f)


@triton.jit
def _dequant_bf16_kernel(d_ptr, s_ptr, o_ptr, R, C, sdr, sdc, ssr, ssc,
                         BR: tl.constexpr, BC: tl.constexpr):
    # o[R, C] (bf16, contiguous) = d[R, C] (fp8) * 2^(s[R, C/32] - 127), exact for scale bytes >= 10.
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    rb = tl.program_id(1) * (BC // 32) + tl.arange(0, BC // 32)
    m = (rr < R)[:, None] & (rc < C)[None, :]
    d = tl.load(d_ptr + rr[:, None] * sdr + rc[None, :] * sdc, mask=m, other=0.0).to(tl.float32)
    sc = tl.load(s_ptr + rr[:, None] * ssr + rb[None, :] * ssc,
                 mask=(rr < R)[:, None] & (rb < (C + 31) // 32)[None, :], other=127)
    v = tl.reshape(tl.reshape(d, (BR, BC // 32, 32)) * _e8m0_to_f32(sc)[:, :, None], (BR, BC))
    tl.store(o_ptr + rr[:, None] * C + rc[None, :], v.to(tl.bfloat16), mask=m)


def dequantize_bf16(t: MXTensor) -> torch.Tensor:
    """[R, C] MXTensor blocked along dim 1 -> bf16 [R, C] in one pass (Triton).

    Exact (equal to the fp32 dequantization rounded to bf16, which loses nothing) whenever the
    block's scale byte is >= 10 (scale >= 2^-117): an FP8 element has at most 4 significant
    bits, and bf16 has fp32's exponent range; below that a bf16 subnormal can drop low bits.
    """
    R, C = t.data.shape
    out = torch.empty((R, C), dtype=torch.bfloat16, device=t.data.device)
    if R == 0 or C == 0:
        return out
    BR, BC = (32, 64) if not t.data.is_cuda else (32, 256)
    _dequant_bf16_kernel[(triton.cdiv(R, BR), triton.cdiv(C, BC))](
        t.data, t.scale, out, R, C, t.data.stride(0), t.data.stride(1),
        t.scale.stride(0), t.scale.stride(1), BR=BR, BC=BC, num_warps=4)
    return out


@triton.jit
def _part(a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k, K,
          sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, EVEN_K: tl.constexpr):
    # One 32-wide K slice: its FP8 dot (fp32) and the [BM, BN] product of its two scales.
    kk = k + rk
    kb = k // 32
    if EVEN_K:
        a = tl.load(a_ptr + rm[:, None] * sam + kk[None, :] * sak, mask=mmask[:, None], other=0.0)
        b = tl.load(b_ptr + kk[:, None] * sbk + rn[None, :] * sbn, mask=nmask[None, :], other=0.0)
        sa = tl.load(as_ptr + rm * sasm + kb * sask, mask=mmask, other=127)
        sb = tl.load(bs_ptr + rn * sbsn + kb * sbsk, mask=nmask, other=127)
    else:
        kmask = kk < K
        a = tl.load(a_ptr + rm[:, None] * sam + kk[None, :] * sak, mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(b_ptr + kk[:, None] * sbk + rn[None, :] * sbn, mask=kmask[:, None] & nmask[None, :], other=0.0)
        sa = tl.load(as_ptr + rm * sasm + kb * sask, mask=mmask & (k < K), other=127)
        sb = tl.load(bs_ptr + rn * sbsn + kb * sbsk, mask=nmask & (k < K), other=127)
    part = tl.dot(a, b, out_dtype=tl.float32)
    return part, _e8m0_to_f32(sa)[:, None] * _e8m0_to_f32(sb)[None, :]


@triton.jit
def _kstep(acc, a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0, K,
           sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk,
           SUB: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr):
    # SUB consecutive 32-wide slices starting at k0, each dotted and scaled separately.
    if PAIR:  # two dots in flight before their scaling
        for jj in tl.static_range(SUB // 2):
            p0, s0 = _part(a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0 + jj * 64, K,
                           sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, EVEN_K)
            p1, s1 = _part(a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0 + jj * 64 + 32, K,
                           sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, EVEN_K)
            acc += p0 * s0
            acc += p1 * s1
    else:
        for j in tl.static_range(SUB):
            p, sc = _part(a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0 + j * 32, K,
                          sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, EVEN_K)
            acc += p * sc
    return acc


@triton.jit
def grouped_tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(tile row, tile column) of this program, GROUP_M tile rows at a time (L2 reuse of B)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % group) % gsize, (pid % group) // gsize


@triton.jit
def _mx_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, bias_ptr,
    M, N, K,
    sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, scm, scn,
    BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr, GROUP_M: tl.constexpr,
    PAIR: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, RANGE_STAGES: tl.constexpr,
):
    pid_m, pid_n = grouped_tile_ids(M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, 32)
    mmask = rm < M
    nmask = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    # RANGE_STAGES > 0: tl.range pipelining, which also prefetches the scale loads (the
    # kernel-level num_stages only pipelines loads that feed a dot).
    if RANGE_STAGES > 0:
        for k0 in tl.range(0, K, 32 * SUB, num_stages=RANGE_STAGES):
            acc = _kstep(acc, a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0, K,
                         sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, SUB, PAIR, EVEN_K)
    else:
        for k0 in range(0, K, 32 * SUB):
            acc = _kstep(acc, a_ptr, as_ptr, b_ptr, bs_ptr, rm, rn, rk, mmask, nmask, k0, K,
                         sam, sak, sbn, sbk, sasm, sask, sbsn, sbsk, SUB, PAIR, EVEN_K)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, c, mask=mmask[:, None] & nmask[None, :])


# (BM, BN, SUB, num_warps, num_stages, PAIR, RANGE). The fp32 accumulator plus one (PAIR: two)
# dot results must fit the register file. RANGE: pipeline with tl.range(num_stages=...), which
# also prefetches the per-slice scale loads. Tuned once per shape on first use.
_Cfg = tuple[int, int, int, int, int, bool, bool]
_GPU_CONFIGS: list[_Cfg] = [
    # The best two of the 2026-11-29 H200 runs (BENCHMARKS.md): 64x128 won at every shape;
    # 128x128, 128x256, PAIR and tl.range-pipelined scale loads were all slower there.
    (64, 128, 2, 4, 5, False, False),
    (64, 128, 1, 4, 6, False, False),
]
_tuned: dict[tuple[int, int, int, bool, bool], _Cfg] = {}
TUNE = {"enabled": True}
PAIR_INTERP = {"on": False}  # tests flip this to cover the PAIR code path on CPU
# (M, N, K) -> [(config, ms)] of the last tuning, for the bench to print.
TUNE_LOG: dict[tuple[int, int, int], list[tuple[_Cfg, float]]] = {}


def _launch(a: MXTensor, b: MXTensor, out: torch.Tensor, bias: torch.Tensor | None,
            cfg: _Cfg) -> None:
    M, K = a.data.shape
    N = b.data.shape[0]
    BM, BN, SUB, warps, stages, pair, rng = cfg
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    ad, bd = a.data, b.data  # fp8 pointers: loads feed tl.dot directly (pipelined to smem)
    _mx_gemm_kernel[grid](
        ad, a.scale, bd, b.scale, out, bias if bias is not None else out,
        M, N, K,
        ad.stride(0), ad.stride(1), bd.stride(0), bd.stride(1),
        a.scale.stride(0), a.scale.stride(1), b.scale.stride(0), b.scale.stride(1),
        out.stride(0), out.stride(1),
        BM=BM, BN=BN, SUB=SUB, GROUP_M=8, PAIR=pair,
        HAS_BIAS=bias is not None, EVEN_K=K % (32 * SUB) == 0, RANGE_STAGES=stages if rng else 0,
        num_warps=warps, num_stages=stages,
    )


# Which CUDA path mx_gemm_triton takes: "dequant" (default) dequantizes both operands to bf16
# in one Triton pass each (exact for scale bytes >= 10, see dequantize_bf16) and multiplies with
# cuBLAS bf16 (fp32 accumulation); "fused" is the single Triton kernel above (FP8 tensor-core
# dot + fp32 rescale per 32 K, exact for every scale). On the H200 the first runs at ~0.9x
# bf16 and the second at ~0.16x (BENCHMARKS.md): Hopper has no block-scaled MMA.
GEMM_PATH = {"path": "dequant"}
_MM_OUT_DTYPE = {"ok": True}


def _mm_fp32_out(a16: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """bf16 a @ b with the fp32 accumulator returned unrounded (cuBLAS bf16 -> fp32 output)."""
    if a16.is_cuda and _MM_OUT_DTYPE["ok"]:
        try:
            return torch.mm(a16, b16, out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):  # a torch without mm(out_dtype=)
            _MM_OUT_DTYPE["ok"] = False
    return torch.mm(a16.float(), b16.float())


def mx_gemm_triton(a: MXTensor, b: MXTensor, out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    """a: [M, K] blocked along K; b: [N, K] blocked along K -> [M, N] out_dtype (+ bias)."""
    M, K = a.data.shape
    N = b.data.shape[0]
    path = GEMM_PATH["path"]
    if path not in ("dequant", "fused"):
        raise ValueError(f"_triton_gemm.GEMM_PATH['path']={path!r} must be 'dequant' or 'fused'")
    if path == "dequant" and M > 0 and N > 0:
        a16, b16 = dequantize_bf16(a), dequantize_bf16(b)
        if out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
            # cuBLAS: fp32 accumulation, bias added in the fp32 epilogue, one rounding to bf16.
            return torch.mm(a16, b16.t()) if bias is None else torch.addmm(bias, a16, b16.t())
        y = _mm_fp32_out(a16, b16.t())  # fp32 result of the bf16 product (fp32 bias, fp32 out)
        if bias is not None:
            y += bias.float()
        return y.to(out_dtype)
    out = torch.empty((M, N), dtype=out_dtype, device=a.data.device)
    if M == 0 or N == 0:
        return out
    if not a.data.is_cuda:  # TRITON_INTERPRET=1: one small config
        _launch(a, b, out, bias, (32, 32, 2, 4, 2, PAIR_INTERP["on"], PAIR_INTERP["on"]))
        return out
    # M bucketed to a power of two: jagged batches (a new token count per step) tune once per
    # size class instead of on every call.
    key = (size_class(M), N, K, a.elem_dtype == torch.float8_e5m2, b.elem_dtype == torch.float8_e5m2)
    if key not in _tuned:
        if not TUNE["enabled"] or M * N * K < 2**30:
            _tuned[key] = _GPU_CONFIGS[0]
        else:
            best: tuple[float, _Cfg] | None = None
            for cfg in _GPU_CONFIGS:
                try:
                    ms = triton.testing.do_bench(lambda: _launch(a, b, out, bias, cfg), warmup=5, rep=20)
                except Exception:  # noqa: BLE001 - a config that does not fit (smem/regs) is skipped
                    continue
                TUNE_LOG.setdefault((M, N, K), []).append((cfg, ms))
                if best is None or ms < best[0]:
                    best = (ms, cfg)
            _tuned[key] = best[1] if best is not None else _GPU_CONFIGS[0]
    _launch(a, b, out, bias, _tuned[key])
    return out
