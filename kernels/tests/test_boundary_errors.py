"""Issue #20's kernel faults at the public boundary: head dim 0 (was ZeroDivisionError) and
backend="triton" on CPU tensors without the interpreter (was Triton's "0 active drivers")."""
from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

import gem_kernels

Op = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


def _jfa(q: torch.Tensor, off: torch.Tensor, backend: str) -> torch.Tensor:
    n = int((off[1:] - off[:-1]).max())
    return gem_kernels.jagged_flash_attention(q, q, q, off, off, n, n, causal=True, backend=backend)


def _gdpa(q: torch.Tensor, off: torch.Tensor, backend: str) -> torch.Tensor:
    n = int((off[1:] - off[:-1]).max())
    return gem_kernels.generalized_dot_product_attention(q, q, q, off, off, n, n, activation="silu", backend=backend)


def _gdpa_softmax(q: torch.Tensor, off: torch.Tensor, backend: str) -> torch.Tensor:
    n = int((off[1:] - off[:-1]).max())
    return gem_kernels.generalized_dot_product_attention(q, q, q, off, off, n, n, activation="softmax",
                                                         backend=backend)


def _block(q: torch.Tensor, off: torch.Tensor, backend: str) -> torch.Tensor:
    n = int((off[1:] - off[:-1]).max())
    return gem_kernels.block_attention(q, q, q, off, n, block_size=16, backend=backend)


OPS = {"jfa": _jfa, "gdpa": _gdpa, "gdpa_softmax": _gdpa_softmax, "block": _block}


def _batch(d: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(1, 9, (3,))
    off = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return torch.randn(int(off[-1]), 2, d), off


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", ["reference", "auto", "triton"])
def test_head_dim_zero_names_the_rule(op: str, backend: str) -> None:
    q, off = _batch(0)
    with pytest.raises(ValueError, match=r"q.shape=\(\d+, 2, 0\): head dim D=0 must be >= 1"):
        OPS[op](q, off, backend)


@pytest.mark.parametrize("op", OPS)
def test_triton_on_cpu_without_interpreter_says_what_to_do(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, off = _batch(32)
    with pytest.raises(ValueError, match=r"backend='triton' needs CUDA tensors, got device cpu: .*TRITON_INTERPRET=1"
                                         r".*backend='reference'"):
        OPS[op](q, off, "triton")
    # "auto" on the CPU is the reference, and it still runs: the check only guards "triton"
    ref = OPS[op](q, off, "reference")
    assert torch.equal(OPS[op](q, off, "auto"), ref) and torch.isfinite(ref).all()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (set by Bazel)")
@pytest.mark.parametrize("op", ["jfa", "block"])
def test_triton_on_cpu_with_interpreter_still_runs(op: str) -> None:
    q, off = _batch(32)
    torch.testing.assert_close(OPS[op](q, off, "triton"), OPS[op](q, off, "reference"), rtol=2e-5, atol=2e-5)
