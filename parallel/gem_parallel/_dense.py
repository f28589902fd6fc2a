"""HSDP for the dense part: FSDP2 ``fully_shard`` on the 2-D ("replicate", "shard") mesh.

Order of application (torchtitan's, and the only order that composes):

1. tensor/sequence sharding (none here: GEM's dense blocks fit one GPU);
2. activation checkpointing — wraps each block, so recomputation happens inside the block;
3. ``torch.compile`` per block — compiles the (checkpointed) block, before FSDP hooks exist,
   so the graph holds no collectives and FSDP's all-gather/reduce-scatter stay eager and
   overlappable;
4. FSDP: ``fully_shard`` on every block, then on the root. Per-block units let block i+1's
   all-gather overlap block i's compute; the root unit takes the leftover parameters
   (embeddings that are not torchrec-sharded, heads).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gem_parallel._dims import Meshes

BF16_MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
"""Default policy: bf16 compute (params all-gathered in bf16), fp32 gradient reduction."""


def default_blocks(model: nn.Module) -> list[tuple[nn.ModuleList, int]]:
    """Every element of every ``nn.ModuleList`` (not nested inside another list's block)."""
    found: list[tuple[nn.ModuleList, int]] = []
    claimed: set[int] = set()
    for module in model.modules():
        if id(module) in claimed:
            continue
        if isinstance(module, nn.ModuleList):
            for i, block in enumerate(module):
                found.append((module, i))
                claimed.update(id(m) for m in block.modules())
    return found


def apply_hsdp(model: nn.Module, mesh: Meshes | DeviceMesh, *,
               mp_policy: MixedPrecisionPolicy | None = BF16_MIXED,
               ac: bool = False, compile: bool | str = False,
               blocks: Iterable[tuple[nn.ModuleList, int]] | None = None,
               ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
    """Applies activation checkpointing, compile and HSDP to ``model`` in place; returns it.

    Args:
        model: single-device model (its blocks live in ``nn.ModuleList`` s).
        mesh: the job's :class:`Meshes` (``.dense`` is used) or a mesh: 2-D
            ``("replicate", "shard")`` gives HSDP, 1-D plain FSDP.
        mp_policy: FSDP2 mixed precision; ``None`` keeps parameters in their dtype (fp32).
        ac: wrap each block in activation checkpointing (full recompute).
        compile: ``True`` compiles each block with the default backend; a string picks the
            backend (``"eager"``, ``"aot_eager"``, ``"inductor"``).
        blocks: the FSDP units as (ModuleList, index) pairs; default :func:`default_blocks`.
        ignored_params: parameters FSDP must leave alone (e.g. torchrec-sharded tables).

    Returns:
        ``model`` (now an ``FSDPModule``): parameters are DTensors placed
        ``(Replicate(), Shard(0))`` on the 2-D mesh.
    """
    dense = mesh.dense if isinstance(mesh, Meshes) else mesh
    if dense.ndim not in (1, 2):
        raise ValueError(f"mesh.ndim={dense.ndim} must be 1 (FSDP) or 2 (HSDP: replicate, shard)")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile={compile!r} must be a bool or a backend name")
    units = list(blocks) if blocks is not None else default_blocks(model)
    # 2. activation checkpointing
    if ac:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for parent, i in units:
            parent[i] = checkpoint_wrapper(parent[i], preserve_rng_state=False)
    # 3. compile, per block
    if compile:
        backend = "inductor" if compile is True else compile
        for parent, i in units:
            parent[i].compile(backend=backend)
    # 4. FSDP: blocks, then the root
    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    for parent, i in units:
        fully_shard(parent[i], mesh=dense, reshard_after_forward=True, mp_policy=policy,
                    ignored_params=ignored_params)
    fully_shard(model, mesh=dense, reshard_after_forward=False, mp_policy=policy,
                ignored_params=ignored_params)
    return model
