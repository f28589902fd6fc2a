"""The jagged batch that flows from the loader to the model (INTERFACES.md, gem_data.Batch).

Sequences are flat values + int64 offsets [B+1] + a host-side `max_seq_len` int (STYLE.md
point 3), so kernels never sync the GPU to learn the longest sequence. Non-sequence sparse
ids are a torchrec `KeyedJaggedTensor` when torchrec is importable; `SparseFeatures` is a
drop-in with the method subset the model uses, for machines without torchrec (the GPU box).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor


def _offsets(lengths: Tensor) -> Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


@dataclasses.dataclass(frozen=True)
class JaggedFeature:
    """One key of a SparseFeatures: values [N], lengths [B], offsets [B+1] (as torchrec's JaggedTensor)."""

    _values: Tensor
    _lengths: Tensor

    def values(self) -> Tensor:
        return self._values

    def lengths(self) -> Tensor:
        return self._lengths

    def offsets(self) -> Tensor:
        return _offsets(self._lengths)


class SparseFeatures:
    """Keyed jagged sparse ids with the `KeyedJaggedTensor` layout, without torchrec.

    Layout (same as torchrec): `values` [N] int64 holds key 0's ids for every sample, then key
    1's, ...; `lengths` [K*B] int64 is key-major (lengths[k*B + b] = ids of key k in sample b).

    Args:
        keys: feature names, K of them.
        values: [N] int64 ids.
        lengths: [K*B] int64, sums to N.
    """

    def __init__(self, keys: list[str], values: Tensor, lengths: Tensor,
                 length_per_key: list[int] | None = None) -> None:
        if values.dim() != 1 or lengths.dim() != 1:
            raise ValueError(f"{values.shape=} and {lengths.shape=} must be 1-D")
        if keys and lengths.numel() % len(keys) != 0:
            raise ValueError(f"{lengths.numel()=} must be a multiple of len(keys)={len(keys)}")
        if length_per_key is not None and len(length_per_key) != len(keys):
            raise ValueError(f"length_per_key has {len(length_per_key)} entries, must have len(keys)={len(keys)}")
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths
        # Host ints, like torchrec's KJT cache: computed while the lengths are on the host, and
        # carried by to()/pin_memory(), so splitting a GPU batch per key never syncs.
        self._per_key = length_per_key
        if self._per_key is None and lengths.device.type == "cpu":
            self._per_key = self._sum_per_key()

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def lengths(self) -> Tensor:
        return self._lengths

    def offsets(self) -> Tensor:
        return _offsets(self._lengths)

    def stride(self) -> int:
        """Batch size B."""
        return self._lengths.numel() // len(self._keys) if self._keys else 0

    def length_per_key(self) -> list[int]:
        """Ids per key (host ints; a device→host sync only for features built on the GPU)."""
        if self._per_key is None:
            self._per_key = self._sum_per_key()
        return list(self._per_key)

    def _sum_per_key(self) -> list[int]:
        b = self.stride()
        return [int(x) for x in self._lengths.view(len(self._keys), b).sum(1).tolist()] if self._keys else []

    def to_dict(self) -> dict[str, JaggedFeature]:
        b = self.stride()
        out: dict[str, JaggedFeature] = {}
        start = 0
        for i, (k, n) in enumerate(zip(self._keys, self.length_per_key())):
            out[k] = JaggedFeature(self._values[start:start + n], self._lengths[i * b:(i + 1) * b])
            start += n
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        return SparseFeatures(self._keys, self._values.to(device, non_blocking=non_blocking),
                              self._lengths.to(device, non_blocking=non_blocking), self._per_key)

    def pin_memory(self) -> SparseFeatures:
        return SparseFeatures(self._keys, self._values.pin_memory(), self._lengths.pin_memory(), self._per_key)

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        self._values.record_stream(stream)
        self._lengths.record_stream(stream)

    def __repr__(self) -> str:
        return f"SparseFeatures(keys={self._keys}, B={self.stride()}, N={self._values.numel()})"


_KJT: list[Any] = []  # [KeyedJaggedTensor class or None] once tried


def _kjt_class() -> Any:
    if not _KJT:
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except Exception:  # absent or broken (e.g. fbgemm mismatch): fall back to SparseFeatures
            _KJT.append(None)
        else:
            _KJT.append(KeyedJaggedTensor)
    return _KJT[0]


def make_sparse(keys: list[str], values: Tensor, lengths: Tensor, kind: str = "auto") -> Any:
    """A `KeyedJaggedTensor` (kind "kjt", or "auto" when torchrec imports) else `SparseFeatures`.

    torchrec is imported lazily, on the first "auto"/"kjt" call.
    """
    if kind not in ("auto", "kjt", "native"):
        raise ValueError(f"sparse kind={kind!r} must be 'auto', 'kjt' or 'native'")
    if kind != "native":
        kjt = _kjt_class()
        if kjt is not None:
            return kjt(keys=keys, values=values, lengths=lengths)
        if kind == "kjt":
            raise ImportError("sparse_kind='kjt' needs torchrec (pip install torchrec), which did not import")
    return SparseFeatures(keys, values, lengths)


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch of B GEM-like samples, all tensors on one device.

    Attributes:
        event_ids: [T] int64 item ids of all events (jagged values).
        event_types: [T] int64 in [0, num_event_types).
        timestamps: [T] int64 seconds, non-decreasing within each sequence.
        seq_offsets: [B+1] int64 offsets of the sequences in the values.
        max_seq_len: host int, the longest sequence of the batch.
        sparse: KeyedJaggedTensor (torchrec) or SparseFeatures, keys = sparse feature names.
        dense: [B, num_dense] float32.
        domain: [B] int64 surface id.
        labels: [B, num_tasks] float32 0/1.
        probs: [B, num_tasks] float32 planted true probabilities (synthetic data) or None.
        seq_lengths_host: the B sequence lengths as host ints (or None), so a caller can
            count FLOPs or plan work without reading the device offsets (no GPU sync).
    """

    event_ids: Tensor
    event_types: Tensor
    timestamps: Tensor
    seq_offsets: Tensor
    max_seq_len: int
    sparse: Any
    dense: Tensor
    domain: Tensor
    labels: Tensor
    probs: Tensor | None = None
    seq_lengths_host: tuple[int, ...] | None = None

    @property
    def num_samples(self) -> int:
        return int(self.dense.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.event_ids.numel())

    @property
    def device(self) -> torch.device:
        return self.event_ids.device

    def seq_lengths(self) -> Tensor:
        """[B] int64 lengths, derived from the offsets."""
        return self.seq_offsets[1:] - self.seq_offsets[:-1]

    def _tensors(self) -> dict[str, Tensor]:
        names = ("event_ids", "event_types", "timestamps", "seq_offsets", "dense", "domain", "labels")
        out = {n: getattr(self, n) for n in names}
        if self.probs is not None:
            out["probs"] = self.probs
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy on `device`; with pinned host memory and non_blocking=True the copy is async."""
        moved: dict[str, Any] = {n: t.to(device, non_blocking=non_blocking) for n, t in self._tensors().items()}
        return dataclasses.replace(self, sparse=self.sparse.to(device, non_blocking=non_blocking), **moved)

    def pin_memory(self) -> Batch:
        pinned: dict[str, Any] = {n: t.pin_memory() for n, t in self._tensors().items()}
        return dataclasses.replace(self, sparse=self.sparse.pin_memory(), **pinned)

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        """Marks every tensor as used by `stream` (after a copy made on another stream)."""
        for t in self._tensors().values():
            t.record_stream(stream)
        self.sparse.record_stream(stream)
