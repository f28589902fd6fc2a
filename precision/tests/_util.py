"""Shared test helpers: random data of mixed magnitudes and bitwise MXTensor equality."""
import torch

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
