"""A GEM-like jagged batch built inside the bench (the bench does not import gem_data).

Duck-types gem_data.Batch (INTERFACES.md): log-normal history lengths, uniform ids, a
minimal sparse-feature object with keys()/values()/lengths()/offsets()/to_dict(). The
containers (`Jag`, `Sparse`, `Batch`) are also the model tests' batch (model/tests/_batch.py
plants labels in them).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# The feature sizes of the benches' h200 model (the trainer's h200 data at that scale).
FEATURES: dict[str, Any] = dict(
    event_vocab=1_000_000, num_event_types=8,
    sparse_features=(("user_id", 1_000_000), ("ad_id", 500_000), ("advertiser", 50_000), ("page", 1_000), ("country", 200)),
    num_dense=32, num_domains=4, tasks=("click", "conversion", "engagement"),
)


def median_timer(device: torch.device) -> Callable[[Callable[[], object], int, int], float]:
    """`run(fn, warmup, iters)`: the median seconds of `iters` calls of `fn` after `warmup`
    untimed ones (CUDA events on a GPU, the wall clock on the CPU)."""

    def run(fn: Callable[[], object], warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        times: list[float] = []
        for _ in range(iters):
            if device.type == "cuda":
                a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return float(statistics.median(times))

    return run


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix sum of `lengths` (one more entry, starting at 0)."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


class Jag:
    """One sparse feature: `values` with per-sample `offsets`."""

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor) -> None:
        self._v, self._o = values, offsets

    def values(self) -> torch.Tensor:
        return self._v

    def offsets(self) -> torch.Tensor:
        return self._o

    def lengths(self) -> torch.Tensor:
        return self._o[1:] - self._o[:-1]


class Sparse:
    """Minimal SparseFeatures: keys() / values() / lengths() / offsets() / to_dict()."""

    def __init__(self, feats: dict[str, Jag]) -> None:
        self._f = feats

    def keys(self) -> list[str]:
        return list(self._f)

    def values(self) -> torch.Tensor:
        return torch.cat([j.values() for j in self._f.values()])

    def lengths(self) -> torch.Tensor:
        return torch.cat([j.lengths() for j in self._f.values()])

    def offsets(self) -> torch.Tensor:
        return offsets_of(self.lengths())

    def to_dict(self) -> dict[str, Jag]:
        return self._f

    def to(self, device: torch.device | str) -> Sparse:
        return Sparse({k: Jag(j.values().to(device), j.offsets().to(device)) for k, j in self._f.items()})


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
    probs: torch.Tensor | None = field(default=None)  # the tests' planted click/conversion probabilities


def lognormal_lengths(b: int, mean: float, sigma: float, cap: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    mu = math.log(mean) - sigma * sigma / 2
    raw = torch.exp(mu + sigma * torch.randn(b, generator=g))
    return [int(x) for x in raw.round().clamp(1, cap).tolist()]


def make_batch(cfg: Any, lengths: list[int], device: torch.device, seed: int = 0) -> Batch:
    """Random batch for GEMConfig `cfg` with the given sequence lengths."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    offsets = offsets_of(torch.tensor(lengths, dtype=torch.int64))
    t = int(offsets[-1])
    feats = {}
    for name, vocab in cfg.sparse_features:
        off = offsets_of(torch.randint(1, 4, (b,), generator=g))
        feats[name] = Jag(torch.randint(0, vocab, (int(off[-1]),), generator=g).to(device), off.to(device))
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
