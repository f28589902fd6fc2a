"""`forward_slice(x, start, stop)`: a converted linear's output features `start:stop`,
computed from its weight rows `start:stop` alone. gem_model's rows-only last layer uses it to
project q for a few rows and k/v for every row from one fused q/k/v weight."""

import pytest
import torch
from torch import nn

from gem_precision import convert

RECIPES = ["fp8_block", "fp8_block_wgrad_bf16", "mxfp8_rceil", "mxfp8_floor"]


def _converted(recipe: str, d_in: int, d_out: int) -> nn.Linear:
    seq = nn.Sequential(nn.Linear(d_in, d_out))
    assert convert(seq, recipe, min_features=1) == ["0"]
    lin = seq[0]
    assert isinstance(lin, nn.Linear) and type(lin) is not nn.Linear
    return lin


def _run(lin: nn.Linear, x: torch.Tensor, dy: torch.Tensor, fn) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    lin.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_()
    y = fn(xg)
    (y.float() * dy).sum().backward()
    assert xg.grad is not None and lin.weight.grad is not None and lin.bias is not None and lin.bias.grad is not None
    return y.detach(), xg.grad, lin.weight.grad.clone(), lin.bias.grad.clone()


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("tokens", [64, 200])
def test_forward_slice_equals_the_full_forwards_features(recipe: str, tokens: int) -> None:
    """Output, input gradient and weight/bias gradients of a slice equal those of the full
    forward read at the same features (the slice's weight blocks, so its codes and scales,
    are the full weight's); the weight rows outside the slice get no gradient."""
    d_in, d_out = 256, 384
    lin = _converted(recipe, d_in, d_out)
    block = 128 if recipe.startswith("fp8_block") else 32
    start, stop = block, d_out - (128 if block == 128 else 64)  # (128, 256) / (32, 320)
    x, dy = torch.randn(tokens, d_in), torch.randn(tokens, stop - start)
    got = _run(lin, x, dy, lambda xg: lin.forward_slice(xg, start, stop))  # type: ignore[operator]
    want = _run(lin, x, dy, lambda xg: lin(xg)[:, start:stop])
    tol = dict(rtol=2.0**-7, atol=1e-5)  # bf16 outputs: one rounding step at most
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    for g, w in zip(got[2:], want[2:]):
        torch.testing.assert_close(g, w, **tol)
        assert g[:start].abs().max() == 0 and g[stop:].abs().max() == 0
        assert g[start:stop].abs().max() > 0
    # against the bf16 linear on the same weights: the slice is the right features
    with torch.no_grad():
        ref = nn.functional.linear(x, lin.weight[start:stop], lin.bias[start:stop])
    assert float((got[0].float() - ref).norm() / ref.norm()) < 0.08


@pytest.mark.parametrize("recipe", ["fp8_block", "mxfp8_rceil"])
def test_forward_slice_bad_bounds_name_the_argument(recipe: str) -> None:
    lin = _converted(recipe, 128, 256)
    block = 128 if recipe == "fp8_block" else 32
    x = torch.randn(4, 128)
    with pytest.raises(ValueError, match=f"start=16 must be a multiple of {block}"):
        lin.forward_slice(x, 16, 128)  # type: ignore[operator]
    with pytest.raises(ValueError, match=f"stop=200 must be a multiple of {block}"):
        lin.forward_slice(x, 0, 200)  # type: ignore[operator]
    with pytest.raises(ValueError, match="0 <= start < stop <= out_features=256"):
        lin.forward_slice(x, 128, 128)  # type: ignore[operator]
    with pytest.raises(ValueError, match="0 <= start < stop <= out_features=256"):
        lin.forward_slice(x, 0, 384)  # type: ignore[operator]
    with pytest.raises(TypeError, match="start=0.0 must be an int"):
        lin.forward_slice(x, 0.0, 128)  # type: ignore[operator]
    with pytest.raises(ValueError, match="must end in in_features=128"):
        lin.forward_slice(torch.randn(4, 64), 0, 128)  # type: ignore[operator]


SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) GPU")
@pytest.mark.parametrize("part", [(0, 1024), (1024, 3072)])
def test_gpu_forward_slice_at_the_h200_layers_size(part: tuple[int, int]) -> None:
    """cuBLAS's blockwise GEMM at the h200 model's q / k-v split of a 1024 -> 3072 `wqkv`,
    eager and compiled: a slice equals the full forward's features (output, dX, dW) to one
    bf16 rounding; each cuBLAS call rounds once, in its own order."""
    start, stop = part
    lin = _converted("fp8_block", 1024, 3072).cuda()
    x = torch.randn(4000, 1024, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4000, stop - start, device="cuda")
    want = _run(lin, x, dy, lambda xg: lin(xg)[:, start:stop])
    for fn in (lin.forward_slice, torch.compile(lin.forward_slice, fullgraph=True)):
        got = _run(lin, x, dy, lambda xg: fn(xg, start, stop))  # noqa: B023
        for a, b in zip(got, want):
            assert float((a.float() - b.float()).norm() / b.float().norm()) < 2.0**-8
