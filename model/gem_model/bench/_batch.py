"""A GEM-like jagged batch built inside the bench (the bench does not import gem_data).

Duck-types gem_data.Batch (INTERFACES.md): log-normal history lengths, uniform ids, a
minimal sparse-feature object with keys()/values()/lengths()/offsets()/to_dict().
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


class _Jag:
    def __init__(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        self._v, self._o = values, offsets

    def values(self) -> torch.Tensor:
        return self._v

    def offsets(self) -> torch.Tensor:
        return self._o

    def lengths(self) -> torch.Tensor:
        return self._o[1:] - self._o[:-1]


class Sparse:
    def __init__(self, feats: dict[str, _Jag]) -> None:
        self._f = feats

    def keys(self) -> list[str]:
        return list(self._f)

    def values(self) -> torch.Tensor:
        return torch.cat([j.values() for j in self._f.values()])

    def lengths(self) -> torch.Tensor:
        return torch.cat([j.lengths() for j in self._f.values()])

    def to_dict(self) -> dict[str, _Jag]:
        return self._f


@dataclass
class Batch:
    event_ids: torch.Tensor
    event_types: torch.Tensor
    timestamps: torch.Tensor
    seq_offsets: torch.Tensor
    max_seq_len: int
    sparse: Any
    dense: torch.Tensor
    domain: torch.Tensor
    labels: torch.Tensor


def lognormal_lengths(b: int, mean: float, sigma: float, cap: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    mu = math.log(mean) - sigma * sigma / 2
    raw = torch.exp(mu + sigma * torch.randn(b, generator=g))
    return [int(x) for x in raw.round().clamp(1, cap).tolist()]


def make_batch(cfg: Any, lengths: list[int], device: torch.device, seed: int = 0) -> Batch:
    """Random batch for GEMConfig `cfg` with the given sequence lengths."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    lens = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)])
    t = int(offsets[-1])
    feats = {}
    for name, vocab in cfg.sparse_features:
        n = torch.randint(1, 4, (b,), generator=g)
        off = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
        feats[name] = _Jag(torch.randint(0, vocab, (int(off[-1]),), generator=g).to(device), off.to(device))
    return Batch(
        event_ids=torch.randint(0, cfg.event_vocab, (t,), generator=g).to(device),
        event_types=torch.randint(0, cfg.num_event_types, (t,), generator=g).to(device),
        timestamps=torch.cumsum(torch.randint(0, 3600, (t,), generator=g), 0).to(device),
        seq_offsets=offsets.to(device),
        max_seq_len=max(lengths),
        sparse=Sparse(feats),
        dense=torch.randn(b, cfg.num_dense, generator=g).to(device),
        domain=torch.randint(0, cfg.num_domains, (b,), generator=g).to(device),
        labels=torch.randint(0, 2, (b, cfg.num_tasks), generator=g).float().to(device),
    )
