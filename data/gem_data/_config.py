"""DataConfig: the feature sizes and length distribution of a GEM-like data set.

The model and trainer read the feature sizes from here (the model keeps its own copy, so
it never imports gem_data); the synthetic source reads everything.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Shape of one GEM-like sample and of the synthetic distribution.

    Attributes:
        num_event_types: event types in the user sequence, ids in [0, num_event_types).
        event_vocab: item-id vocabulary of the sequence events.
        sparse_features: (name, vocab) of each non-sequence sparse id feature.
        sparse_mean_len: mean number of ids per sample of a sparse feature (Poisson).
        num_dense: dense float features per sample.
        num_domains: surfaces (domains), ids in [0, num_domains).
        tasks: objective names; labels are [B, len(tasks)].
        seq_len_mean: mean of the log-normal history length before clipping.
        seq_len_sigma: log-space standard deviation of the history length.
        seq_len_min: lower clip of a history length (0 allowed).
        seq_len_cap: upper clip of a history length (the model's max length).
        zipf_alpha: exponent of the Zipf popularity of item and sparse ids (> 1).
        seed: seed of the synthetic data and of its planted label function.
    """

    num_event_types: int = 4
    event_vocab: int = 10_000
    sparse_features: tuple[tuple[str, int], ...] = (("user_id", 5_000), ("ad_id", 2_000), ("page", 100))
    sparse_mean_len: float = 2.0
    num_dense: int = 8
    num_domains: int = 3
    tasks: tuple[str, ...] = ("click", "conversion")
    seq_len_mean: float = 80.0
    seq_len_sigma: float = 0.6
    seq_len_min: int = 1
    seq_len_cap: int = 256
    zipf_alpha: float = 1.1
    seed: int = 0

    def __post_init__(self) -> None:
        pos = ("num_event_types", "event_vocab", "num_domains", "seq_len_cap")
        for name in pos:
            if getattr(self, name) < 1:
                raise ValueError(f"DataConfig.{name}={getattr(self, name)} must be >= 1")
        if self.num_dense < 0:
            raise ValueError(f"DataConfig.num_dense={self.num_dense} must be >= 0")
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"DataConfig.tasks={self.tasks} must be non-empty and unique")
        names = [n for n, _ in self.sparse_features]
        if len(set(names)) != len(names):
            raise ValueError(f"DataConfig.sparse_features names {names} must be unique")
        for n, v in self.sparse_features:
            if not n or v < 1:
                raise ValueError(f"DataConfig.sparse_features entry ({n!r}, {v}) needs a name and vocab >= 1")
        if not 0 <= self.seq_len_min <= self.seq_len_cap:
            raise ValueError(
                f"DataConfig.seq_len_min={self.seq_len_min} must be in [0, seq_len_cap={self.seq_len_cap}]")
        if not (self.seq_len_mean > 0 and math.isfinite(self.seq_len_mean)):
            raise ValueError(f"DataConfig.seq_len_mean={self.seq_len_mean} must be a positive number")
        if not self.seq_len_sigma >= 0:
            raise ValueError(f"DataConfig.seq_len_sigma={self.seq_len_sigma} must be >= 0")
        if not self.zipf_alpha > 1.0:
            raise ValueError(f"DataConfig.zipf_alpha={self.zipf_alpha} must be > 1")
        if not self.sparse_mean_len >= 0:
            raise ValueError(f"DataConfig.sparse_mean_len={self.sparse_mean_len} must be >= 0")

    @property
    def sparse_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.sparse_features)

    @property
    def sparse_vocabs(self) -> tuple[int, ...]:
        return tuple(v for _, v in self.sparse_features)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)
