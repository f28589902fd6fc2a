"""torchrec sharding of embedding tables: 1-D (one model-parallel group) and 2-D sparse.

torchrec is imported here at module level; ``gem_parallel`` imports this file only when a
sparse function is called, so the package works without torchrec (the GPU box has none).

Gradient semantics (torchrec's, documented because tests and trainers depend on them): with
torchrec's default gradient division, the embedding all-to-all backward divides by the size of
the model-parallel group, so — like DDP for dense parameters — each rank trains on the *mean*
loss of its own batch and the tables step on the group's mean gradient. In 2-D, ``sync()``
then averages weights (and optimizer state) over the replicas: for SGD this is exactly a step
on the global-batch mean; for stateful optimizers it is local steps + averaging.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel, DMPCollection
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import (
    DMPCollectionContext,
    ShardingEnv,
    ShardingEnv2D,
    ShardingPlan,
    ShardingStrategy,
    ShardingType,
)
from torchrec.distributed.model_parallel import get_default_sharders

from torch.distributed.remote_device import _remote_device
from gem_parallel._dims import Meshes, ParallelDims

_KNOWN_TYPES = {t.value for t in ShardingType}


class RowWiseCapableSharder(EmbeddingBagCollectionSharder):  # type: ignore[misc]
    """EBC sharder that offers ROW_WISE / TABLE_ROW_WISE on every device, and only ``allowed``.

    torchrec's stock sharder offers row-wise only on CUDA; the CPU TBE kernels handle it fine
    (DESIGN.md §3), and CPU is where our multi-process tests run.
    """

    def __init__(self, allowed: list[str] | None = None, fused_params: dict[str, Any] | None = None):
        super().__init__(fused_params=fused_params)
        self._allowed = allowed

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = list(super().sharding_types(compute_device_type))
        for t in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
            if t not in types:
                types.append(t)
        if self._allowed is not None:
            types = [t for t in types if t in self._allowed]
        return types


def make_sharder(sharding_types: list[str] | None, fused_params: dict[str, Any] | None) -> Any:
    if sharding_types is not None:
        bad = [t for t in sharding_types if t not in _KNOWN_TYPES]
        if bad or not sharding_types:
            raise ValueError(f"sharding_types={sharding_types!r} must be a non-empty list of "
                             f"{sorted(_KNOWN_TYPES)}")
    return RowWiseCapableSharder(sharding_types, fused_params)


def _plan(module: nn.Module, sharder: Any, *, world_size: int, local_world_size: int,
          device: torch.device, per_device_memory_bytes: int, batch_size: int | None,
          pg: dist.ProcessGroup) -> ShardingPlan:
    if per_device_memory_bytes <= 0:
        raise ValueError(f"per_device_memory_bytes={per_device_memory_bytes} must be > 0")
    cap = {"hbm_cap": per_device_memory_bytes} if device.type == "cuda" else {
        "ddr_cap": per_device_memory_bytes}
    topology = Topology(world_size=world_size, compute_device=device.type,
                        local_world_size=local_world_size, **cap)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, debug=False)
    # Like planner.collective_plan (plan on rank 0, broadcast), but a planner failure on rank
    # 0 reaches every rank as the same ValueError instead of a hung broadcast.
    result: list[Any] = [None]
    if dist.get_rank(pg) == 0:
        try:
            result[0] = planner.plan(module, [sharder])
        except PlannerError as e:
            result[0] = (f"per_device_memory_bytes={per_device_memory_bytes}: the planner found "
                         f"no sharding of the tables over {world_size} ranks that fits "
                         f"({str(e).splitlines()[0]})")
    dist.broadcast_object_list(result, group=pg, group_src=0)
    if isinstance(result[0], str):
        raise ValueError(result[0])
    return cast(ShardingPlan, result[0])


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor] | None:
    """The module's full weights, or None when it lives on "meta" (nothing to keep)."""
    sd = module.state_dict()
    if any(t.is_meta for t in sd.values()):
        return None
    return {k: t.detach().clone() for k, t in sd.items()}


def _restore(sharded: Any, full: dict[str, torch.Tensor] | None) -> Any:
    # torchrec initialises shards afresh; copy the caller's weights into them (its
    # load_state_dict hook slices full tensors by each local shard's offsets).
    if full is not None:
        result = sharded.load_state_dict(full, strict=False)
        if result.unexpected_keys:
            raise RuntimeError(f"weights not placed after sharding: {result.unexpected_keys}")
    return sharded


def shard_embeddings(module: nn.Module, dims: ParallelDims, meshes: Meshes, *,
                     per_device_memory_bytes: int, sharding_types: list[str] | None = None,
                     fused_params: dict[str, Any] | None = None, device: torch.device | None = None,
                     batch_size: int | None = None, init_data_parallel: bool = False) -> Any:
    """Shards the embedding tables of ``module`` over all ranks (1-D model parallelism).

    Args:
        module: a model holding ``EmbeddingBagCollection`` s, unsharded. On "meta", torchrec
            initialises the shards; with real weights, they are copied into the shards.
        dims / meshes: the job's degrees and meshes (the world mesh is used).
        per_device_memory_bytes: memory budget per rank given to the planner (HBM on CUDA,
            DDR on CPU).
        sharding_types: restrict the planner, e.g. ``["table_wise"]``; ``None`` = all offered.
        fused_params: the fused embedding optimizer, e.g.
            ``{"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}``.
        init_data_parallel: wrap the remaining (dense) parameters in DDP (torchrec default).
            ``False`` because GEM's dense part gets HSDP from :func:`apply_hsdp`.

    Returns:
        ``torchrec.DistributedModelParallel``.
    """
    dev = device or torch.device(meshes.world.device_type)
    sharder = make_sharder(sharding_types, fused_params)
    pg = meshes.world.get_group()
    plan = _plan(module, sharder, world_size=dims.world_size, local_world_size=dims.gpus_per_host,
                 device=dev, per_device_memory_bytes=per_device_memory_bytes,
                 batch_size=batch_size, pg=pg)
    full = _snapshot(module)
    dmp = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=dev,
                                   plan=plan, sharders=[sharder],
                                   init_data_parallel=init_data_parallel)
    return _restore(dmp, full)


class MeshDMPCollection(DMPCollection):  # type: ignore[misc]
    """torchrec ``DMPCollection`` on the sparse mesh built by :class:`ParallelDims`.

    Two changes to the stock class, nothing else: (1) its process groups come from our mesh
    (so ``ParallelDims`` stays the only mesh builder; the layout is the same as torchrec's);
    (2) on CPU, where torchrec 1.8 asserts CUDA/MTIA, the constructor body is replayed without
    that assert (DEFAULT strategy, no submodule configs) so 2-D sparse is testable on gloo.
    """

    def __init__(self, module: nn.Module, *, device: torch.device, plan: ShardingPlan,
                 mesh: Any, sharders: list[Any], use_inter_host_allreduce: bool,
                 init_data_parallel: bool) -> None:
        object.__setattr__(self, "_gem_mesh", mesh)
        world, mp = mesh.size(), mesh.size(1)
        if device.type in ("cuda", "mtia"):
            super().__init__(module=module, device=device, plan=plan, world_size=world,
                             sharding_group_size=mp, global_pg=dist.group.WORLD,
                             sharders=sharders, init_data_parallel=init_data_parallel,
                             use_inter_host_allreduce=use_inter_host_allreduce)
            return
        self._cpu_init(module, device, plan, world, mp, sharders, use_inter_host_allreduce,
                       init_data_parallel)

    def _create_process_groups(self, global_rank: int, world_size: int, local_size: int,
                               use_inter_host_allreduce: bool = False) -> tuple[Any, Any, Any]:
        mesh = self._gem_mesh
        return mesh, mesh.get_group("shard"), mesh.get_group("replicate")

    def _remap_sharding_plan(self, plan: ShardingPlan, rank: int, step: int,
                             sharding_group_size: int,
                             use_inter_host_allreduce: bool = False) -> None:
        super()._remap_sharding_plan(plan, rank, step, sharding_group_size,
                                     use_inter_host_allreduce)
        if self._device.type != "cpu":
            return
        # torchrec writes "rank:R/cpu:<local index>"; CPU tensors carry no index.
        for module_plan in plan.plan.values():
            for ps in module_plan.values():
                shards = getattr(ps.sharding_spec, "shards", None) or []
                for shard in shards:
                    shard.placement = _remote_device(f"rank:{shard.placement.rank()}/cpu")

    def _cpu_init(self, module: nn.Module, device: torch.device, plan: ShardingPlan, world: int,
                  mp: int, sharders: list[Any], inter_host: bool, init_dp: bool) -> None:
        # Mirrors torchrec 1.8.0 DMPCollection.__init__ minus its CUDA assert.
        self._device = device
        self._pg = dist.group.WORLD
        self._global_rank = dist.get_rank()
        self._custom_all_reduce = None
        self._sharder_map = {s.module_type: s for s in (sharders or get_default_sharders())}
        ctx = DMPCollectionContext(module=None, plan=plan, sharding_group_size=mp,
                                   node_group_size=None, use_inter_host_allreduce=inter_host,
                                   sharding_strategy=ShardingStrategy.DEFAULT)
        self._default_ctx = ctx
        self._submodule_ctxs: list[Any] = []
        self._ctxs = [ctx]
        ctx.device_mesh, ctx.sharding_pg, ctx.replica_pg = self._create_process_groups(
            self._global_rank, world, mp, inter_host)
        self._remap_sharding_plan(plan=plan, rank=self._global_rank, step=world // mp,
                                  sharding_group_size=mp, use_inter_host_allreduce=inter_host)
        env = ShardingEnv2D(global_pg=self._pg, sharding_pg=ctx.sharding_pg,
                            replica_pg=ctx.replica_pg, device_mesh=ctx.device_mesh,
                            node_group_size=None, use_inter_host_allreduce=inter_host,
                            sharding_strategy=ShardingStrategy.DEFAULT)
        DistributedModelParallel.__init__(self, module, env, device, plan, sharders, init_dp)
        self._group_sharded_modules(self._ctxs)
        self._cache_sync_tensors(self._ctxs)
        self._use_sharded_relay = False
        self._sharded_relay_state = None


def shard_embeddings_2d(module: nn.Module, dims: ParallelDims, meshes: Meshes, *,
                        per_device_memory_bytes: int, sharding_types: list[str] | None = None,
                        fused_params: dict[str, Any] | None = None,
                        device: torch.device | None = None, batch_size: int | None = None,
                        init_data_parallel: bool = False) -> Any:
    """2-D sparse parallelism: tables sharded over ``sparse_mp`` ranks, replicated across groups.

    The plan is made for one model-parallel group (``sparse_mp`` ranks) and torchrec remaps it
    onto every group. Call ``model.sync()`` after each optimizer step: it all-reduces (AVG) the
    embedding weights and optimizer state across the replicas of each shard.

    Arguments as :func:`shard_embeddings`. Returns a ``DMPCollection``.
    """
    dev = device or torch.device(meshes.sparse.device_type)
    sharder = make_sharder(sharding_types, fused_params)
    mp = dims.sparse_model_parallel
    plan = _plan(module, sharder, world_size=mp, local_world_size=min(mp, dims.gpus_per_host),
                 device=dev, per_device_memory_bytes=per_device_memory_bytes,
                 batch_size=batch_size, pg=meshes.world.get_group())
    full = _snapshot(module)
    dmpc = MeshDMPCollection(module, device=dev, plan=plan, mesh=meshes.sparse,
                             sharders=[sharder],
                             use_inter_host_allreduce=not dims.sparse_replicas_within_host,
                             init_data_parallel=init_data_parallel)
    return _restore(dmpc, full)
