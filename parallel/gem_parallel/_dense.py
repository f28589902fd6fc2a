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
5. comms: FSDP2's custom-collective hook (``FSDPModule.set_custom_all_gather``) routes every
   unit's parameter all-gather through ``gem_comms`` (copy engines on one host), so the SMs
   stay with the compute it overlaps. Gradient reduce-scatter stays on the group's backend:
   a reduction needs arithmetic, and NCCL fuses it into its ring (``gem_comms``'s README).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

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


def apply_ac_compile(units: Sequence[tuple[nn.ModuleList, int]], ac: bool, compile: bool | str) -> None:
    """Steps 2-3 on each (ModuleList, index) unit: activation checkpointing (full recompute
    inside the block), then ``torch.compile`` of the (checkpointed) block."""
    if ac:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for parent, i in units:
            parent[i] = checkpoint_wrapper(parent[i], preserve_rng_state=False)
    if compile:
        backend = "inductor" if compile is True else compile
        for parent, i in units:
            parent[i].compile(backend=backend)


COMMS = ("auto", "copy_engine", "nccl")


def comms_all_gather(backend: str, timeout: float | None = None) -> Any:
    """An FSDP2 ``AllGather`` (``torch.distributed.fsdp`` custom collective) over ``gem_comms``.

    Args:
        backend: ``gem_comms`` backend: "auto" (per call: NCCL under 64 MiB per rank,
            copy engines at and above it on one host with peer access, else NCCL; gloo on
            CPU) or "copy_engine" (also on CPU, over shared memory).
        timeout: forwarded to ``gem_comms`` (None: stream-ordered, no host wait).

    Raises:
        RuntimeError: this torch has no FSDP2 custom-collective API.
    """
    cls = _all_gather_class()
    return cls(backend, timeout)


_CLASSES: dict[str, type] = {}


def _all_gather_class() -> type:
    if "ag" in _CLASSES:
        return _CLASSES["ag"]
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
    except ImportError as e:
        raise RuntimeError(
            f"comms needs FSDP2 custom collectives (torch.distributed.fsdp AllGather, "
            f"set_custom_all_gather); torch {torch.__version__} has none: use comms='nccl'"
        ) from e

    class GemAllGather(AllGather):
        """FSDP's all-gather through ``gem_comms``; ``calls`` counts the collectives issued."""

        def __init__(self, backend: str, timeout: float | None) -> None:
            self.backend = backend
            self.timeout = timeout
            self.calls = 0

        def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     group: dist.ProcessGroup, async_op: bool = False) -> None:
            import gem_comms

            self.calls += 1
            # Always issued "sync": on CUDA that orders FSDP's all-gather stream after the
            # copies without blocking the host, on CPU the data is there on return. FSDP
            # only waits on a returned torch Work, so None is the right answer either way.
            gem_comms.all_gather_into_tensor(output_tensor, input_tensor, group,
                                             backend=self.backend,  # type: ignore[arg-type]
                                             timeout=self.timeout)

    _CLASSES["ag"] = GemAllGather
    return GemAllGather


def set_comms(model: nn.Module, comms: str, *, timeout: float | None = None) -> Any:
    """Installs the ``comms`` all-gather on every FSDP unit of ``model``; returns the hook.

    ``"nccl"`` leaves FSDP's own collectives (NCCL on GPU, gloo on CPU) and returns None.
    """
    if comms not in COMMS:
        raise ValueError(f"comms={comms!r} must be one of {COMMS}")
    if comms == "nccl":
        return None
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        raise RuntimeError(f"comms={comms!r} needs FSDPModule.set_custom_all_gather "
                           f"(torch {torch.__version__} lacks it): use comms='nccl'")
    hook = comms_all_gather(comms, timeout)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_custom_all_gather(hook)
    return hook


def apply_hsdp(model: nn.Module, mesh: Meshes | DeviceMesh, *,
               mp_policy: MixedPrecisionPolicy | None = BF16_MIXED,
               ac: bool = False, compile: bool | str = False,
               blocks: Iterable[tuple[nn.ModuleList, int]] | None = None,
               ignored_params: set[nn.Parameter] | None = None,
               comms: str = "nccl") -> nn.Module:
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
        comms: who moves the parameter all-gathers: ``"nccl"`` (FSDP's own collective on
            the group's backend: NCCL on GPU, gloo on CPU), ``"copy_engine"``
            (``gem_comms`` copy engines; on CPU host shared memory) or ``"auto"``
            (``gem_comms`` picks per all-gather: NCCL for shards under
            ``gem_comms`` ``auto_min_bytes`` (64 MiB per rank, where the copy-engine
            path is host-bound and slower), copy engines at and above it when the shard
            group is on one host with GPU peer access, else NCCL; gloo on CPU).
            Reduce-scatter stays on the group.

    Returns:
        ``model`` (now an ``FSDPModule``): parameters are DTensors placed
        ``(Replicate(), Shard(0))`` on the 2-D mesh.
    """
    dense = mesh.dense if isinstance(mesh, Meshes) else mesh
    if dense.ndim not in (1, 2):
        raise ValueError(f"mesh.ndim={dense.ndim} must be 1 (FSDP) or 2 (HSDP: replicate, shard)")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile={compile!r} must be a bool or a backend name")
    if comms not in COMMS:
        raise ValueError(f"comms={comms!r} must be one of {COMMS}")
    units = list(blocks) if blocks is not None else default_blocks(model)
    apply_ac_compile(units, ac, compile)  # 2. activation checkpointing, 3. compile per block
    # 4. FSDP: blocks, then the root
    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    for parent, i in units:
        fully_shard(parent[i], mesh=dense, reshard_after_forward=True, mp_policy=policy,
                    ignored_params=ignored_params)
    fully_shard(model, mesh=dense, reshard_after_forward=False, mp_policy=policy,
                ignored_params=ignored_params)
    # 5. comms
    set_comms(model, comms)
    return model
