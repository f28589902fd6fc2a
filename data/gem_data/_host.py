"""HostBatch: the numpy form of a batch that sources produce and the loader merges.

Flat numpy buffers only (no per-row Python objects), so concatenating, gathering rows and
turning into torch tensors (`torch.from_numpy`, zero-copy) stay cheap.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gem_data._batch import Batch, make_sparse

I64 = np.dtype(np.int64)


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def jagged_take(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `idx` of a jagged array: (values, lengths), vectorized."""
    starts = offsets[idx]
    lens = offsets[idx + 1] - starts
    total = int(lens.sum())
    new_starts = np.cumsum(lens) - lens
    pos = np.repeat(starts - new_starts, lens) + np.arange(total, dtype=np.int64)
    return values[pos], lens


@dataclasses.dataclass
class HostBatch:
    """B samples as numpy arrays; `sparse_values[k]` are key k's ids, `sparse_lengths` [K, B]."""

    keys: tuple[str, ...]
    lengths: np.ndarray            # [B] int64
    event_ids: np.ndarray          # [T] int64
    event_types: np.ndarray        # [T] int64
    timestamps: np.ndarray         # [T] int64
    sparse_lengths: np.ndarray     # [K, B] int64
    sparse_values: list[np.ndarray]  # K x [N_k] int64
    dense: np.ndarray              # [B, D] float32
    domain: np.ndarray             # [B] int64
    labels: np.ndarray             # [B, num_tasks] float32
    probs: np.ndarray | None = None  # [B, num_tasks] float32

    @property
    def num_samples(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.event_ids.shape[0])

    @staticmethod
    def concat(parts: list[HostBatch]) -> HostBatch:
        if not parts:
            raise ValueError("HostBatch.concat needs at least one part")
        if len(parts) == 1:
            return parts[0]
        p0 = parts[0]
        probs = None if any(p.probs is None for p in parts) else np.concatenate([p.probs for p in parts if p.probs is not None])
        return HostBatch(
            keys=p0.keys,
            lengths=np.concatenate([p.lengths for p in parts]),
            event_ids=np.concatenate([p.event_ids for p in parts]),
            event_types=np.concatenate([p.event_types for p in parts]),
            timestamps=np.concatenate([p.timestamps for p in parts]),
            sparse_lengths=np.concatenate([p.sparse_lengths for p in parts], axis=1),
            sparse_values=[np.concatenate([p.sparse_values[k] for p in parts]) for k in range(len(p0.keys))],
            dense=np.concatenate([p.dense for p in parts]),
            domain=np.concatenate([p.domain for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            probs=probs,
        )

    def take(self, idx: np.ndarray) -> HostBatch:
        """The rows `idx` (int array) in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        offs = offsets_of(self.lengths)
        pos_ids, lens = jagged_take(self.event_ids, offs, idx)
        pos_types, _ = jagged_take(self.event_types, offs, idx)
        pos_ts, _ = jagged_take(self.timestamps, offs, idx)
        sv: list[np.ndarray] = []
        sl = np.empty((len(self.keys), idx.shape[0]), dtype=np.int64)
        for k in range(len(self.keys)):
            v, sl[k] = jagged_take(self.sparse_values[k], offsets_of(self.sparse_lengths[k]), idx)
            sv.append(v)
        return HostBatch(self.keys, lens, pos_ids, pos_types, pos_ts, sl, sv, self.dense[idx],
                         self.domain[idx], self.labels[idx], None if self.probs is None else self.probs[idx])

    def to_batch(self, sparse_kind: str = "auto") -> Batch:
        """Zero-copy torch view of the arrays (CPU), as a `Batch`."""
        def t(a: np.ndarray) -> torch.Tensor:
            # Arrow's zero-copy buffers are read-only; torch tensors must own writable memory
            return torch.from_numpy(a if a.flags.writeable else a.copy())

        lengths = t(np.ascontiguousarray(self.sparse_lengths.reshape(-1)))
        values = t(np.concatenate(self.sparse_values) if self.sparse_values else np.zeros(0, I64))
        return Batch(
            event_ids=t(self.event_ids),
            event_types=t(self.event_types),
            timestamps=t(self.timestamps),
            seq_offsets=t(offsets_of(self.lengths)),
            max_seq_len=int(self.lengths.max()) if self.lengths.size else 0,
            seq_lengths_host=tuple(int(n) for n in self.lengths),
            sparse=make_sparse(list(self.keys), values, lengths, sparse_kind),
            dense=t(self.dense),
            domain=t(self.domain),
            labels=t(self.labels),
            probs=None if self.probs is None else t(self.probs),
        )
