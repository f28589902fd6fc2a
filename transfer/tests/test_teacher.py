"""train_teacher: learns, honours its sample / time limits, token-budget batches; bad arguments."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from _common import source, teacher
from gem_transfer import train_teacher
from gem_transfer._window import BlockWindow


def _held_out_bce(model: torch.nn.Module) -> float:
    src = source(block_size=64)
    with torch.no_grad():
        return sum(float(F.binary_cross_entropy_with_logits(model(b), b.labels))
                   for b in (src.batch(5000 + i, "native") for i in range(4))) / 4


def test_teacher_learns_within_sample_budget() -> None:
    model = teacher(seed=4)
    before = _held_out_bce(model)
    log = io.StringIO()
    info = train_teacher(model, source(block_size=16), batch_blocks=2, max_samples=800, lr=3e-3, log=log,
                         log_every=10)
    assert info["samples"] == 800 and info["steps"] == 25 and info["stopped_by"] == "samples"
    assert not model.training and "teacher step 25: 800/800 samples" in log.getvalue()
    assert _held_out_bce(model) < before - 0.05, (before, _held_out_bce(model))


def test_time_limit_and_token_budget() -> None:
    model = teacher(seed=5)
    info = train_teacher(model, BlockWindow(source(block_size=8), 0, 50), tokens_per_batch=400, max_seconds=1e-6,
                         log=io.StringIO())
    assert info["steps"] == 1 and info["stopped_by"] == "seconds" and info["tokens"] >= 400
    info = train_teacher(model, BlockWindow(source(block_size=8), 0, 6), batch_blocks=2, log=io.StringIO())
    assert info["samples"] == 48 and info["stopped_by"] == "samples"


def test_bad_arguments_are_named() -> None:
    model, src = teacher(), source()
    with pytest.raises(ValueError, match="needs max_samples"):
        train_teacher(model, src)
    with pytest.raises(ValueError, match="batch_blocks=0"):
        train_teacher(model, src, batch_blocks=0, max_samples=8)
    with pytest.raises(ValueError, match="max_seconds=0"):
        train_teacher(model, src, max_samples=8, max_seconds=0)
