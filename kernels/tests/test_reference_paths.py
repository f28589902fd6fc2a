"""The batched reference paths (padded; length-bucketed on CPU) equal the per-sequence spec.

`backend="reference"` runs `jfa_padded` / `gdpa_padded`, bucketed by length on CPU when the
batch has more than `BUCKET` sequences; `jfa_reference` / `gdpa_reference` loop over
sequences and are the specification. Forward and all three gradients, fp32.
"""
from __future__ import annotations

import pytest
import torch

import gem_kernels
from gem_kernels._gdpa import gdpa_reference
from gem_kernels._jfa_reference import BUCKET, jfa_reference


def _batch(b: int, gen: torch.Generator, cross: bool) -> tuple[torch.Tensor, ...]:
    lq = torch.randint(0, 40, (b,), generator=gen)
    lq[:3] = torch.tensor([0, 1, 17])
    lk = torch.randint(0, 12, (b,), generator=gen) if cross else lq.clone()
    qo = torch.cat([torch.zeros(1, dtype=torch.long), lq.cumsum(0)])
    ko = torch.cat([torch.zeros(1, dtype=torch.long), lk.cumsum(0)])
    h, d = 2, 8
    q = torch.randn(int(qo[-1]), h, d, generator=gen, requires_grad=True)
    k = torch.randn(int(ko[-1]), h, d, generator=gen, requires_grad=True)
    v = torch.randn(int(ko[-1]), h, d, generator=gen, requires_grad=True)
    return q, k, v, qo, ko, lq, lk


@pytest.mark.parametrize("b", [5, BUCKET + 1, 3 * BUCKET + 5])
@pytest.mark.parametrize("activation", ["softmax", "silu", "relu2"])
@pytest.mark.parametrize("causal,window,cross", [(False, None, False), (True, None, False),
                                                 (True, 7, False), (False, 3, True)])
def test_reference_backend_equals_spec(b: int, activation: str, causal: bool, window: int | None,
                                       cross: bool) -> None:
    gen = torch.Generator().manual_seed(b * 31 + len(activation))
    q, k, v, qo, ko, lq, lk = _batch(b, gen, cross)
    mq, mk = int(lq.max()), max(int(lk.max()), 1)
    got = gem_kernels.generalized_dot_product_attention(
        q, k, v, qo, ko, mq, mk, activation=activation, causal=causal, window=window,
        backend="reference")
    scale = 1.0 / 8 ** 0.5
    if activation == "softmax":
        want = jfa_reference(q, k, v, qo, ko, causal=causal, window=window, scale=scale)
    else:
        want = gdpa_reference(q, k, v, qo, ko, activation=activation, scale=scale, divisor=float(mk),
                              causal=causal, window=window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(got)
    ga = torch.autograd.grad(got, (q, k, v), g)
    gb = torch.autograd.grad(want, (q, k, v), g)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
