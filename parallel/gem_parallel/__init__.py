"""gem_parallel: topology-aware meshes, HSDP for dense blocks, 2-D sparse parallelism.

Model code stays single-device; this package applies every transformation from outside, in
one order (:func:`parallelize`: MXFP8 conversion -> activation checkpointing -> compile ->
table sharding -> HSDP): :class:`ParallelDims` -> :meth:`ParallelDims.build_meshes` ->
:func:`apply_hsdp` (dense) and
:func:`shard_embeddings` / :func:`shard_embeddings_2d` (torchrec, imported lazily: the GPU
box has no torchrec). :func:`comm_volume` plans communication at scale on paper.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from gem_parallel._aot import AotBlocks
from gem_parallel._comm_volume import CommConfig, CommItem, comm_table, comm_volume
from gem_parallel._dense import BF16_MIXED, apply_hsdp
from gem_parallel._dims import Meshes, ParallelDims
from gem_parallel._parallelize import Parallelized, compile_blocks, parallelize

__version__ = "0.3.17"
__all__ = [
    "__version__",
    "parallelize",
    "Parallelized",
    "compile_blocks",
    "AotBlocks",
    "ParallelDims",
    "Meshes",
    "apply_hsdp",
    "BF16_MIXED",
    "shard_embeddings",
    "shard_embeddings_2d",
    "row_wise_sharder",
    "CommConfig",
    "CommItem",
    "comm_volume",
    "comm_table",
]


def shard_embeddings(module: nn.Module, dims: ParallelDims, meshes: Meshes, **kw: Any) -> Any:
    """1-D torchrec sharding over all ranks; see ``gem_parallel._sparse.shard_embeddings``."""
    from gem_parallel import _sparse

    return _sparse.shard_embeddings(module, dims, meshes, **kw)


def shard_embeddings_2d(module: nn.Module, dims: ParallelDims, meshes: Meshes, **kw: Any) -> Any:
    """2-D sparse (``DMPCollection``); see ``gem_parallel._sparse.shard_embeddings_2d``."""
    from gem_parallel import _sparse

    return _sparse.shard_embeddings_2d(module, dims, meshes, **kw)


def row_wise_sharder(sharding_types: list[str] | None = None,
                     fused_params: dict[str, Any] | None = None) -> Any:
    """An ``EmbeddingBagCollectionSharder`` that offers row-wise on CPU too (needs torchrec)."""
    from gem_parallel import _sparse

    return _sparse.make_sharder(sharding_types, fused_params)
