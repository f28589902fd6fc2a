"""Parallel degrees and the meshes built from them: the one place that builds meshes.

A GEM job has two kinds of state with opposite needs (DESIGN.md §4 parallel):

* dense blocks (transformer-like): small enough to replicate, trained with HSDP — parameters
  sharded inside a host, where NVLink is fast, and replicated across hosts, where the network
  is slow. Only the replica all-reduce of gradient shards crosses hosts.
* embedding tables (100 GB – TB): model-parallel over a group of ``sparse_mp`` ranks
  (torchrec all-to-all), and that group replicated data-parallel (2-D sparse parallelism,
  torchrec ``DMPCollection``): a smaller model-parallel group means smaller all-to-alls.

Rank ``r`` lives on host ``r // gpus_per_host`` (torchrun's default, host-major ranks).
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("replicate", "shard")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Meshes:
    """Every named mesh of a job (built only by :meth:`ParallelDims.build_meshes`).

    Attributes:
        dense: 2-D ``("replicate", "shard")`` mesh for HSDP; a shard group is consecutive ranks.
        sparse: 2-D ``("replicate", "shard")`` mesh for embeddings: ``"shard"`` is the
            model-parallel group (``sparse_mp`` ranks), ``"replicate"`` its data-parallel copies.
        world: 1-D ``("world",)`` mesh over all ranks (1-D embedding sharding, metrics).
    """

    dense: DeviceMesh
    sparse: DeviceMesh
    world: DeviceMesh


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Parallel degrees of a job; :meth:`validate` checks them once.

    Attributes:
        hosts: number of hosts.
        gpus_per_host: ranks per host (the fast NVLink domain).
        dp_replicate: dense replica degree (HSDP outer dimension); ``-1`` = world / dp_shard.
        dp_shard: dense shard degree (FSDP inner dimension); ``-1`` = gpus_per_host.
        sparse_mp: embedding model-parallel group size; ``-1`` = the whole world (1-D).
        shard_within_host: require each dense shard group to lie inside one host.
        sparse_replicas_within_host: place the replicas of an embedding shard on consecutive
            ranks (same host; the per-step replica sync stays on NVLink) and stride the
            model-parallel group across hosts — torchrec ``DMPCollection``'s default layout.
            ``False``: model-parallel groups are consecutive ranks instead.
    """

    hosts: int
    gpus_per_host: int
    dp_replicate: int = -1
    dp_shard: int = -1
    sparse_mp: int = -1
    shard_within_host: bool = True
    sparse_replicas_within_host: bool = True

    @classmethod
    def from_env(cls, **degrees: int | bool) -> ParallelDims:
        """Reads world and local sizes from torchrun's ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE``."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        if local <= 0 or world % local:
            raise ValueError(f"LOCAL_WORLD_SIZE={local} must divide WORLD_SIZE={world}")
        return cls(hosts=world // local, gpus_per_host=local, **degrees)  # type: ignore[arg-type]

    @property
    def world_size(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def replicate(self) -> int:
        """Resolved dense replica degree."""
        return self.dp_replicate if self.dp_replicate != -1 else self.world_size // self.shard

    @property
    def shard(self) -> int:
        """Resolved dense shard degree."""
        return self.dp_shard if self.dp_shard != -1 else self.gpus_per_host

    @property
    def sparse_model_parallel(self) -> int:
        """Resolved embedding model-parallel group size."""
        return self.sparse_mp if self.sparse_mp != -1 else self.world_size

    @property
    def sparse_replicas(self) -> int:
        """Number of data-parallel copies of the embedding model-parallel group."""
        return self.world_size // self.sparse_model_parallel

    def validate(self) -> ParallelDims:
        """Checks every rule once; returns ``self`` so it chains.

        Raises:
            ValueError: naming the field, its value and the rule broken.
        """
        for name in ("hosts", "gpus_per_host"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        for name in ("dp_replicate", "dp_shard", "sparse_mp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1):
                raise ValueError(f"{name}={v!r} must be a positive int or -1 (derive)")
        world = self.world_size
        if self.shard > world or world % self.shard:
            raise ValueError(f"dp_shard={self.shard} must divide world size {world} "
                             f"(= hosts {self.hosts} x gpus_per_host {self.gpus_per_host})")
        if self.replicate * self.shard != world:
            raise ValueError(f"dp_replicate={self.replicate} x dp_shard={self.shard} must equal "
                             f"world size {world} (= hosts {self.hosts} x gpus_per_host "
                             f"{self.gpus_per_host})")
        if self.shard_within_host and self.gpus_per_host % self.shard:
            raise ValueError(
                f"dp_shard={self.shard} must divide gpus_per_host={self.gpus_per_host} when "
                "shard_within_host=True: otherwise a shard group crosses hosts and every "
                "all-gather / reduce-scatter goes over the slow network")
        mp = self.sparse_model_parallel
        if mp > world or world % mp:
            raise ValueError(f"sparse_mp={mp} must divide world size {world}")
        return self

    def host_of(self, rank: int) -> int:
        """The host of a global rank (host-major numbering)."""
        return rank // self.gpus_per_host

    def dense_layout(self) -> torch.Tensor:
        """[replicate, shard] global ranks of the dense mesh (shard groups = consecutive)."""
        return torch.arange(self.world_size).reshape(self.replicate, self.shard)

    def sparse_layout(self) -> torch.Tensor:
        """[replicas, sparse_mp] global ranks of the sparse mesh; row g = model-parallel group g.

        Matches torchrec ``DMPCollection._create_process_groups`` for both
        ``use_inter_host_allreduce`` settings.
        """
        r, mp = self.sparse_replicas, self.sparse_model_parallel
        ranks = torch.arange(self.world_size)
        if self.sparse_replicas_within_host:
            return ranks.reshape(mp, r).T.contiguous()
        return ranks.reshape(r, mp)

    def build_meshes(self, device_type: str) -> Meshes:
        """Builds every named mesh (collective: every rank must call it, same order).

        Args:
            device_type: ``"cuda"`` or ``"cpu"`` (gloo).
        """
        self.validate()
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("build_meshes needs torch.distributed initialised (init_process_group)")
        if dist.get_world_size() != self.world_size:
            raise ValueError(f"process group has {dist.get_world_size()} ranks but hosts x "
                             f"gpus_per_host = {self.world_size}")
        dense = init_device_mesh(device_type, (self.replicate, self.shard), mesh_dim_names=MESH_DIMS)
        sparse = DeviceMesh(device_type, self.sparse_layout(), mesh_dim_names=MESH_DIMS)
        world = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        return Meshes(dense=dense, sparse=sparse, world=world)
