"""Triton quantization kernels vs the reference, bit for bit (TRITON_INTERPRET=1 on CPU)."""
import contextlib
import os
from collections.abc import Iterator

import pytest
import torch
from _util import assert_mx_equal, mixed

from gem_precision import _triton_quant as _tq
from gem_precision import to_mx, to_mx_2d_both, to_mx_reference

CAN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ELEMS = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_and_cols_bit_exact(dtype: torch.dtype, elem: torch.dtype, mode: str) -> None:
    x = mixed((48, 160), dtype, seed=hash((str(dtype), str(elem), mode)) % 1000).to(DEV)
    kw = dict(elem_dtype=elem, scale_mode=mode)
    assert_mx_equal(to_mx(x, backend="triton", **kw), to_mx_reference(x, **kw))  # type: ignore[arg-type]
    x0 = x[:32 * (x.shape[0] // 32)]
    assert_mx_equal(to_mx(x0, dim=0, backend="triton", **kw), to_mx_reference(x0, dim=0, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(1, 32), (1, 33), (31, 64), (33, 96), (70, 31), (0, 64), (5, 0)])
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_both_from_one_read_edge_shapes(shape: tuple[int, int], mode: str) -> None:
    x = mixed(shape, torch.bfloat16, seed=shape[0] * 100 + shape[1]).to(DEV)
    r, c = to_mx_2d_both(x, scale_mode=mode, backend="triton")
    assert_mx_equal(r, to_mx_reference(x, scale_mode=mode))
    assert_mx_equal(c, to_mx_reference(x.t(), scale_mode=mode))
    assert c.data.is_contiguous() and c.data.shape == (shape[1], shape[0])


def test_padding_strides_and_nd() -> None:
    x = mixed((6, 8, 40), torch.float32, seed=3).to(DEV)
    for dim in (-1, 0, 1):
        assert_mx_equal(to_mx(x, dim=dim, pad=True, backend="triton"), to_mx_reference(x, dim=dim))
    xt = mixed((64, 96), torch.bfloat16, seed=4).to(DEV).t()  # non-contiguous input
    assert_mx_equal(to_mx(xt, backend="triton"), to_mx_reference(xt))
    assert_mx_equal(to_mx(xt, dim=0, backend="triton"), to_mx_reference(xt, dim=0))
    for bs in (16, 64):
        assert_mx_equal(to_mx(xt, block_size=bs, backend="triton"), to_mx_reference(xt, block_size=bs))


def _one_tile(kind: str, tile: tuple[str, int, int, int]) -> Iterator[None]:
    """Makes `tile` the only candidate of `kind` (a fresh tile cache before and after)."""
    saved = _tq._TILES[kind]
    _tq._TILES[kind] = [tile]
    _tq._tile_cache.clear()
    try:
        yield
    finally:
        _tq._TILES[kind] = saved
        _tq._tile_cache.clear()


ALL_TILES = [(k, t) for k, ts in _tq._TILES.items() for t in ts]


@pytest.mark.parametrize("kind,tile", ALL_TILES, ids=[f"{k}-{'_'.join(map(str, t))}" for k, t in ALL_TILES])
def test_every_kernel_variant_and_tile_bit_exact(kind: str, tile: tuple[str, int, int, int]) -> None:
    # One shape that the tile divides (the mask-free EVEN paths) and one ragged shape.
    for i, shape in enumerate([(64, 1024), (45, 70)]):
        mode = ("floor", "rceil")[i]
        elem = (torch.float8_e4m3fn, torch.float8_e5m2)[i]
        x = mixed(shape, (torch.bfloat16, torch.float32)[i], seed=11 * i + len(kind)).to(DEV)
        kw = dict(elem_dtype=elem, scale_mode=mode)
        with contextlib.contextmanager(_one_tile)(kind, tile):
            if kind == "row":
                assert_mx_equal(to_mx(x, pad=True, backend="triton", **kw), to_mx_reference(x, **kw))  # type: ignore[arg-type]
            elif kind == "col":
                assert_mx_equal(to_mx(x, dim=0, pad=True, backend="triton", **kw), to_mx_reference(x, dim=0, **kw))  # type: ignore[arg-type]
            else:
                r, c = to_mx_2d_both(x, backend="triton", **kw)  # type: ignore[arg-type]
                assert_mx_equal(r, to_mx_reference(x, **kw))  # type: ignore[arg-type]
                assert_mx_equal(c, to_mx_reference(x.t(), **kw))  # type: ignore[arg-type]


def test_force_variant_restricts_candidates() -> None:
    x = mixed((64, 96), torch.bfloat16, seed=5).to(DEV)
    _tq._tile_cache.clear()
    try:
        for v in _tq.VARIANTS:
            _tq.FORCE_VARIANT["variant"] = v
            r, c = to_mx_2d_both(x, backend="triton")
            assert_mx_equal(c, to_mx_reference(x.t()))
            assert_mx_equal(to_mx(x, dim=0, backend="triton"), to_mx_reference(x, dim=0))
        used = {key[-1]: tile[0] for key, tile in _tq._tile_cache.items() if key[0] == "both"}
        assert used == {"v1": "v1", "v1e": "v1e", "loop": "v1"}  # "loop" has no dual cast
    finally:
        _tq.FORCE_VARIANT["variant"] = None
        _tq._tile_cache.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_large_bit_exact() -> None:
    # The tuner picks among all variants at this size; then every variant forced.
    for variant in (None, *_tq.VARIANTS):
        _tq.FORCE_VARIANT["variant"] = variant
        try:
            for mode in ("floor", "rceil"):
                x = mixed((4096, 2048), torch.bfloat16, seed=7).cuda()
                r, c = to_mx_2d_both(x, scale_mode=mode)
                assert_mx_equal(r, to_mx_reference(x, scale_mode=mode))
                assert_mx_equal(c, to_mx_reference(x.t(), scale_mode=mode))
                assert_mx_equal(to_mx(x, dim=0, scale_mode=mode), to_mx_reference(x, dim=0, scale_mode=mode))
        finally:
            _tq.FORCE_VARIANT["variant"] = None


def test_tile_cache_buckets_jagged_row_counts() -> None:
    """A new token count every step must not mean a new tile search every step."""
    _tq._tile_cache.clear()
    try:
        for rows in (33, 40, 64):  # one size class (33..64)
            x = torch.randn(rows, 64, device=DEV)
            assert_mx_equal(to_mx(x, backend="triton"), to_mx_reference(x))
        assert len([k for k in _tq._tile_cache if k[0] == "row"]) == 1
        to_mx(torch.randn(65, 64, device=DEV), backend="triton")  # the next class
        assert len([k for k in _tq._tile_cache if k[0] == "row"]) == 2
    finally:
        _tq._tile_cache.clear()
