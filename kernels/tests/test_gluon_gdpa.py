"""GDPA's warp-specialized Gluon forward (`_gluon_gdpa`) against the Triton forward.

The kernel runs only on a Hopper GPU (Gluon has no CPU interpreter): the GPU tests compare its
output with `_gdpa.gdpa_forward_triton`'s on the same inputs at real sizes (D 64/128, full and
causal, each activation, cross-attention with empty sides, a NaN neighbour). On any machine: the
launcher's rules (tests here) and the sm_90a build (`test_sm90_builds.py`).
"""

from __future__ import annotations

import math

import pytest
import torch

from gem_kernels import _gluon_gdpa, _gluon_jfa
from gem_kernels._gdpa import gdpa_forward_triton

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] == 9
needs_hopper = pytest.mark.skipif(not (HOPPER and _gluon_jfa.HAVE_GLUON), reason="Gluon kernels need a Hopper GPU")
DEVICE = "cuda" if CUDA else "cpu"
WS_TILES = [(128, 128, 12, 3, True), (128, 128, 12, 3, True, True), (128, 64, 12, 4, True, True)]


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def test_launcher_rules_name_the_argument() -> None:
    q = torch.zeros(300, 2, 128, dtype=torch.bfloat16)
    off = torch.tensor([0, 100, 300])
    with pytest.raises(ValueError, match=r"activation='swish': must be one of"):
        _gluon_gdpa.forward(q, q, q, off, off, 200, "swish", 0.1, 1.0, True)
    with pytest.raises(ValueError, match=r"tiles=\(128, 128, 8, 3\): GDPA's Gluon forward is the warp-specialized"):
        _gluon_gdpa.forward(q, q, q, off, off, 200, "silu", 0.1, 1.0, True, tiles=(128, 128, 8, 3))
    with pytest.raises(ValueError, match=r"needs BLOCK_M 128"):
        _gluon_gdpa.forward(q, q, q, off, off, 200, "silu", 0.1, 1.0, True, tiles=(64, 64, 12, 3, True))
    with pytest.raises(ValueError, match=r"divisor=0: must be > 0"):
        _gluon_gdpa.forward(q, q, q, off, off, 200, "silu", 0.1, 0, True)
    assert q.abs().max() == 0
    assert set(_gluon_gdpa.ACTIVATIONS) == set(__import__("gem_kernels._gdpa", fromlist=["ACTIVATIONS"]).ACTIVATIONS)


def _both(lq: list[int], lk: list[int], h: int, d: int, causal: bool, act: str, seed: int,
          tiles: tuple[int | bool, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)
    q, k, v = (torch.randn(t, h, d, generator=g, device=DEVICE).bfloat16() for t in (sum(lq), sum(lk), sum(lk)))
    scale, div = 1.0 / math.sqrt(d), float(max(lk))
    got = _gluon_gdpa.forward(q, k, v, qo, ko, max(lq), act, scale, div, causal, tiles)
    want = gdpa_forward_triton(q, k, v, qo, ko, max(lq), max(lk), act, scale, div, causal, None)
    return got, want


def _agree(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    err = float((got.float() - want.float()).abs().max()) / max(1e-6, float(want.float().abs().max()))
    assert err <= 1e-2, err


@needs_hopper
@pytest.mark.parametrize("tiles", WS_TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_matches_triton_forward(tiles: tuple[int | bool, ...], causal: bool, d: int) -> None:
    g = torch.Generator().manual_seed(d + causal)
    lengths = torch.randint(0, 1500, (10,), generator=g).tolist() + [0, 1, 63, 64, 65, 127, 128, 129]
    _agree(*_both(lengths, lengths, 4, d, causal, "silu", seed=d, tiles=tiles))


@needs_hopper
@pytest.mark.parametrize("act", _gluon_gdpa.ACTIVATIONS)
def test_gpu_every_activation(act: str) -> None:
    _agree(*_both([300, 700, 129, 5], [300, 700, 129, 5], 2, 128, True, act, seed=3, tiles=None))


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_cross_attention_and_empty_sides(causal: bool) -> None:
    lq = [0, 5, 700, 64, 300, 129, 7]
    lk = [9, 0, 650, 200, 40, 129, 0]
    got, want = _both(lq, lk, 2, 128, causal, "silu", seed=5, tiles=None)
    _agree(got, want)
    assert got[0:5].abs().max() == 0  # sample 1 has no keys


@needs_hopper
def test_gpu_nan_neighbour_does_not_leak() -> None:
    g = torch.Generator(device=DEVICE).manual_seed(8)
    q, k, v = (torch.randn(400, 2, 128, generator=g, device=DEVICE).bfloat16() for _ in range(3))
    off = _offsets([100, 300])
    clean = _gluon_gdpa.forward(q, k, v, off, off, 300, "silu", 0.1, 300.0, False)
    k[100:], v[100:] = float("nan"), float("nan")
    dirty = _gluon_gdpa.forward(q, k, v, off, off, 300, "silu", 0.1, 300.0, False)
    assert torch.isfinite(dirty[:100]).all() and torch.equal(dirty[:100], clean[:100])
