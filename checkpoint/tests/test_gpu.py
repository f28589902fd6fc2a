"""CUDA state: pinned staging, snapshot semantics, CUDA RNG (runs only with a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gem_checkpoint import Checkpointer, RNGState

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_round_trip_pinned_staging(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()  # ~270 MB
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 4096, device="cuda")).sum().backward()
    optim.step()
    torch.cuda.manual_seed(123)
    state = {"model": model, "optim": optim, "rng": RNGState()}
    ckpt = Checkpointer(tmp_path)
    assert ckpt.prepare(state) > 3 * 4 * 4096 * 4096 * 4  # pinned ahead of the first save
    ckpt.save(1, state)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    expect = torch.rand(5, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # mutate while the write may still run
    ckpt.wait()
    # Tensors that came from the GPU are staged in pinned buffers; CPU-born ones (AdamW's
    # `step` counters, RNG byte states) are plain host copies.
    bufs = ckpt._stager._buffers
    from_gpu = [path for path, b in bufs.items() if "model" in path or "exp_avg" in path or "exp_avg_sq" in path]
    assert from_gpu and all(bufs[path].is_pinned() for path in from_gpu)
    assert all(not b.is_pinned() for path, b in bufs.items() if "step" in path)
    model2 = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    optim2 = torch.optim.AdamW(model2.parameters())
    torch.cuda.manual_seed(0)
    assert ckpt.load({"model": model2, "optim": optim2, "rng": RNGState()}) == 1
    assert all(torch.equal(v, snapshot[k]) for k, v in model2.state_dict().items())
    assert optim2.state_dict()["state"][0]["exp_avg"].is_cuda
    assert torch.equal(torch.rand(5, device="cuda"), expect)
