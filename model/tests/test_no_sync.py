"""A steady-state training step of the GEM model never waits on the GPU (issue 16, item 3).

GPU only (skipped without CUDA): after warm-up (Triton compilation, torch.compile's first
graphs), a few forward/backward/optimizer steps on fresh batches already on the device run
under `torch.cuda.set_sync_debug_mode("error")`, which raises on any synchronizing call
(`.item()`, `.tolist()`, `nonzero`, a blocking device→host copy, `bool(cuda_tensor)`, ...).
The model reads lengths only through host ints (`Batch.max_seq_len`) and tensor shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from _batch import FEATURES, make_batch
from gem_model import GEMModel, presets

CUDA = torch.cuda.is_available()


def _on_cuda(batch: Any) -> Any:
    fields = ("event_ids", "event_types", "timestamps", "seq_offsets", "dense", "domain", "labels")
    out = dataclasses.replace(batch, **{f: getattr(batch, f).cuda() for f in fields})
    out.sparse = type(batch.sparse)(
        {k: (j.values().cuda(), j.lengths().cuda()) for k, j in batch.sparse.to_dict().items()}
    )
    return out


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_training_steps_do_not_sync(compile: bool) -> None:
    torch.manual_seed(0)
    # The h200 preset's switches (GDPA FFN, hierarchical pooling, computation skip) at a
    # small width, so every kernel path of a real step runs.
    cfg = presets.h200(**FEATURES, num_layers=2, d_model=256, num_heads=2)
    model = GEMModel(cfg).cuda()
    if compile:
        gem_parallel = pytest.importorskip("gem_parallel")
        gem_parallel.parallelize(model, None, compile=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sizes = [(16, 300), (12, 500), (20, 200), (9, 650), (16, 400), (14, 350)]
    batches = [_on_cuda(make_batch(b, max_len=m, seed=i)) for i, (b, m) in enumerate(sizes)]

    def step(batch: Any) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.binary_cross_entropy_with_logits(model(batch), batch.labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for batch in batches[:3]:  # warm-up: Triton kernel compilation, the blocks' graphs
        step(batch)
    torch.cuda.synchronize()
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[3:]:
            losses.append(step(batch))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(torch.stack(losses)).all()
