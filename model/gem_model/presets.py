"""GEMConfig presets: `tiny` (CPU, trains in seconds) and `h200` (fills one H200).

Feature sizes come from the data (the model does not import gem_data):

    cfg = presets.tiny(**presets.feature_sizes(data_cfg))   # any object with DataConfig's fields
    cfg = presets.h200(event_vocab=1_000_000, num_event_types=8, sparse_features=(("user", 10**6),),
                       num_dense=16, num_domains=4, tasks=("click", "conversion"), window=512)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gem_model._config import GEMConfig

_FEATURES = ("event_vocab", "num_event_types", "sparse_features", "num_dense", "num_domains", "tasks")


def feature_sizes(data_config: Any) -> dict[str, Any]:
    """The feature-size fields of GEMConfig read (by duck typing) from a gem_data.DataConfig."""
    if hasattr(data_config, "sparse_features"):
        sparse = tuple((str(n), int(v)) for n, v in data_config.sparse_features)
    else:
        sparse = tuple(
            (str(n), int(v)) for n, v in zip(data_config.sparse_names, data_config.sparse_vocabs, strict=True)
        )
    return {
        "event_vocab": int(data_config.event_vocab),
        "num_event_types": int(data_config.num_event_types),
        "sparse_features": sparse,
        "num_dense": int(data_config.num_dense),
        "num_domains": int(data_config.num_domains),
        "tasks": tuple(str(t) for t in data_config.tasks),
    }


def _make(defaults: dict[str, Any], kwargs: dict[str, Any]) -> GEMConfig:
    missing = [f for f in _FEATURES if f not in kwargs and f != "tasks"]
    if missing:
        raise TypeError(f"feature sizes {missing} must be given (see presets.feature_sizes)")
    unknown = set(kwargs) - {f.name for f in dataclasses.fields(GEMConfig)}
    if unknown:
        raise TypeError(f"unknown GEMConfig fields {sorted(unknown)}")
    return GEMConfig(**{**defaults, **kwargs})


def tiny(**kwargs: Any) -> GEMConfig:
    """CPU-sized InterFormer (d_model 32, 2 layers): trains in seconds. Kunlun switches off."""
    defaults: dict[str, Any] = dict(
        d_model=32, num_heads=2, num_layers=2, emb_dim=16, event_emb_dim=16, ffn_mult=2,
        num_cls=2, num_pma_seeds=2, num_recent=2, head_hidden=32, gdpa_kv_len=4,
        hier_seeds=6, hier_rank=2,
    )
    return _make(defaults, kwargs)


def h200(**kwargs: Any) -> GEMConfig:
    """One-H200 size: d_model 1024, 8 heads of D=128, 4 layers, Kunlun switches on.

    GDPA FFN (32-token kv), hierarchical pooling (32 seeds → 8), computation skip; full
    attention over the history unless `window=` is given; event widths need the data's
    event types, so pass `event_widths=` to turn event-level personalization on.
    """
    defaults: dict[str, Any] = dict(
        d_model=1024, num_heads=8, num_layers=4, emb_dim=128, event_emb_dim=256, ffn_mult=4,
        num_cls=4, num_pma_seeds=8, num_recent=8, head_hidden=512,
        gdpa_ffn=True, gdpa_kv_len=32, hierarchical_pooling=True, hier_seeds=32, hier_rank=8,
        computation_skip=True, stream_bias=False,
    )
    return _make(defaults, kwargs)
