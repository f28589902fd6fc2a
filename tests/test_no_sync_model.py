"""A steady-state training step of the GEM model never waits on the GPU (issue 16, item 3).

GPU only (skipped without CUDA): after warm-up (Triton compilation, torch.compile's first
graphs), a few forward/backward/optimizer steps on fresh batches already on the device run
under `torch.cuda.set_sync_debug_mode("error")`, which raises on any synchronizing call
(`.item()`, `.tolist()`, `nonzero`, a blocking device→host copy, `bool(cuda_tensor)`, ...).
The model reads lengths only through host ints (`Batch.max_seq_len`) and tensor shapes.
"""

from __future__ import annotations

from typing import Any

import gem_parallel
import pytest
import torch
import torch.nn.functional as F

from gem_data import SyntheticSource, presets as data_presets
from gem_model import GEMModel, presets

# In tests/, not model/tests: the compiled case goes through gem_parallel.parallelize, and the
# model package may not depend on gem_parallel (dependency direction model -> kernels).
CUDA = torch.cuda.is_available()
_DATA = data_presets.tiny(seq_len_mean=300.0, seq_len_cap=700)


def _batch(b: int, seed: int) -> Any:
    """A planted-task block of b samples on the GPU (lengths differ from block to block)."""
    return SyntheticSource(_DATA, block_size=b).batch(seed, sparse_kind="native").to("cuda")


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("compile,merged", [(False, False), (True, False), (True, True)],
                         ids=["eager", "compiled", "compiled-merged_stream_reads"])
def test_training_steps_do_not_sync(compile: bool, merged: bool) -> None:
    torch.manual_seed(0)
    # The h200 preset's switches (GDPA FFN, hierarchical pooling, computation skip) at a
    # small width, so every kernel path of a real step runs.
    cfg = presets.h200(**presets.feature_sizes(_DATA), num_layers=2, d_model=256, num_heads=2,
                       merged_stream_reads=merged)
    model = GEMModel(cfg).cuda()
    if compile:
        gem_parallel.parallelize(model, None, compile=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = [_batch(b, seed=i) for i, b in enumerate([16, 12, 20, 9, 16, 14])]

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
