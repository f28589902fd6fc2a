"""parallelize(meshes, compile=...) with HSDP: whole-graph blocks under FSDP2, the eager
numbers, no graph breaks, and no recompile when the batch size changes.

A CPU gloo world of 2 (FSDP over 2 shards), backend "aot_eager" (inductor's C++ codegen is
minutes on this box). The GEM model's own blocks are covered in tests/test_compile_blocks.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from _dist import run_world


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.lin(self.norm(x)))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        out: torch.Tensor = self.head(x)
        return out


def _worker(rank: int, world: int) -> dict[str, Any]:
    from gem_parallel import ParallelDims, parallelize

    torch.manual_seed(0)
    net, ref = _Net(), _Net()
    ref.load_state_dict(net.state_dict())
    dims = ParallelDims(hosts=1, gpus_per_host=world, dp_replicate=1, dp_shard=world)
    done = parallelize(net, dims.build_meshes("cpu"), compile="aot_eager", mp_policy=None)
    start = done.compile_counts()
    out: dict[str, Any] = {"graphs": [], "breaks": [], "diff": [], "blocks": done.compiled_blocks}
    for n in (4, 6, 9, 5):
        x = torch.randn(n, 16, generator=torch.Generator().manual_seed(n))
        got = done.model(x)
        got.sum().backward()
        out["diff"].append(float((got - ref(x)).abs().max()))
        counts = done.compile_counts()
        out["graphs"].append(counts["graphs"] - start["graphs"])
        out["breaks"].append(counts["graph_breaks"] - start["graph_breaks"])
    return out


def test_compiled_fsdp_blocks_match_eager_and_stop_recompiling() -> None:
    for r in run_world(_worker, 2):
        assert r["blocks"] == 2
        assert max(r["diff"]) < 1e-5, r["diff"]
        assert r["breaks"] == [0, 0, 0, 0]
        # Under FSDP each block keeps its own (dynamic) graph, compiled at step 1.
        assert r["graphs"] == [2, 2, 2, 2], r["graphs"]
