"""The Hopper bench's profile helper (`profile_linear`), on CPU: it must name where a linear's
fwd+bwd spends its time, largest first, so the GPU run of `--profile` can say what limits
fp8_block. (The timed rows need an SM90 GPU; without one the bench runs its emulation check.)"""
import torch
from torch import nn

from gem_precision import FP8BlockConfig, FP8BlockLinear
from gem_precision.bench import hopper


def test_profile_linear_names_the_matmuls_largest_first() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(256, 384)
    x = torch.randn(200, 256, requires_grad=True)
    dy = torch.randn(200, 384)
    rows = hopper.profile_linear(lin, x, dy, steps=2, top=50)
    assert rows and all(r["ms_per_step"] > 0 for r in rows)
    assert [r["ms_per_step"] for r in rows] == sorted((r["ms_per_step"] for r in rows), reverse=True)
    names = [r["name"] for r in rows]
    assert any("mm" in n for n in names), names  # the forward and backward GEMMs
    fp8 = FP8BlockLinear.from_linear(lin, FP8BlockConfig(quant="torch"))
    rows8 = hopper.profile_linear(fp8, x, dy, steps=1, top=3)
    assert len(rows8) == 3
