"""Spawned workers for test_sparse.py (module level so spawn can pickle them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

TABLES = [("t0", 24, 8, "f0"), ("t1", 10, 8, "f1"), ("t2", 40, 8, "f2")]  # name, rows, dim, feat
LR = 0.5


def make_ebc(seed: int) -> nn.Module:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    torch.manual_seed(seed)
    tables = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f])
              for n, r, d, f in TABLES]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    with torch.no_grad():
        for p in ebc.parameters():
            p.uniform_(-1.0, 1.0)
    return ebc


def make_batches(seed: int, steps: int, batch: int) -> list[dict[str, Any]]:
    """Global batches: per feature, lengths [batch] (0..3, empty bags included) and ids."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        feats = {}
        for _, rows, _, f in TABLES:
            lengths = torch.randint(0, 4, (batch,), generator=g)
            ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
            feats[f] = (lengths, ids)
        y = torch.randn(batch, generator=g)
        out.append({"feats": feats, "y": y})
    return out


def kjt_slice(b: dict[str, Any], lo: int, hi: int) -> Any:
    from torchrec import KeyedJaggedTensor

    keys, lengths, values = [], [], []
    for _, _, _, f in TABLES:
        ln, ids = b["feats"][f]
        off = torch.cat([torch.zeros(1, dtype=torch.long), ln.cumsum(0)])
        keys.append(f)
        lengths.append(ln[lo:hi])
        values.append(ids[int(off[lo]):int(off[hi])])
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values),
                                               lengths=torch.cat(lengths))


def head_weight() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, sum(d for _, _, d, _ in TABLES))


def pooled_of(kt: Any) -> torch.Tensor:
    """[B, sum dims] in TABLES order (a sharded module may return features reordered)."""
    d = kt.to_dict()
    return torch.cat([d[f] for _, _, _, f in TABLES], dim=1)


def loss_sum(pooled: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum over samples of (pooled . w - y)^2: a fixed head, so only the tables train."""
    return ((pooled @ head_weight() - y) ** 2).sum()


def reference(steps: list[dict[str, Any]], seed: int) -> list[float]:
    """Unsharded EBC + plain SGD on the global-batch mean loss."""
    ebc = make_ebc(seed)
    opt = torch.optim.SGD(ebc.parameters(), lr=LR)
    losses = []
    for b in steps:
        n = len(b["y"])
        pooled = pooled_of(ebc(kjt_slice(b, 0, n)))
        loss = loss_sum(pooled, b["y"]) / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _train(model: Any, steps: list[dict[str, Any]], rank: int, world: int,
           sync: bool) -> list[float]:
    """Each rank trains on the mean loss of its slice (torchrec divides embedding grads by the
    model-parallel group size, as DDP averages)."""
    losses = []
    for b in steps:
        n = len(b["y"])
        per = n // world
        lo, hi = rank * per, (rank + 1) * per
        pooled = model(kjt_slice(b, lo, hi))
        pooled = pooled.wait() if hasattr(pooled, "wait") else pooled
        local = loss_sum(pooled_of(pooled), b["y"][lo:hi])
        (local / per).backward()  # fused optimizer steps inside backward
        if sync:
            model.sync()
        total = (local / n).detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    return losses


def run_1d(rank: int, world: int, kinds: list[str], steps: list[dict[str, Any]], seed: int,
           ckpt_dir: str) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    import torch.distributed.checkpoint as dcp

    from gem_parallel import ParallelDims, shard_embeddings

    dims = ParallelDims(hosts=1, gpus_per_host=world)
    meshes = dims.build_meshes("cpu")
    fp = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    out: dict[str, Any] = {}
    for kind in kinds:
        model = shard_embeddings(make_ebc(seed), dims, meshes, per_device_memory_bytes=1 << 26,
                                 sharding_types=[kind], fused_params=fp)
        types = {ps.sharding_type for mp in model.plan.plan.values() for ps in mp.values()}
        out[kind] = {"losses": _train(model, steps, rank, world, sync=False),
                     "types": types}
        if kind == kinds[-1]:
            sd = model.state_dict()
            out["sd_types"] = {k: type(v).__name__ for k, v in sd.items()}
            dcp.save(sd, checkpoint_id=ckpt_dir)
    try:
        shard_embeddings(make_ebc(seed), dims, meshes, per_device_memory_bytes=64,
                         sharding_types=["table_wise"], fused_params=fp)
        out["budget_error"] = ""
    except ValueError as e:
        out["budget_error"] = str(e)
    return out


def _local(v: Any) -> torch.Tensor:
    """This rank's shards of a DTensor (LocalShardsWrapper) or ShardedTensor, flattened."""
    if hasattr(v, "to_local"):
        v = v.to_local()
        parts = v.local_shards() if hasattr(v, "local_shards") else [v]
    else:
        parts = [s.tensor for s in v.local_shards()]
    return torch.cat([p.detach().flatten() for p in parts]).clone()


def run_2d(rank: int, world: int, kind: str, steps: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from gem_parallel import ParallelDims, shard_embeddings_2d

    dims = ParallelDims(hosts=2, gpus_per_host=world // 2, sparse_mp=2)
    meshes = dims.build_meshes("cpu")
    fp = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    model = shard_embeddings_2d(make_ebc(seed), dims, meshes, per_device_memory_bytes=1 << 26,
                                sharding_types=[kind], fused_params=fp)
    losses = _train(model, steps, rank, world, sync=True)
    # After sync the replicas of each shard must be identical: compare local shards.
    local = {k: _local(v) for k, v in model.state_dict().items()}
    # same world: embeddings (1-D, table-wise) + HSDP dense in one model, as the trainer does
    composed = _sparse_dense_hsdp(rank, world, dims, meshes, steps, seed)
    return {"composed": composed, "losses": losses, "local": local, "replica_mesh": meshes.sparse["replicate"].mesh.tolist(),
            "mp_mesh": meshes.sparse["shard"].mesh.tolist()}


class SparseDense(nn.Module):
    """The GEM shape in miniature: embedding tables feeding a dense MLP."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.sparse = make_ebc(seed)
        torch.manual_seed(seed + 1)
        width = sum(d for _, _, d, _ in TABLES)
        self.dense = nn.Sequential(nn.Linear(width, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, kjt: Any) -> torch.Tensor:
        kt = self.sparse(kjt)
        kt = kt.wait() if hasattr(kt, "wait") else kt
        return self.dense(pooled_of(kt)).squeeze(-1)


def reference_sparse_dense(steps: list[dict[str, Any]], seed: int) -> list[float]:
    model = SparseDense(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for b in steps:
        n = len(b["y"])
        loss = torch.nn.functional.mse_loss(model(kjt_slice(b, 0, n)), b["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _sparse_dense_hsdp(rank: int, world: int, dims: Any, meshes: Any,
                       steps: list[dict[str, Any]], seed: int) -> list[float]:
    """Tables sharded table-wise over the world + HSDP (2 x 2) on the dense part."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from gem_parallel import apply_hsdp, shard_embeddings

    model = SparseDense(seed)
    model.sparse = shard_embeddings(model.sparse, dims, meshes, per_device_memory_bytes=1 << 26,
                                    sharding_types=["table_wise"],
                                    fused_params={"optimizer": EmbOptimType.EXACT_SGD,
                                                  "learning_rate": LR})
    apply_hsdp(model.dense, meshes, mp_policy=None)
    opt = torch.optim.SGD(model.dense.parameters(), lr=LR)
    losses = []
    for b in steps:
        n = len(b["y"])
        per = n // world
        lo, hi = rank * per, (rank + 1) * per
        loss = torch.nn.functional.mse_loss(model(kjt_slice(b, lo, hi)), b["y"][lo:hi])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return losses
