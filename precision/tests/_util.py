"""Shared test helpers: random data of mixed magnitudes, bitwise MXTensor equality, the
small-MLP training run the parity tests compare recipes on, and one linear's fwd+bwd
(compiled over several token counts for the recompile tests)."""
import torch
from torch import nn

from gem_precision import MXTensor


def mixed(shape: tuple[int, ...], dtype: torch.dtype, seed: int, specials: bool = True) -> torch.Tensor:
    """Normal values times 2^U(-40, 40) per element, 5 % zeros, subnormals, a few NaN/Inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    x = torch.where(torch.rand(shape, generator=g) < 0.05, torch.zeros_like(x), x)
    if specials and x.numel() >= 64:
        flat = x.view(-1)
        idx = torch.randint(0, flat.numel(), (4,), generator=g)
        flat[idx[0]] = float("nan")
        flat[idx[1]] = float("inf")
        flat[idx[2]] = -float("inf")
        flat[idx[3]] = 2.0**-130  # subnormal in fp32 / bf16
    return x.to(dtype)


def assert_mx_equal(a: MXTensor, b: MXTensor) -> None:
    assert a.data.shape == b.data.shape and a.scale.shape == b.scale.shape, (a.data.shape, b.data.shape)
    assert a.elem_dtype == b.elem_dtype and a.dim == b.dim and a.block_size == b.block_size
    assert torch.equal(a.scale, b.scale)
    da, db = a.data.view(torch.uint8), b.data.view(torch.uint8)
    bad = (da != db).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} element codes differ, first at {bad[0].tolist()}"


def parity_mlp(seed: int, widths: tuple[int, int, int, int]) -> nn.Module:
    """Linear-GELU-Linear-GELU-Linear through `widths` (in, hidden, hidden, out), seeded."""
    torch.manual_seed(seed)
    a, b, c, d = widths
    return nn.Sequential(nn.Linear(a, b), nn.GELU(), nn.Linear(b, c), nn.GELU(), nn.Linear(c, d))


def parity_train(model: nn.Module, steps: int, *, d_in: int, d_out: int, batch: int, lr: float,
                 teacher_div: float) -> float:
    """bf16-autocast AdamW + cosine on planted tanh regression (same data for every model);
    the recipe's layers do their own casts. Returns the mean of the last 25 losses."""
    g = torch.Generator().manual_seed(123)
    teacher = torch.randn(d_in, d_out, generator=g) / teacher_div
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, d_in, generator=g)
        target = torch.tanh(x @ teacher) * 2 + 0.6 * torch.randn(batch, d_out, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = (out.float() - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return sum(losses[-25:]) / 25


def fwd_bwd(lin: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    """[y, dx, then each parameter's gradient] of one fwd+bwd of `lin` at x with output grad dy."""
    xx = x.clone().requires_grad_()
    lin.zero_grad()
    y = lin(xx)
    y.backward(dy)
    return [y, xx.grad] + [p.grad.clone() for p in lin.parameters()]  # type: ignore[list-item,union-attr]


def compiles_over_token_counts(config: object, seed: int) -> int:
    """An FP8BlockLinear(256 -> 384, config) compiled (aot_eager, dynamic, whole graph) and run
    at five token counts on both sides of multiples of 128: every output and gradient equals
    the eager module's, bit for bit. Returns how many graphs dynamo compiled (1: no guard on
    the count; a guard on the count mod 128 recompiled the h200 blocks ~90 s each)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from gem_precision import FP8BlockLinear

    torch._dynamo.reset()
    torch.manual_seed(seed)
    lin = FP8BlockLinear(256, 384, config=config)  # type: ignore[arg-type]
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lin, backend=cnt, dynamic=True, fullgraph=True)
    for m in (200, 256, 300, 384, 131):  # (one 128-row block would specialize the emulation on 1)
        x = torch.randn(m, 256)
        dy = torch.randn(m, 384, dtype=torch.bfloat16)
        for a, b in zip(fwd_bwd(f, x, dy), fwd_bwd(lin, x, dy)):  # type: ignore[arg-type]
            assert torch.equal(a, b)
    return int(cnt.frame_count)
