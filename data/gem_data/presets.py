"""Preset DataConfigs: `tiny()` for CPU tests and `gem()` for GEM-like lengths.

Variants: `dataclasses.replace(presets.gem(), seed=1)` or keyword overrides.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from gem_data._config import DataConfig

__all__ = ["tiny", "gem"]


def tiny(**overrides: Any) -> DataConfig:
    """Small CPU config: lengths ~20-200 (log-normal, mean 80), cap 256, small vocabs."""
    return dataclasses.replace(DataConfig(), **overrides)


def gem(**overrides: Any) -> DataConfig:
    """GEM-like config: history lengths log-normal with mean ~1,000, cap 16,384, big vocabs."""
    base = DataConfig(
        num_event_types=8,
        event_vocab=1_000_000,
        sparse_features=(("user_id", 1_000_000), ("ad_id", 500_000), ("advertiser", 50_000),
                         ("page", 1_000), ("country", 200)),
        sparse_mean_len=3.0,
        num_dense=32,
        num_domains=4,
        tasks=("click", "conversion", "engagement"),
        seq_len_mean=1000.0,
        seq_len_sigma=1.0,
        seq_len_min=16,
        seq_len_cap=16_384,
    )
    return dataclasses.replace(base, **overrides)
