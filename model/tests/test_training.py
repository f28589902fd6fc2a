"""Trainability: every Kunlun switch trains; the tiny preset learns gem_data's planted task."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import gem_data

from _batch import KUNLUN, make_batch, tiny_config
from gem_model import GEMModel, presets


@pytest.mark.parametrize("name", list(KUNLUN))
def test_each_kunlun_option_trains(name: str) -> None:
    """Fit one fixed batch for 30 Adam steps: the mean of the last 5 losses must be at least
    30 % below the first (a mean, because a fitted batch can spike under Adam)."""
    torch.manual_seed(0)
    model = GEMModel(tiny_config(use_torchrec=False, **KUNLUN[name]))
    batch = make_batch(16, max_len=20, seed=11)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(30):
        loss = F.binary_cross_entropy_with_logits(model(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.7 * losses[0], losses


def _train(model: torch.nn.Module, batches: list[Any], lr: float) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for b in batches:
        loss = F.binary_cross_entropy_with_logits(model(b), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


class _BiasOnly(torch.nn.Module):
    """The best constant model: logit of the training base rate per task."""

    def __init__(self, labels: torch.Tensor) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.logit(labels.mean(0)))

    def forward(self, batch: Any) -> torch.Tensor:
        return self.bias.expand(batch.labels.shape[0], -1)


def test_tiny_preset_beats_bias_only_on_planted_task() -> None:
    """gem_data's planted synthetic task (tiny DataConfig, lengths mean 80, cap 256).

    Criterion, on 512 held-out samples after 60 steps of 64 samples (~300k events), averaged
    over the tasks: AUC >= bias-only AUC + 0.08 (the bias-only model, the training base rate,
    has AUC 0.5), and NE no worse than bias-only + 0.02 (calibration sanity: 60 steps give
    NE ~0.97-1.0, not yet clearly below 1; Bayes-optimal here: AUC ~0.77-0.82, NE ~0.77-0.85).
    """
    torch.manual_seed(0)
    dc = gem_data.presets.tiny()
    src = gem_data.SyntheticSource(dc, block_size=64)
    train = [src.batch(i, "native") for i in range(60)]
    held = [src.batch(10_000 + i, "native") for i in range(8)]
    model = GEMModel(presets.tiny(**presets.feature_sizes(dc), use_torchrec=False))
    _train(model, train, lr=3e-3)
    bias = _BiasOnly(torch.cat([b.labels for b in train]))
    labels = torch.cat([b.labels for b in held])

    def metrics(m: torch.nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            p = torch.cat([torch.sigmoid(m(b)) for b in held])
        aucs = [gem_data.auc(p[:, t], labels[:, t]) for t in range(dc.num_tasks)]
        nes = [gem_data.normalized_entropy(p[:, t], labels[:, t]) for t in range(dc.num_tasks)]
        return sum(aucs) / len(aucs), sum(nes) / len(nes)

    auc_m, ne_m = metrics(model)
    auc_b, ne_b = metrics(bias)
    assert auc_m >= auc_b + 0.08, (auc_m, auc_b)
    assert ne_m <= ne_b + 0.02, (ne_m, ne_b)
