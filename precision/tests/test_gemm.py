"""mx_mm: Triton MXFP8 GEMM vs dequantize-then-fp32-matmul."""
import os

import pytest
import torch
from _util import mixed

from gem_precision import mx_mm, mx_mm_reference, to_mx

CAN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Error bound relative to sum_k |a_ik b_jk|. On CPU (interpreter) only fp32 summation order
# differs. Hopper's FP8 tensor cores accumulate inside one k32 step with ~14 significant bits
# (DeepSeek-V3 report, §3.3.2), so on the GPU the bound is 2^-10.
FP32_TOL = 2**-10 if torch.cuda.is_available() else 1e-6


def _operands(M: int, N: int, K: int, seed: int, elem_a: torch.dtype = torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    # Per-32-block magnitudes that vary over 2^±8 so wrong scale indexing cannot hide.
    xa = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-8, 8, (M, (K + 31) // 32), generator=g).float()).repeat_interleave(32, 1)[:, :K]
    xb = torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-8, 8, (N, (K + 31) // 32), generator=g).float()).repeat_interleave(32, 1)[:, :K]
    a = to_mx(xa.to(DEV), elem_dtype=elem_a, pad=True)
    b = to_mx(xb.to(DEV), pad=True)
    return a, b


@pytest.fixture(params=["dequant", "fused"])
def gemm_path(request: pytest.FixtureRequest):
    """Both CUDA/interpreter GEMM paths: dequantize-to-bf16 + cuBLAS, and the fused Triton kernel."""
    from gem_precision import _triton_gemm

    old = _triton_gemm.GEMM_PATH["path"]
    _triton_gemm.GEMM_PATH["path"] = request.param
    yield request.param
    _triton_gemm.GEMM_PATH["path"] = old


def _check(y: torch.Tensor, a, b, ref: torch.Tensor, rtol: float) -> None:
    # Error bound relative to sum_k |a_ik b_jk| (what fp32 reordering can move).
    den = a.dequantize().abs() @ b.dequantize().abs().t()
    err = ((y.float() - ref.float()).abs() / (den + 1e-30)).max().item()
    assert err <= rtol, err


@pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("M,N,K", [(64, 64, 128), (40, 70, 96), (1, 33, 32), (33, 1, 160), (17, 40, 40)])
@pytest.mark.parametrize("elem_a", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_triton_matches_reference(M: int, N: int, K: int, elem_a: torch.dtype, gemm_path: str) -> None:
    a, b = _operands(M, N, K, seed=M * N + K, elem_a=elem_a)
    bias = torch.randn(N, device=DEV)
    y = mx_mm(a, b, out_dtype=torch.float32, bias=bias, backend="triton")
    ref = mx_mm_reference(a, b, out_dtype=torch.float32, bias=bias)
    assert y.shape == (M, N) and y.dtype == torch.float32
    den = a.dequantize().abs() @ b.dequantize().abs().t() + bias.abs()
    assert ((y - ref).abs() / den).max().item() <= FP32_TOL
    yb = mx_mm(a, b, backend="triton")
    assert yb.dtype == torch.bfloat16
    # bf16 output: one rounding (RNE on GPU; Triton's CPU interpreter truncates, hence 2^-7).
    _check(yb, a, b, mx_mm_reference(a, b, out_dtype=torch.float32), (2**-8 + FP32_TOL) if torch.cuda.is_available() else 2**-7)


def test_reference_is_dequantized_matmul() -> None:
    a, b = _operands(8, 16, 64, seed=1)
    y = mx_mm(a, b, out_dtype=torch.float32, backend="reference")
    assert torch.equal(y, a.dequantize() @ b.dequantize().t())
    # Quantized GEMM is close to the unquantized one (E4M3: ~2^-4 relative per element).
    xa, xb = a.dequantize(), b.dequantize()
    assert torch.equal(mx_mm(to_mx(xa), to_mx(xb), out_dtype=torch.float32, backend="reference"), xa @ xb.t())


def test_bad_operands() -> None:
    a, b = _operands(8, 16, 64, seed=2)
    with pytest.raises(ValueError, match="contraction"):
        mx_mm(a, to_mx(torch.randn(16, 96)))
    with pytest.raises(ValueError, match="blocked along dim 1"):
        mx_mm(a, to_mx(torch.randn(64, 16), dim=0))
    with pytest.raises(ValueError, match="bias"):
        mx_mm(a, b, bias=torch.zeros(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("M,N,K", [(4096, 4096, 4096), (8192, 1024, 2048), (1000, 520, 2080)])
def test_gpu_fp8_path(M: int, N: int, K: int, gemm_path: str) -> None:
    a, b = _operands(M, N, K, seed=K)
    y = mx_mm(a, b, out_dtype=torch.float32)
    _check(y, a, b, mx_mm_reference(a, b, out_dtype=torch.float32), FP32_TOL)


@pytest.mark.skipif(torch.cuda.is_available() or not CAN_TRITON, reason="interpreter-only switch")
def test_pair_code_path_interpreter() -> None:
    from gem_precision import _triton_gemm

    a, b = _operands(40, 36, 160, seed=5)
    _triton_gemm.PAIR_INTERP["on"] = True
    try:
        y = mx_mm(a, b, out_dtype=torch.float32, backend="triton")
    finally:
        _triton_gemm.PAIR_INTERP["on"] = False
    _check(y, a, b, mx_mm_reference(a, b, out_dtype=torch.float32), FP32_TOL)


@pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("elem", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_dequantize_bf16_exact(elem: torch.dtype) -> None:
    from gem_precision._triton_gemm import dequantize_bf16

    g = torch.Generator().manual_seed(11)
    R, C = (70, 320) if DEV == "cpu" else (4099, 8192)
    # Block magnitudes over the whole E8M0 range, plus NaN, zero and subnormal blocks.
    x = torch.randn(R, C, generator=g) * torch.exp2(torch.randint(-126, 120, (R, 1), generator=g).float())
    x[0, :32] = 0.0
    x[1, 5] = float("nan")
    x[2, 32:64] = 1e-39
    q = to_mx(x.to(DEV), elem_dtype=elem)
    d = dequantize_bf16(q)
    assert d.dtype == torch.bfloat16 and d.shape == (R, C)
    ref = q.dequantize(torch.float32)
    exact = (q.scale >= 10).repeat_interleave(32, 1)  # the documented exactness range
    assert exact.float().mean() > 0.8
    assert torch.equal(d.float()[exact].nan_to_num(1.0), ref[exact].nan_to_num(1.0))
    assert torch.isnan(d[1, 5])


def test_unknown_gemm_path_is_refused() -> None:
    from gem_precision import _triton_gemm

    a, b = _operands(8, 16, 64, seed=3)
    old = _triton_gemm.GEMM_PATH["path"]
    _triton_gemm.GEMM_PATH["path"] = "fast"
    try:
        with pytest.raises(ValueError, match="GEMM_PATH.*must be 'dequant' or 'fused'"):
            _triton_gemm.mx_gemm_triton(a, b, torch.bfloat16, None)
    finally:
        _triton_gemm.GEMM_PATH["path"] = old
