"""MXFP8Linear (autograd), recipes, convert_to_mxfp8 and a small training-parity run."""
import os
import time

import pytest
import torch
from torch import nn

from gem_precision import (
    MXFP8Linear,
    MXLinearConfig,
    MXRecipe,
    convert_to_mxfp8,
    mx_recipe_config,
    to_mx_reference,
)

from _util import parity_mlp, parity_train

CAN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _q(t: torch.Tensor, mode: str = "floor") -> torch.Tensor:
    """q() of the issue: MX-quantize along the last dim and dequantize (fp32)."""
    return to_mx_reference(t.float(), scale_mode=mode, dim=-1).dequantize()  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_emulation_follows_the_formulas(mode: str) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    m = MXFP8Linear.from_linear(lin, MXLinearConfig(scale_mode=mode, backend="reference"))  # type: ignore[arg-type]
    x = torch.randn(2, 32, 64, requires_grad=True)
    dy = torch.randn(2, 32, 96).to(torch.bfloat16)
    y = m(x)
    y.backward(dy)
    x2, dy2, w = x.detach().reshape(-1, 64), dy.reshape(-1, 96), lin.weight.detach()
    y_ref = (_q(x2, mode) @ _q(w, mode).t() + lin.bias.detach()).to(torch.bfloat16)
    dx_ref = (_q(dy2, mode) @ _q(w.t(), mode).t()).to(torch.bfloat16)
    dw_ref = _q(dy2.t(), mode) @ _q(x2.t(), mode).t()
    assert y.dtype == torch.float32 and y.shape == (2, 32, 96)  # x's dtype (no autocast): nn.Linear's
    assert torch.equal(y.reshape(-1, 96), y_ref.float())  # the GEMM's bf16 values, cast
    assert torch.equal(x.grad.reshape(-1, 64), dx_ref.float())  # type: ignore[union-attr]
    assert torch.allclose(lin.weight.grad, dw_ref, rtol=1e-6, atol=1e-6)  # type: ignore[arg-type]
    assert torch.allclose(lin.bias.grad, dy2.float().sum(0))  # type: ignore[arg-type]


def test_close_to_bf16_linear_and_wgrad_bf16() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(128, 64)
    x = torch.randn(96, 128, requires_grad=True)
    dy = torch.randn(96, 64)
    ref_y = lin(x)
    ref_y.backward(dy)
    ref = (ref_y.detach(), x.grad.clone(), lin.weight.grad.clone())  # type: ignore[union-attr]
    for cfg in (mx_recipe_config(MXRecipe.RCEIL), mx_recipe_config("mxfp8_rceil_wgrad_bf16")):
        x.grad = None
        lin.zero_grad()
        y = MXFP8Linear.from_linear(lin, cfg)(x)
        y.backward(dy)
        got = (y.float(), x.grad, lin.weight.grad)
        for g, r in zip(got, ref):
            assert (g - r).norm() / r.norm() < 0.1  # E4M3: ~3-6 % relative error
        if cfg.wgrad_bf16:  # dW in bf16: much closer than MXFP8
            assert (lin.weight.grad - ref[2]).norm() / ref[2].norm() < 0.01  # type: ignore[operator]


@pytest.mark.skipif(not CAN_TRITON, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("tokens", [64, 45, 1])
def test_triton_path_matches_emulation(tokens: int) -> None:
    torch.manual_seed(tokens)
    lin = nn.Linear(64, 96, device=DEV)
    x = torch.randn(tokens, 64, device=DEV, requires_grad=True)
    dy = torch.randn(tokens, 96, device=DEV).to(torch.bfloat16)
    outs = []
    for be in ("triton", "reference"):
        x.grad = None
        lin.zero_grad()
        y = MXFP8Linear.from_linear(lin, MXLinearConfig(scale_mode="rceil", backend=be))(x)  # type: ignore[arg-type]
        y.backward(dy)
        outs.append((y.float(), x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()))  # type: ignore[union-attr]
    for t, r in zip(*outs):
        # Same quantized operands; only fp32 summation order and one bf16 rounding differ.
        assert torch.allclose(t, r, rtol=2**-7, atol=1e-3 * r.abs().max().item()), (t - r).abs().max()


def test_dims_and_input_checks() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        MXFP8Linear(40, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        MXFP8Linear.from_linear(nn.Linear(64, 48))
    m = MXFP8Linear(64, 32, bias=False)
    with pytest.raises(ValueError, match="in_features"):
        m(torch.randn(3, 32))
    y = m(torch.randn(0, 64))
    assert y.shape == (0, 32)
    with pytest.raises(ValueError, match="recipe"):
        mx_recipe_config("fp4")


def test_convert_to_mxfp8_filter() -> None:
    model = nn.Sequential()
    model.add_module("proj", nn.Linear(2048, 1024))
    model.add_module("small", nn.Linear(128, 2048))
    model.add_module("odd", nn.Linear(1024, 1000))
    block = nn.Sequential()
    block.add_module("ffn", nn.Linear(1024, 4096))
    block.add_module("head", nn.Linear(4096, 1024))
    model.add_module("block", block)
    w = model.proj.weight
    names = convert_to_mxfp8(model, MXRecipe.FLOOR, keep_bf16=["*head"])
    assert names == ["proj", "block.ffn"]
    assert isinstance(model.proj, MXFP8Linear) and model.proj.weight is w
    assert model.proj.config.scale_mode == "floor"
    assert type(model.small) is nn.Linear and type(model.odd) is nn.Linear and type(block.head) is nn.Linear
    assert convert_to_mxfp8(model, keep_bf16=["*head"]) == []  # idempotent
    custom = convert_to_mxfp8(model, "mxfp8_rceil", module_filter=lambda n, m: n.endswith("head"))
    assert custom == ["block.head"] and block.head.config.scale_mode == "rceil"  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="nn.Module"):
        convert_to_mxfp8("model")  # type: ignore[arg-type]


def _mlp(seed: int) -> nn.Module:
    return parity_mlp(seed, (32, 64, 64, 32))


def _train(model: nn.Module, steps: int) -> float:
    return parity_train(model, steps, d_in=32, d_out=32, batch=64, lr=1e-2, teacher_div=8)


def test_training_parity_bf16_vs_mxfp8() -> None:
    # The recommended recipe on a small MLP: hidden layers MXFP8, the output layer ("4", the
    # sensitive last layer) kept bf16; the same data, seed and optimizer as the bf16 run.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny GEMMs: threads only add contention on a shared CPU
    try:
        t0 = time.time()
        steps = 300
        base = _train(_mlp(0), steps=steps)
        mx = _mlp(0)
        assert convert_to_mxfp8(mx, MXRecipe.RCEIL, min_features=32, keep_bf16=["4"]) == ["0", "2"]
        loss_mx = _train(mx, steps=steps)
        assert base < 0.5  # it learned (initial loss ~1.0, noise floor 0.36)
        assert abs(loss_mx - base) / base < 0.01, (loss_mx, base)
        assert time.time() - t0 < 40
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_block"])
def test_output_dtype_is_nn_linears(recipe: str) -> None:
    """A converted linear returns what nn.Linear would: x's dtype without autocast (fp32 or
    bf16), the autocast dtype under autocast; the values are the recipe's bf16 GEMM output, and
    the gradients reach x and the weights in their own dtypes. (Before gem-precision 0.3.7 the
    output was bf16 whatever x was, so a converted fp32 model fed bf16 to its next layers.)"""
    from gem_precision import FP8BlockConfig, FP8BlockLinear

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    lin = nn.Linear(128, 256)
    m: nn.Module = (MXFP8Linear.from_linear(lin, MXLinearConfig(backend="reference")) if recipe == "mxfp8"
                    else FP8BlockLinear.from_linear(lin, FP8BlockConfig(backend="reference")))
    x = torch.randn(3, 40, 128, generator=g)
    cases = [(x, False, torch.float32), (x.to(torch.bfloat16), False, torch.bfloat16), (x, True, torch.bfloat16)]
    outs = []
    for inp, autocast, want in cases:
        inp = inp.detach().requires_grad_()
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(inp)
        assert y.dtype == want, (inp.dtype, autocast, y.dtype)
        y.float().square().sum().backward()
        assert inp.grad is not None and inp.grad.dtype == inp.dtype and torch.isfinite(inp.grad).all()
        assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32
        outs.append(y.detach())
    # fp32 x with and without autocast: the same codes, the same bf16 GEMM output, one cast apart
    assert torch.equal(outs[0], outs[2].float())
