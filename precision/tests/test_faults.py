"""Issue #20's precision faults: empty tensors through the Triton cast, and "rceil" blocks near
fp32's max that decoded to Inf."""
import os

import pytest
import torch
from _util import assert_mx_equal

from gem_precision import MXTensor, to_mx, to_mx_reference
from gem_precision._formats import dequantize_reference, scale_to_float

CAN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ELEMS = [torch.float8_e4m3fn, torch.float8_e5m2]
FMAX = torch.finfo(torch.float32).max


@pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("shape, dim", [((4, 0), -1), ((0, 64), 0), ((3, 0, 32), 1), ((0, 64), -1), ((4, 0), 0),
                                        ((2, 0, 32), -1), ((0, 0), 0)])
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_empty_tensors_through_triton(shape: tuple[int, ...], dim: int, mode: str) -> None:
    """[4, 0] along the last dim failed in reshape(-1, 0) before reaching the kernel."""
    x = torch.randn(shape, device=DEV)
    got = to_mx(x, dim=dim, scale_mode=mode, pad=True, backend="triton")  # type: ignore[arg-type]
    ref = to_mx_reference(x.cpu(), dim=dim, scale_mode=mode)  # type: ignore[arg-type]
    assert_mx_equal(MXTensor(data=got.data.cpu(), scale=got.scale.cpu(), dim=got.dim, block_size=got.block_size,
                             elem_dtype=got.elem_dtype), ref)
    assert got.dequantize().shape == shape


def _near_max_blocks(n: int, elem: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """n blocks of 32, each with amax in (1.9375 * 2^127, fp32 max]: the range where "rceil"
    rounds the largest element up to X * P = 2^128. Other elements random, both signs."""
    amax = (1.9375 + 0.0625 * torch.rand(n, generator=g, dtype=torch.float64)) * 2.0**127
    amax = amax.clamp(max=FMAX).float()
    x = torch.randn(n, 32, generator=g) * amax[:, None] / 4
    x = x.clamp(-FMAX, FMAX)
    pos = torch.randint(0, 32, (n,), generator=g)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x[torch.arange(n), pos] = sign * amax
    return x


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_near_max_blocks_decode_finite_and_saturated(elem: torch.dtype, mode: str) -> None:
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    x = _near_max_blocks(64, elem, g)
    t = to_mx(x, elem_dtype=elem, scale_mode=mode, backend="reference")  # type: ignore[arg-type]
    exact = t.data.double() * scale_to_float(t.scale).double().repeat_interleave(32, dim=-1)  # float64 holds 2^128
    if mode == "rceil":  # the fault: some of these really are beyond fp32
        assert (exact.abs() > FMAX).any()
    out = t.dequantize()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), exact.clamp(-FMAX, FMAX), rtol=0, atol=0)
    # the saturation is the only change: within range, exactly the old product
    inside = exact.abs() <= FMAX
    assert torch.equal(out[inside], (t.data.float() * scale_to_float(t.scale).repeat_interleave(32, dim=-1))[inside])
    # and the decoded block stays close to x (one element step of the block)
    rel = ((out.double() - x.double()).abs().amax(-1) / x.double().abs().amax(-1))
    assert (rel <= 2.0 ** -(2 if elem == torch.float8_e5m2 else 3)).all(), rel.max()


@pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("elem", ELEMS)
def test_near_max_blocks_triton_equals_reference(elem: torch.dtype) -> None:
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    x = _near_max_blocks(32, elem, g).reshape(16, 64)
    for mode in ("floor", "rceil"):
        got = to_mx(x.to(DEV), elem_dtype=elem, scale_mode=mode, backend="triton")
        ref = to_mx_reference(x, elem_dtype=elem, scale_mode=mode)
        assert torch.equal(got.scale.cpu(), ref.scale)
        assert torch.equal(got.data.cpu().view(torch.uint8), ref.data.view(torch.uint8))
        assert torch.isfinite(got.dequantize()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_saturates_to_the_target_dtype(dtype: torch.dtype) -> None:
    x = torch.randn(8, 64) * torch.exp2(torch.randint(0, 127, (8, 1)).float())
    t = to_mx(x, scale_mode="rceil")
    out = t.dequantize(dtype)
    big = torch.finfo(dtype).max
    want = t.dequantize(torch.float32).to(dtype).nan_to_num(posinf=big, neginf=-big)
    assert torch.isfinite(out).all() and torch.equal(out, want)


def test_nan_blocks_and_e5m2_inf_codes_are_kept() -> None:
    x = torch.randn(2, 32)
    x[0, 3] = float("nan")
    t = to_mx(x, elem_dtype=torch.float8_e5m2)
    out = t.dequantize()
    assert out[0].isnan().all() and torch.isfinite(out[1]).all()
    data = t.data.clone()
    data[1, 5] = float("-inf")  # an E5M2 Inf code (to_mx never writes one)
    inf = dequantize_reference(MXTensor(data=data, scale=t.scale, dim=1, block_size=32, elem_dtype=torch.float8_e5m2))
    assert inf[1, 5].item() == float("-inf")
