"""Spawned workers for test_state.py (module level so spawn can pickle them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from _sparse_workers import kjt_slice, make_batches, make_ebc, pooled_of


class Holder(nn.Module):
    """A model's sparse part: its own parameter next to the (to be sharded) tables."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.ebc = make_ebc(seed)
        self.scale = nn.Parameter(torch.rand(24) + 0.5)


class Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.sparse = Holder(seed)
        torch.manual_seed(seed + 7)
        self.dense = nn.Linear(24, 1)


def _local(v: Any) -> torch.Tensor:
    parts = [s.tensor for s in v.local_shards()] if hasattr(v, "local_shards") else [v]
    if not parts:  # a table this rank holds no shard of (table-wise)
        return torch.empty(0)
    return torch.cat([p.detach().flatten() for p in parts]).clone()


def run_sharded_round_trip(rank: int, world: int, seed: int, ckpt_dir: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from gem_parallel import Parallelized, ParallelDims, shard_embeddings

    dims = ParallelDims(hosts=1, gpus_per_host=world)
    meshes = dims.build_meshes("cpu")
    fp = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5}

    def build(s: int) -> tuple[Net, torch.optim.Optimizer]:
        net = Net(s)
        net.sparse.ebc = shard_embeddings(net.sparse.ebc, dims, meshes, per_device_memory_bytes=1 << 26,
                                          sharding_types=["table_wise"], fused_params=fp)
        opt = torch.optim.SGD([net.sparse.scale, *net.dense.parameters()], lr=0.1, momentum=0.9)
        return net, opt

    net, opt = build(seed)
    batches = make_batches(seed, 2, 8 * world)
    for b in batches:  # momentum buffers and moved tables: state worth checking
        kt = net.sparse.ebc(kjt_slice(b, 8 * rank, 8 * (rank + 1)))
        loss = (net.dense(pooled_of(kt) * net.sparse.scale) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in opt.param_groups[0]["params"]:  # data parallel: replicas stay equal (as DDP)
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    state = Parallelized(net).train_state([opt])
    keys = sorted(state.state_dict()["model"])
    dcp.save({"app": state}, checkpoint_id=ckpt_dir)

    net2, opt2 = build(seed + 1)  # other values everywhere, no optimizer state yet
    before = {k: _local(v) for k, v in net2.sparse.ebc.state_dict().items()}
    state2 = Parallelized(net2).train_state([opt2])
    dcp.load({"app": state2}, checkpoint_id=ckpt_dir)
    tables = {k: torch.equal(_local(v), _local(net2.sparse.ebc.state_dict()[k]))
              for k, v in net.sparse.ebc.state_dict().items()}
    moved = {k: not torch.equal(before[k], _local(v)) for k, v in net2.sparse.ebc.state_dict().items()}
    dense = {n: torch.equal(p, dict(net2.named_parameters())[n]) for n, p in net.named_parameters()
             if not n.startswith("sparse.ebc.")}
    mom = [torch.equal(opt.state[p]["momentum_buffer"], opt2.state[q]["momentum_buffer"])
           for p, q in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"])]
    return {"sharded": state.sharded, "keys": keys, "tables": tables, "moved": moved, "dense": dense,
            "momentum": mom, "sync": Parallelized(net).replica_sync() is None}
