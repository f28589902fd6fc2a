"""A non-finite loss skips the step; M in a row stop the run after saving the last good state."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import gem_trainer._loop as loop
from _poison import nan_loss_at
from gem_checkpoint import Checkpointer
from gem_trainer import presets_tiny, train


def test_isolated_nans_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "loss_fn", nan_loss_at({2, 5}))
    s = train(presets_tiny(steps=6, batch_size=16, eval_batches=0, progress=False))
    assert s["steps"] == 6 and s["bad_steps"] == 2 and math.isfinite(s["loss"])


def test_nans_in_a_row_stop_after_saving(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loop, "loss_fn", nan_loss_at(set(range(4, 100))))
    cfg = presets_tiny(steps=50, batch_size=16, eval_batches=0, progress=False, max_bad_steps=3,
                       ckpt_dir=str(tmp_path), ckpt_every=100)
    s = train(cfg)
    assert s["stop_reason"] == "nan" and s["steps"] == 3 and s["bad_steps"] == 3
    assert Checkpointer(str(tmp_path)).latest() == 3


def test_nans_after_the_warm_up_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # After the warm-up a step's loss is read during the next step (no host sync): the skip
    # is decided on the device, the count and the step number come out the same.
    from gem_trainer._metrics import WARMUP_STEPS

    monkeypatch.setattr(loop, "loss_fn", nan_loss_at({WARMUP_STEPS + 2, WARMUP_STEPS + 4}))
    s = train(presets_tiny(steps=12, batch_size=16, eval_batches=0, progress=False))
    assert s["steps"] == 12 and s["bad_steps"] == 2 and math.isfinite(s["loss"])
