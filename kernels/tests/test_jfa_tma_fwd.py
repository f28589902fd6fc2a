"""The TMA JFA forward (`_triton_jfa_tma.jfa_forward_tma`) vs `jfa_forward` and the reference.

CPU: Triton's interpreter (TRITON_INTERPRET=1) at tiny sizes with 16-row tiles, so lengths
0, 5, 17, 33 hit the tile edges and a tile reaches into the next sample (the interpreter
honours host TensorDescriptor bounds like TMA: only past the tensor's last row is zero).
GPU (SM90 only): the issue's batch at real size, every bench config (warp specialization on
and off), and the next-sample NaN check with real TMA.
"""

import math
import os

import pytest
import torch

from gem_kernels import jagged_flash_attention
from gem_kernels._jagged import visible_mask
from gem_kernels._triton_jfa import jfa_forward
from gem_kernels._triton_jfa_tma import COMPILING_TILES, TILES, TmaTiles, jfa_forward_tma, last_compiled, tma_fallback_reason

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and not INTERPRET
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (set by Bazel)")
needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) GPU")

TINY = TmaTiles(block_m=16, block_n=16)
TINY_WS_DEV = TmaTiles(block_m=16, block_n=16, ws=True, device_desc=True)
TINY_WS_ONE = TmaTiles(block_m=32, block_n=16, ws=True, one_loop=True)
# out (atol, rtol) vs the fp32 reference on the same rounded inputs, and lse atol (log2 units).
TOL = {torch.float32: ((2e-5, 1e-4), 1e-4), torch.bfloat16: ((2e-2, 2e-2), 1e-3)}


def _offsets(lengths: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64,
                        device=device)


def _ref_lse2(q: torch.Tensor, k: torch.Tensor, lq: list[int], lk: list[int], causal: bool, window: int | None,
              scale: float) -> torch.Tensor:
    """Per-row log2-sum-exp of the visible scaled scores in fp32 (+inf where none is visible)."""
    out = torch.full(q.shape[:2], math.inf)
    qs = ks = 0
    for a, c in zip(lq, lk):
        if a:
            s = torch.einsum("ihd,jhd->hij", q[qs:qs + a].float().cpu(), k[ks:ks + c].float().cpu()) * scale
            s = s.masked_fill(~visible_mask(a, c, causal=causal, window=window), -math.inf)
            lse = torch.logsumexp(s, -1) / math.log(2.0)  # [H, a]; -inf where nothing is visible
            out[qs:qs + a] = torch.where(torch.isinf(lse), math.inf, lse).T
        qs, ks = qs + a, ks + c
    return out


def _check(lq: list[int], lk: list[int], tiles: TmaTiles, *, dtype: torch.dtype, causal: bool,
           window: int | None = None, h: int = 2, d: int = 16) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(n), h, d, generator=g).to(dtype) for n in (lq, lk, lk))
    qo, ko = _offsets(lq), _offsets(lk)
    scale = 1.0 / math.sqrt(d)
    args = (q, k, v, qo, ko, max(lq), max(lk), causal, window, scale)
    out, lse = jfa_forward_tma(*args, tiles=tiles)
    want_out, want_lse = jfa_forward(*args)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    (atol, rtol), lse_tol = TOL[dtype]
    torch.testing.assert_close(out.float(), want_out.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(lse, want_lse, atol=lse_tol, rtol=0)  # +inf rows must match exactly
    ref = jagged_flash_attention(q.float(), k.float(), v.float(), qo, ko, max(lq), max(lk), causal=causal,
                                 window=window, scale=scale, backend="reference")
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse, _ref_lse2(q, k, lq, lk, causal, window, scale), atol=lse_tol, rtol=0)


# An empty query sequence, a sample with keys but no queries, one with queries but no keys
# (out 0, lse +inf), lengths off the 16-row tiles, and more queries than keys (causal rows
# that see nothing).
LQ = [5, 0, 17, 33, 4]
LK = [9, 3, 16, 40, 0]


@needs_interpreter
@pytest.mark.parametrize("dtype,causal,window,tiles", [
    (torch.float32, False, None, TINY),
    (torch.float32, True, None, TINY_WS_DEV),
    (torch.bfloat16, False, None, TINY_WS_ONE),
    (torch.bfloat16, True, None, TINY),
    (torch.float32, True, 7, TINY),
])
def test_matches_jfa_forward_and_reference(dtype: torch.dtype, causal: bool, window: int | None,
                                           tiles: TmaTiles) -> None:
    _check(LQ, LK, tiles, dtype=dtype, causal=causal, window=window)


@needs_interpreter
def test_cross_lengths_d32() -> None:
    _check([20, 3], [7, 50], TmaTiles(block_m=16, block_n=32, device_desc=True), dtype=torch.float32,
           causal=True, d=32)


def _nan_neighbour_case(device: str, lengths: list[int], h: int, d: int, dtype: torch.dtype,
                        tiles: TmaTiles, causal: bool) -> None:
    """Sample 1 is all NaN/Inf: every other sample must match `jfa_forward` (the edge tiles of
    sample 0 read sample 1's K/V rows through host descriptors)."""
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), h, d, generator=g, device=device).to(dtype) for _ in range(3))
    off = _offsets(lengths, device)
    s1 = slice(lengths[0], lengths[0] + lengths[1])
    k[s1] = float("nan")
    v[s1] = float("inf")
    args = (q, k, v, off, off, max(lengths), max(lengths), causal, None, 1.0 / math.sqrt(d))
    out, lse = jfa_forward_tma(*args, tiles=tiles)
    want_out, want_lse = jfa_forward(*args)
    keep = torch.ones(sum(lengths), dtype=torch.bool, device=device)
    keep[s1] = False
    assert torch.isfinite(out[keep]).all() and torch.isfinite(lse[keep]).all()
    torch.testing.assert_close(out[keep].float(), want_out[keep].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[keep], want_lse[keep], atol=2e-3, rtol=0)


@needs_interpreter
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # sample 1's own rows (NaN keys), in numpy
@pytest.mark.parametrize("tiles", [TINY, TINY_WS_DEV])
def test_non_finite_next_sample_does_not_leak(tiles: TmaTiles) -> None:
    _nan_neighbour_case("cpu", [13, 20, 9], 1, 16, torch.float32, tiles, causal=False)


@needs_interpreter
def test_empty_batches() -> None:
    q = torch.randn(0, 2, 16)
    out, lse = jfa_forward_tma(q, q, q, _offsets([0, 0]), _offsets([0, 0]), 0, 0, False, None, 0.25, tiles=TINY)
    assert out.shape == (0, 2, 16) and lse.shape == (0, 2)
    # Queries but no key anywhere: out 0, lse +inf (no descriptor over an empty tensor).
    q = torch.randn(6, 2, 16)
    k = torch.randn(0, 2, 16)
    out, lse = jfa_forward_tma(q, k, k, _offsets([2, 4]), _offsets([0, 0]), 4, 0, True, None, 0.25, tiles=TINY)
    assert (out == 0).all() and torch.isposinf(lse).all()


@needs_interpreter
def test_strided_k_falls_back_with_a_reason() -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(12, 2, 16, generator=g)
    kv = torch.randn(12, 2, 32, generator=g)[:, :, :16]  # stride(1) == 32 != D: not a [T, H*D] view
    assert "stride(1)" in str(tma_fallback_reason(q, kv, kv))
    off = _offsets([5, 7])
    got = jfa_forward_tma(q, kv, kv, off, off, 7, 7, True, None, 0.25, tiles=TINY)
    want = jfa_forward(q, kv, kv, off, off, 7, 7, True, None, 0.25)
    torch.testing.assert_close(got[0], want[0])
    assert last_compiled() is None


def test_bad_inputs_name_the_argument() -> None:
    q = torch.randn(4, 1, 16)
    off = _offsets([4])
    args = (q, q, q, off, off, 4, 4, False, None, 0.25)
    with pytest.raises(ValueError, match="tiles='nope'"):
        jfa_forward_tma(*args, tiles="nope")
    with pytest.raises(ValueError, match="tiles.block_n=24"):
        jfa_forward_tma(*args, tiles=TmaTiles(block_m=16, block_n=24))
    with pytest.raises(ValueError, match="tiles.block_m=512"):
        jfa_forward_tma(*args, tiles=TmaTiles(block_m=512, block_n=16))
    with pytest.raises(TypeError, match="tiles must be"):
        jfa_forward_tma(*args, tiles=16)  # type: ignore[arg-type]
    q24 = torch.randn(4, 1, 24)
    with pytest.raises(ValueError, match=r"q.shape\[2\]=24"):
        jfa_forward_tma(q24, q24, q24, off, off, 4, 4, False, None, 0.25)
    with pytest.raises(ValueError, match="k and v must be"):
        jfa_forward_tma(q, torch.randn(4, 2, 16), torch.randn(4, 2, 16), off, off, 4, 4, False, None, 0.25)


def test_tile_names_are_unique_and_valid() -> None:
    assert all(name == t.name for name, t in TILES.items())
    assert {t.ws for t in TILES.values()} == {False, True}
    assert COMPILING_TILES and not any(t.ws for t in COMPILING_TILES.values())


# --- GPU (SM90): real sizes -------------------------------------------------------------------


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", [None, *COMPILING_TILES])
def test_gpu_issue_batch_matches_jfa_forward(name: str | None, causal: bool) -> None:
    """The issue batch (seed 62, 64 LogNormal(6.5, 1) lengths in 64..16384, H=4, D=128, bf16),
    heuristic tiles (None) and every bench config that compiles on triton 3.6 (warp-specialized
    ones do not: `COMPILING_TILES`; the interpreter tests still run their code)."""
    from gem_kernels.bench._common import issue_lengths

    lengths = issue_lengths()
    h, d = 4, 128
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    off = _offsets(lengths, "cuda")
    assert tma_fallback_reason(q, k, v, torch.empty_like(q), TILES.get(name or "")) is None
    args = (q, k, v, off, off, max(lengths), max(lengths), causal, None, 1.0 / math.sqrt(d))
    out, lse = jfa_forward_tma(*args, tiles=name)
    assert last_compiled() is not None  # the TMA kernel ran, not the fallback
    want_out, want_lse = jfa_forward(*args)
    torch.testing.assert_close(out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=2e-3, rtol=0)


@needs_sm90
@pytest.mark.parametrize("name", list(COMPILING_TILES))
def test_gpu_non_finite_next_sample_does_not_leak(name: str) -> None:
    _nan_neighbour_case("cuda", [300, 129, 1000, 5], 2, 128, torch.bfloat16, TILES[name], causal=True)
