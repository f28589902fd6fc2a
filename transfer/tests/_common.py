"""Shared test helpers: a small untrained-or-briefly-trained tiny teacher on gem_data's tiny preset."""
from __future__ import annotations

import os
import sys
from typing import Any

import torch

import gem_data
import gem_model

DATA = gem_data.presets.tiny(seq_len_mean=24.0, seq_len_cap=64)


def teacher(seed: int = 0, **overrides: Any) -> gem_model.GEMModel:
    torch.manual_seed(seed)
    cfg = gem_model.presets.tiny(**gem_model.presets.feature_sizes(DATA), use_torchrec=False, **overrides)
    return gem_model.GEMModel(cfg).eval()


def source(block_size: int = 8) -> gem_data.SyntheticSource:
    return gem_data.SyntheticSource(DATA, block_size=block_size)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e
