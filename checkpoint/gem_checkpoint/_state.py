"""Turning the user's `state` into a DCP state dict, staging it to host memory, and back.

`state` maps names to Stateful objects (anything with state_dict()/load_state_dict():
modules, optimizers, loaders, RNGState), tensors (plain, DTensor, ShardedTensor), nested
dicts/lists, and plain python objects (ints, dataclasses, ...). DCP stores tensors as
tensors (resharded on load) and everything else pickled.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

try:  # ShardedTensor is what torchrec's sharded tables put in a state dict.
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
except ImportError:  # pragma: no cover
    ShardedTensor = None  # type: ignore[assignment,misc]


def is_stateful(obj: object) -> bool:
    return (
        not isinstance(obj, (torch.Tensor, Mapping))
        and callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    )


def check_state(state: object) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict of name -> Stateful/Tensor/dict/object, got {type(state).__name__}")
    for key in state:
        if not isinstance(key, str) or not key or "." in key:
            raise ValueError(f"state key {key!r} must be a non-empty str without '.' (DCP joins paths with '.')")
    return state


def to_plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """One level of resolution: Stateful objects become their state dicts."""
    return {k: (v.state_dict() if is_stateful(v) else v) for k, v in state.items()}


class Stager:
    """Copies a state dict's tensors into reusable host buffers (pinned when from CUDA).

    Buffers are kept between saves keyed by the tensor's path, so a steady-state save
    costs one device-to-host copy and no allocation. Safe because saves never interleave:
    a buffer is only rewritten once the previous write finished.
    """

    def __init__(self, *, shared: bool = False) -> None:
        """`shared`: buffers in shared memory (a writer process maps them without a copy),
        registered with CUDA when the source is on the GPU so the copy stays a pinned DMA."""
        self.shared = shared
        self._buffers: dict[tuple[object, ...], torch.Tensor] = {}
        self._pinned: dict[tuple[object, ...], bool] = {}  # pinned (or CUDA-registered) buffers
        self._saw_cuda = False

    def stage(self, obj: Any) -> Any:
        self._saw_cuda = False
        out = self._stage(obj, ())
        if self._saw_cuda:
            torch.cuda.synchronize()  # the writer thread reads these buffers next
        return out

    def allocate(self, obj: Any) -> int:
        """Makes the buffers `stage(obj)` will use, copying nothing; returns their bytes.
        Pinned host memory costs about a second per GB to allocate: done ahead of the
        first save, it keeps that save's stall as short as every later one's."""
        self._stage(obj, (), fill=False)
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _alloc(self, src: torch.Tensor, pin: bool) -> torch.Tensor:
        if not self.shared:
            return torch.empty(src.shape, dtype=src.dtype, pin_memory=pin)
        buf = torch.empty(src.shape, dtype=src.dtype)
        buf.share_memory_()  # type: ignore[no-untyped-call]
        if pin and buf.numel() > 0:
            rc = torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                buf.data_ptr(), buf.numel() * buf.element_size(), 0)
            if int(rc) != 0:
                raise RuntimeError(f"cudaHostRegister of a {buf.numel() * buf.element_size()} B staging buffer failed ({rc})")
        return buf

    def _buffer(self, path: tuple[object, ...], src: torch.Tensor, fill: bool) -> torch.Tensor:
        pin = src.is_cuda
        self._saw_cuda |= pin
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or self._pinned[path] != pin:
            if buf is not None and self._pinned[path] and self.shared and buf.numel() > 0:
                torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())  # type: ignore[no-untyped-call]
            buf = self._buffers[path] = self._alloc(src, pin)
            self._pinned[path] = pin
        if fill:
            buf.copy_(src.detach(), non_blocking=pin)
        return buf

    def _stage(self, obj: Any, path: tuple[object, ...], fill: bool = True) -> Any:
        if isinstance(obj, DTensor):
            inner: Any = obj._local_tensor
            if callable(getattr(inner, "local_shards", None)) and callable(getattr(inner, "local_offsets", None)):
                # torchrec's LocalShardsWrapper (2-D sparse / DMPCollection tables): a wrapper
                # over this rank's shards; stage each shard, rebuild the wrapper around them.
                bufs = [self._buffer(path + (("shard", i),), t, fill) for i, t in enumerate(inner.local_shards())]
                local = type(inner)(bufs, inner.local_offsets())
            else:
                local = self._buffer(path, inner, fill)
            return DTensor(local, obj._spec, requires_grad=False)  # type: ignore[no-untyped-call]
        if ShardedTensor is not None and isinstance(obj, ShardedTensor):
            # Rare on the hot path (torchrec tables); torch's own staging does the same.
            return copy.deepcopy(obj) if obj.device == torch.device("cpu") else obj.to("cpu")
        if isinstance(obj, torch.Tensor):
            return self._buffer(path, obj, fill)
        if isinstance(obj, Mapping):
            return {k: self._stage(v, path + (k,), fill) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._stage(v, path + (i,), fill) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        # Python objects: snapshot now, training may mutate them while we write.
        return copy.deepcopy(obj)
