"""torch.library custom ops (gem_precision::quantize / quantize_both / mx_mm) and torch.compile."""
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _util import assert_mx_equal, mixed
from torch import nn

from gem_precision import MXFP8Linear, MXLinearConfig, MXRecipe, convert_to_mxfp8, mx_mm, to_mx, to_mx_2d_both

CAN_TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["reference"] + (["triton"] if CAN_TRITON else [])
ops = torch.ops.gem_precision
U8 = torch.uint8


def _opcheck(op: Any, args: tuple[Any, ...]) -> None:
    res = torch.library.opcheck(op, args)
    assert set(res.values()) == {"SUCCESS"}, res


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_quantize(backend: str) -> None:
    x = mixed((64, 96), torch.bfloat16, seed=1).to(DEV)
    for dim, mode, elem in ((1, "floor", torch.float8_e4m3fn), (0, "rceil", torch.float8_e5m2)):
        _opcheck(ops.quantize.default, (x, elem, 32, dim, mode, backend))
    x3 = mixed((3, 40, 64), torch.float32, seed=2).to(DEV)  # a middle dim, padded (40 = 32 + 8)
    _opcheck(ops.quantize.default, (x3, torch.float8_e4m3fn, 32, 1, "rceil", backend))
    _opcheck(ops.quantize_both.default, (mixed((40, 70), torch.float32, seed=3).to(DEV), torch.float8_e4m3fn, "floor", backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_mx_mm(backend: str) -> None:
    a = to_mx(torch.randn(40, 96, device=DEV))
    b = to_mx(torch.randn(24, 96, device=DEV), elem_dtype=torch.float8_e5m2)
    for out_dtype, bias in ((torch.bfloat16, torch.randn(24, device=DEV)), (torch.float32, None)):
        _opcheck(ops.mx_mm.default, (a.data.view(U8), a.scale, a.elem_dtype, b.data.view(U8), b.scale, b.elem_dtype,
                                     out_dtype, bias, backend))


def test_public_functions_compile_fullgraph() -> None:
    x = mixed((64, 96), torch.float32, seed=4, specials=False)
    w = torch.randn(32, 96)

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q0 = to_mx(x, dim=0, scale_mode="rceil")
        r, c = to_mx_2d_both(x)
        y = mx_mm(r, to_mx(w), out_dtype=torch.float32)
        return q0.data.view(U8), q0.scale, c.data.view(U8), c.scale, y

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    for g, e in zip(got, f(x, w)):
        assert torch.equal(g, e)


def _recording_backend(graphs: list[torch.fx.GraphModule]) -> Any:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def rec(gm: torch.fx.GraphModule, _: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return make_boxed_func(gm.forward)  # type: ignore[no-any-return]

    return aot_autograd(fw_compiler=rec, bw_compiler=rec)


def _count(gm: torch.fx.GraphModule, name: str) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target))


def _model(seed: int, recipe: MXRecipe, keep_last: bool) -> nn.Module:
    """3-layer MLP, MXFP8 hidden layers; the last stays nn.Linear if keep_last (the tests run
    that one under autocast)."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64), nn.GELU(), nn.Linear(64, 32))
    names = convert_to_mxfp8(m, recipe, min_features=32, keep_bf16=["4"] if keep_last else [])
    assert names == (["0", "2"] if keep_last else ["0", "2", "4"])
    return m


def _step(m: nn.Module, x: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = m(x)
    y.float().square().mean().backward()
    grads = [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]
    return y.detach(), grads


@pytest.mark.parametrize("recipe,autocast", [(MXRecipe.RCEIL, False), (MXRecipe.FLOOR, True), (MXRecipe.RCEIL_WGRAD_BF16, True)])
def test_compiled_model_equals_eager(recipe: MXRecipe, autocast: bool) -> None:
    # One graph (fullgraph) whose forward and backward run the custom ops; bit-identical to eager.
    x = torch.randn(2, 24, 64)  # 48 tokens: the last block along M is padded
    eager = _model(0, recipe, keep_last=autocast)
    graphs: list[torch.fx.GraphModule] = []
    compiled = torch.compile(_model(0, recipe, keep_last=autocast), fullgraph=True, backend=_recording_backend(graphs))
    ye, ge = _step(eager, x, autocast)
    yc, gc = _step(compiled, x, autocast)
    assert torch.equal(ye, yc)
    for a, b in zip(ge, gc):
        assert torch.equal(a, b)
    fw, bw = graphs
    n_mx = 2 if autocast else 3
    # Forward: one GEMM per MXFP8 layer; backward: dX and (unless wgrad_bf16) dW per layer,
    # less the first layer's dX (its input needs no gradient).
    n_bw = (n_mx - 1) + (0 if recipe is MXRecipe.RCEIL_WGRAD_BF16 else n_mx)
    assert _count(fw, "gem_precision.mx_mm") == n_mx and _count(bw, "gem_precision.mx_mm") == n_bw
    n_bw_q = n_mx - 1 if recipe is MXRecipe.RCEIL_WGRAD_BF16 else n_mx  # dY casts (none for layer 0 then)
    assert _count(fw, "gem_precision.quantize") == 2 * n_mx and _count(bw, "gem_precision.quantize") == n_bw_q


def test_compiled_inductor_close_to_eager() -> None:
    # Equal forward. In the backward, inductor computes the GELU gradient on the bf16 layer
    # outputs in fp32 and rounds once, eager rounds in bf16: a layer's dY may differ by one bf16
    # rounding per element. So each gradient is bounded by that rounding carried through its sum
    # (not by its own size: a bias gradient near zero is a sum with cancellation).
    x = torch.randn(48, 64)
    eager, compiled = _model(1, MXRecipe.RCEIL, False), torch.compile(_model(1, MXRecipe.RCEIL, False), fullgraph=True)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # eager (input, output) of each layer

    def keep(_: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        out.retain_grad()
        seen.append((args[0], out))

    for lin in eager[::2]:
        lin.register_forward_hook(keep)
    ye, ge = _step(eager, x, False)
    yc, gc = _step(compiled, x, False)
    assert torch.equal(ye, yc)
    for i, (inp, out) in enumerate(seen):
        dy = out.grad.float().abs()  # type: ignore[union-attr]
        # dW: dY enters the MXFP8 GEMM as e4m3 codes, so one bf16 rounding of dY moves a term by at
        # most one e4m3 rounding (2^-3 relative); db: an fp32 sum of dY, one bf16 rounding (2^-8).
        for got, want, bound, name in ((gc[2 * i], ge[2 * i], 2**-3 * dy.T @ inp.detach().float().abs(), "weight"),
                                       (gc[2 * i + 1], ge[2 * i + 1], 2**-8 * dy.sum(0), "bias")):
            err = (got - want).abs()
            assert bool((err <= bound).all()), f"layer {2 * i} {name}: error {err.max():.3g} over its bound"


def test_linear_dynamic_batch() -> None:
    lin = MXFP8Linear(64, 32, config=MXLinearConfig(scale_mode="rceil"))
    c = torch.compile(lin, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (5, 33, 70):
        x = torch.randn(n, 64)
        assert torch.equal(c(x), lin(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_compiled_model_runs_triton_ops() -> None:
    # On CUDA the custom ops run the Triton kernels; the compiled graph calls the same ones.
    x = torch.randn(4, 256, 512, device="cuda")

    def build() -> nn.Module:
        torch.manual_seed(3)
        m = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).cuda()
        convert_to_mxfp8(m, MXRecipe.RCEIL, min_features=512)
        return m

    eager, compiled = build(), torch.compile(build(), fullgraph=True, backend="aot_eager")
    ys = []
    for m in (eager, compiled):
        y = m(x)
        y.float().square().mean().backward()
        ys.append((y.detach(), [p.grad for p in m.parameters()]))
    assert torch.equal(ys[0][0], ys[1][0])
    for a, b in zip(ys[0][1], ys[1][1]):
        assert torch.equal(a, b)  # type: ignore[arg-type]
