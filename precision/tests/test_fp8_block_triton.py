"""fp8_block's fused Triton quantizer (`_triton_fp8_block`) vs the torch quantizers, bit for bit.

TRITON_INTERPRET=1 on CPU at small sizes: codes and scales of `quantize_rows_cols_triton`
equal `quantize_rows` / `quantize_cols` (mixed magnitudes, zeros, subnormal and clamped
blocks, the 1.75 mantissa boundary, +-NaN/+-Inf), every tile, strided input; FP8BlockLinear
with quant="triton" gives the same output and gradients as quant="torch", eager and compiled.
GPU: real sizes, both element paths; SM90: the cuBLAS linear, triton vs torch quantization.
"""
import os

import pytest
import torch
from torch import nn

from _util import compiles_over_token_counts, mixed
from _util import fwd_bwd as _run
from gem_precision import FP8BlockConfig, FP8BlockLinear
from gem_precision import _fp8_block as fb
from gem_precision import _triton_fp8_block as tfb

CUDA = torch.cuda.is_available()
SM90 = CUDA and torch.cuda.get_device_capability()[0] == 9
pytestmark = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="needs CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
U8 = torch.uint8


def _finite_blocks(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[M, K] bool: the element's 128-block along `dim` (1: rows, 0: cols) is all finite."""
    ok = torch.isfinite(t)
    M, K = t.shape
    if dim == 1:
        return ok.reshape(M, K // 128, 128).all(-1, keepdim=True).expand(M, K // 128, 128).reshape(M, K)
    return ok.reshape(M // 128, 128, K).all(1, keepdim=True).expand(M // 128, 128, K).reshape(M, K)


def _same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
          defined: torch.Tensor) -> None:
    """Codes equal wherever the torch path defines them; scales equal (NaN where NaN)."""
    (q, s), (rq, rs) = got, want
    assert q.shape == rq.shape and q.dtype == rq.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert s.shape == rs.shape and s.dtype == rs.dtype == torch.float32 and s.is_contiguous()
    bad = ((q.view(U8) != rq.view(U8)) & defined).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} codes differ, first at {bad[0].tolist()}"
    assert torch.equal(s.isnan(), rs.isnan())
    assert torch.equal(s.nan_to_num(0.0), rs.nan_to_num(0.0))


def _check(t: torch.Tensor, rows: bool = True, cols: bool = True, **kw: object) -> None:
    r, c = tfb.quantize_rows_cols_triton(t, rows, cols, **kw)  # type: ignore[arg-type]
    assert (r is not None) == rows and (c is not None) == cols
    # t's rows padded to 128 with zeros: what the torch path quantizes (t itself when M fits)
    t = nn.functional.pad(t, (0, 0, 0, tfb.padded_rows(t.shape[0]) - t.shape[0]))
    # the torch path defines a code where the element is NaN/Inf or its block is finite
    special = ~torch.isfinite(t)
    if r is not None:
        _same(r, fb.quantize_rows(t), _finite_blocks(t, 1) | special)
    if c is not None:
        _same(c, fb.quantize_cols(t), (_finite_blocks(t, 0) | special).t())


def _hard(shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """mixed() (2^+-40 magnitudes, 5 % zeros, NaN, +-Inf, a subnormal) plus known edge blocks."""
    t = mixed(shape, torch.float32, seed)
    t[:128, :128] = 0  # a zero block: scale 2^-126, codes 0
    t[1, 128:] = 2.0**-120  # amax below 448 * 2^-126: e clamped to -126, codes 64
    t[2, :128] = 1.75 * 8  # mantissa exactly 0.75: scale 2^-5 (448 itself)
    t[3, :128] = torch.tensor(1.75 * 8).nextafter(torch.tensor(100.0))  # just above: 2^-4
    t[4, 5], t[5, 6], t[6, 7] = float("inf"), -float("inf"), -0.0
    t[4, 6] = 1.5 * 2.0**126  # finite, in a block holding Inf: scaled by 2^-120 (our rule)
    t.view(torch.int32)[7, 8] = -0x400000  # a negative NaN (0xFFC00000)
    return t.to(dtype)


@pytest.mark.parametrize("shape", [(256, 384), (128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rows_and_cols_bit_exact(shape: tuple[int, int], dtype: torch.dtype) -> None:
    t = _hard(shape, dtype, seed=shape[1] + len(str(dtype))).to(DEV)
    _check(t)


def test_rows_only_cols_only_tiles_and_strides() -> None:
    t = _hard((256, 256), torch.bfloat16, seed=7).to(DEV)
    _check(t, rows=True, cols=False)
    _check(t, rows=False, cols=True)
    for tile in tfb.TILES:  # 256-wide tiles fit; each bit-exact
        _check(t, tile=tile)
    wide = _hard((256, 1024), torch.bfloat16, seed=9).to(DEV)  # K loops of 4 and 8 tiles, and
    for tile in (tfb.QuantTile(k_loop=4, num_stages=2), tfb.QuantTile(k_loop=8, num_stages=3),
                 tfb.QuantTile(k_loop=3)):  # one that does not divide K/128 = 8 (halved to 2)
        _check(wide, tile=tile)
        _check(wide[:200], rows=False, cols=True, tile=tile)  # padded rows inside the loop too
    _check(_hard((384, 256), torch.float32, seed=8).to(DEV).t())  # non-contiguous [256, 384]
    r, c = tfb.quantize_rows_cols_triton(torch.empty(0, 256, device=DEV), True, True)  # no tokens
    assert r is not None and c is not None and r[0].shape == (0, 256) and c[0].shape == (256, 0)


@pytest.mark.parametrize("m", [1, 200, 383])
def test_rows_not_a_multiple_of_128_quantize_as_the_zero_padded_copy(m: int) -> None:
    # The quantizer pads inside (masked loads): codes and scales of Mp = 128-rounded rows,
    # equal to the torch quantizers' on t padded with zero rows; strided input too.
    t = _hard((384, 256), torch.bfloat16, seed=m).to(DEV)[:m]
    _check(t)
    _check(t, rows=False, cols=True, tile=tfb.QuantTile(bm=256, num_warps=8))
    _check(_hard((256, 384), torch.float32, seed=m + 1).to(DEV).t()[:m])  # non-contiguous [m, 256]
    (q, s), (qt, st) = tfb.quantize_rows_cols_triton(t, True, True)  # type: ignore[misc]
    mp = tfb.padded_rows(m)
    assert q.shape == (mp, 256) and s.shape == (mp, 2) and qt.shape == (256, mp) and st.shape == (mp // 128, 256)
    assert torch.all(q[m:].view(U8) == 0) and torch.all(s[m:] == 2.0**-126)  # the padding: zero blocks


def test_known_answers() -> None:
    t = _hard((128, 256), torch.float32, seed=9).to(DEV)
    (q, s), (qt, st) = tfb.quantize_rows_cols_triton(t, True, True)  # type: ignore[misc]
    assert s[0, 0] == 2.0**-126 and torch.all(q[0, :128].view(U8) == 0)  # zero block
    assert s[1, 1] == 2.0**-126 and torch.all(q[1, 128:].float() == 64)  # clamped exponent
    assert s[2, 0] == 2.0**-5 and torch.all(q[2, :128].float() == 448)
    assert s[3, 0] == 2.0**-4
    assert s[4, 0].isnan() and q[4, 5].view(U8) == tfb._inf_code()  # +Inf
    assert q[4, 6].float() == 96  # 1.5 * 2^126 * 2^-120: the rule for a non-finite block's finite codes
    # -Inf; -NaN: 0xFF on CPU, 0x7F on CUDA (torch's GPU multiply drops a NaN's sign)
    assert q[5, 6].view(U8) == tfb._inf_code() | 0x80 and q[7, 8].view(U8) == (0x7F if CUDA else 0xFF)
    assert q[6, 7].view(U8) == 0x80  # -0 keeps its sign
    assert torch.all(st[0, [5, 6, 8]].isnan()) and qt[5, 4].view(U8) == tfb._inf_code()  # cols: t^T[5, 4] = t[4, 5]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"t.shape=\(128, 100\) must be 2-D \[M, K\] with K a multiple of 128"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 100, device=DEV), True, True)
    with pytest.raises(ValueError, match=r"t.shape=\(128,\) must be 2-D"):
        tfb.quantize_rows_cols_triton(torch.ones(128, device=DEV), True, True)
    with pytest.raises(TypeError, match="t.dtype=torch.int32"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 128, dtype=torch.int32, device=DEV), True, False)
    with pytest.raises(ValueError, match="rows=False, cols=False: ask for at least one"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 128, device=DEV), False, False)
    with pytest.raises(ValueError, match="bm and bk must be multiples of 128"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 128, device=DEV), True, True, tile=tfb.QuantTile(bm=64))
    with pytest.raises(ValueError, match="k_loop and num_stages must be >= 1"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 128, device=DEV), True, True, tile=tfb.QuantTile(k_loop=0))
    with pytest.raises(ValueError, match="quant='cuda' must be 'auto', 'torch' or 'triton'"):
        FP8BlockLinear(128, 128, config=FP8BlockConfig(quant="cuda"))(torch.ones(2, 128))  # type: ignore[arg-type]


@pytest.mark.skipif(CUDA, reason="the CPU emulation; the GPU runs test_gpu_linear_triton_equals_torch")
@pytest.mark.parametrize("wgrad_bf16", [False, True])
def test_linear_triton_quant_equals_torch(wgrad_bf16: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    base = nn.Linear(256, 384)
    x = torch.randn(2, 100, 256)  # 200 tokens: padded to 256 inside
    dy = torch.randn(2, 100, 384, dtype=torch.bfloat16)
    want = _run(FP8BlockLinear.from_linear(base, FP8BlockConfig(wgrad_bf16=wgrad_bf16, quant="torch")), x, dy)
    lin = FP8BlockLinear.from_linear(base, FP8BlockConfig(wgrad_bf16=wgrad_bf16, quant="triton"))
    assert "quant=triton" in repr(lin)

    def no_pad(*a: object, **k: object) -> None:
        raise AssertionError("the fused quantizer pads x and dY itself: no padded copy")

    with monkeypatch.context() as mp:
        mp.setattr(nn.functional, "pad", no_pad)
        got = _run(lin, x, dy)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    if not wgrad_bf16:  # and traced whole, the quantizer as the opaque op fp8_block_quant
        for a, b in zip(_run(torch.compile(lin, fullgraph=True, backend="aot_eager"), x, dy), want):
            assert torch.equal(a, b)


def test_finite_tiles_beside_a_tile_with_inf() -> None:
    # A tile without NaN/Inf takes the kernel's short path (no per-element special codes); one
    # with an Inf the full path. Both bit-exact in the same call, rows and cols.
    torch.manual_seed(5)
    t = torch.randn(384, 512) * torch.exp2(torch.randint(-30, 30, (384, 4))).repeat_interleave(128, 1)
    t[300, 400] = float("inf")
    _check(t.to(DEV))
    _check(t.to(torch.bfloat16).to(DEV)[:333])


def test_cpu_without_interpreter_uses_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.ones(2, 128)
    assert fb._fused("triton", x) is False  # the same codes through the torch quantizers
    assert fb._fused("auto", x) is False
    with pytest.raises(ValueError, match="needs a CUDA tensor or TRITON_INTERPRET=1"):
        tfb.quantize_rows_cols_triton(torch.ones(128, 128), True, True)
    y = FP8BlockLinear(128, 128, config=FP8BlockConfig(quant="triton"))(x)
    assert y.shape == (2, 128)


def test_auto_quant_is_torch_on_cpu_even_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default quant="auto" fuses on CUDA only: CPU runs (the emulation) keep the torch
    quantizers, also under TRITON_INTERPRET=1 (which every Bazel test sets)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert FP8BlockConfig().quant == "auto"
    assert fb._fused("auto", torch.ones(2, 128)) is False
    assert fb._fused("triton", torch.ones(2, 128)) is True


def test_op_fake_shapes() -> None:
    t = torch.empty(384, 256, device="meta", dtype=torch.bfloat16)
    shapes = [tuple(o.shape) for o in tfb._fp8_block_quant_fake(t, True, False)]
    assert shapes == [(384, 256), (384, 2), (1,), (1,)]
    shapes = [tuple(o.shape) for o in tfb._fp8_block_quant_fake(t, False, True)]
    assert shapes == [(1,), (1,), (256, 384), (3, 256)]
    t = torch.empty(300, 256, device="meta", dtype=torch.bfloat16)  # padded to 384 rows inside
    shapes = [tuple(o.shape) for o in tfb._fp8_block_quant_fake(t, True, True)]
    assert shapes == [(384, 256), (384, 2), (256, 384), (3, 256)]


# --- GPU --------------------------------------------------------------------------------------

@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("shape,dtype", [((262144, 1024), torch.bfloat16), ((16384, 4096), torch.float32)])
def test_gpu_real_size_bit_exact(shape: tuple[int, int], dtype: torch.dtype) -> None:
    t = mixed(shape, dtype, seed=shape[1]).cuda()
    _check(t)
    small = t[:4096, :2048]
    for int_cvt in (False, True):  # both element paths
        if int_cvt or torch.cuda.get_device_capability() >= (8, 9):
            _check(small, int_cvt=int_cvt)
    for tile in tfb.TILES:
        _check(small, tile=tile)


@pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) GPU")
def test_gpu_linear_triton_equals_torch() -> None:
    torch.manual_seed(0)
    base = nn.Linear(1024, 3072, device="cuda")
    x = torch.randn(8, 1000, 1024, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(8, 1000, 3072, device="cuda", dtype=torch.bfloat16)
    want = _run(FP8BlockLinear.from_linear(base, FP8BlockConfig(quant="torch")), x, dy)  # torch quantizers (compiled)
    assert fb._fused(FP8BlockConfig().quant, x)  # the default ("auto") runs the fused quantizer on CUDA
    lin = FP8BlockLinear.from_linear(base, FP8BlockConfig(quant="triton"))
    for f, compiled in ((lin, False), (torch.compile(lin, fullgraph=True), True)):
        *got, db = _run(f, x, dy)
        for a, b in zip(got, want[:-1]):  # same codes -> the same cuBLAS GEMMs: y, dx, dW bitwise
            assert torch.equal(a, b)
        # the bias gradient dy.sum(0) is a plain reduction: inductor sums in another order
        if compiled:
            torch.testing.assert_close(db, want[-1], rtol=1e-5, atol=1e-4)
        else:
            assert torch.equal(db, want[-1])


@pytest.mark.skipif(CUDA, reason="the CPU emulation; the GPU runs the trainer's compiled fp8_block blocks")
@pytest.mark.parametrize("wgrad_bf16", [False, True])
def test_compiled_fused_linear_keeps_one_graph_over_token_counts(wgrad_bf16: bool) -> None:
    # The fused quantizer pads inside, so the traced linear must not branch on whether the
    # token count is a multiple of 128: a guard on it recompiled the h200 preset's fp8_block
    # blocks each time a batch's count crossed it (~90 s per compile on the H200, 2026-12-04).
    n = compiles_over_token_counts(FP8BlockConfig(quant="triton", wgrad_bf16=wgrad_bf16), seed=1)
    assert n == 1, f"{n} compiles for 5 token counts"


def test_the_token_count_is_not_a_jit_specialisation() -> None:
    """Triton compiles a kernel again for each divisibility class of an int argument. The
    token count (M_IN) changes every batch, so a class first seen mid-run would compile in
    the middle of training; M_IN appears only in the row mask, so nothing is lost by not
    specialising it. The padded count M (a multiple of 128) and the strides stay specialised."""
    kern = tfb._fp8_block_quant_kernel
    spec = getattr(kern, "do_not_specialize", None)
    if spec is None:  # the interpreter's wrapper keeps the decorator's arguments
        spec = kern.kwargs["do_not_specialize"]  # type: ignore[union-attr]
    assert list(spec) == ["M_IN"]
