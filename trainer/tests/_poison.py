"""Fault injection for the NaN-guard tests: the trainer's loss made non-finite on chosen calls."""
from __future__ import annotations

import math
from typing import Any

import torch

import gem_trainer._loop as loop


def nan_loss_at(at: set[int]) -> Any:
    """A stand-in for `gem_trainer._loop.loss_fn` whose n-th call (1-based) returns NaN for
    every n in `at` (install it with monkeypatch.setattr(loop, "loss_fn", nan_loss_at({...})))."""
    calls = {"n": 0}
    real = loop.loss_fn

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        out = real(logits, labels)
        return out * math.nan if calls["n"] in at else out

    return loss
