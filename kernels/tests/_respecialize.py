"""The GPU check shared by the ops that launch through gem_kernels._launch.CachedLaunch: the
cached launch must pick a new binary whenever Triton would (a misaligned view, another
dtype, another head count), and reuse the kept one otherwise."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gem_kernels._launch import CachedLaunch

# (dtype, heads, element shift of q/k/v's start): the second repeats the first (no new
# binary), the third is misaligned (a binary of its own), the last returns to the first.
CASES = ((torch.bfloat16, 4, 0), (torch.bfloat16, 4, 0), (torch.bfloat16, 4, 1),
         (torch.float16, 4, 0), (torch.bfloat16, 2, 3), (torch.bfloat16, 4, 0))


def check_respecializes(launch: CachedLaunch, rows: int, device: str, seed: int,
                        run_and_check: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> None:
    """Calls `run_and_check(q, k, v)` on `[rows, H, 64]` random inputs of every case of CASES
    (it launches through `launch` and compares with a reference), then checks how the
    launch's kept binaries grew."""
    g = torch.Generator(device=device).manual_seed(seed)
    sizes = []
    for dtype, h, shift in CASES:
        base = [torch.randn(rows * h * 64 + shift, generator=g, device=device).to(dtype) for _ in range(3)]
        q, k, v = (x[shift:].view(rows, h, 64) for x in base)
        assert (q.data_ptr() % 16 == 0) == (shift == 0)
        before = launch.cache_size()
        run_and_check(q, k, v)
        sizes.append(launch.cache_size())
        assert sizes[-1] >= before
    assert sizes[1] == sizes[0]  # the same specialization again: the kept kernel, no new entry
    assert sizes[2] == sizes[1] + 1  # the misaligned view: a binary of its own
    assert sizes[5] == sizes[4]  # back to the first specialization
