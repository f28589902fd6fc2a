"""The quality bench's pieces: AUC standard error, held-out set, identical streams."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gem_data
import gem_model
from gem_trainer import _loop
from gem_trainer import _quality as Q
from gem_trainer._stats import auc_stderr
from gem_trainer.config import tiny


def test_auc_stderr_matches_the_spread_of_resampled_aucs() -> None:
    rng = np.random.default_rng(0)
    n = 4096
    y = (rng.random(n) < 0.3).astype(np.float64)
    s = y * 0.8 + rng.standard_normal(n)
    a = gem_data.auc(s, y)
    se = auc_stderr(a, torch.tensor(y))
    boots = []
    for _ in range(200):
        i = rng.integers(0, n, n)
        boots.append(gem_data.auc(s[i], y[i]))
    assert se == pytest.approx(float(np.std(boots)), rel=0.25)
    assert math.isnan(auc_stderr(0.7, torch.zeros(10)))


def test_held_out_is_large_and_the_same_for_every_model() -> None:
    cfg = tiny(eval_batches=64)
    dcfg = _loop.data_config(cfg)
    a = Q.held_out(cfg, dcfg, torch.device("cpu"))
    b = Q.held_out(cfg, dcfg, torch.device("cpu"))
    assert a.num_samples >= 4096
    assert torch.equal(a.labels, b.labels)
    assert set(a.bayes) == set(dcfg.tasks)


def test_curve_trains_baselines_on_the_trainer_stream() -> None:
    cfg = tiny(steps=40, eval_batches=16, batch_size=64, lr=1e-2)
    dcfg = _loop.data_config(cfg)
    mcfg = _loop.model_config(cfg, dcfg)
    ho = Q.held_out(cfg, dcfg, torch.device("cpu"))
    torch.manual_seed(0)
    model = gem_model.LogisticRegression(mcfg)
    before = Q.score(model, ho, False)
    rows = Q.curve("logreg", model, cfg, dcfg, torch.device("cpu"), ho, [10, 40])
    assert [r["step"] for r in rows] == [10, 40]
    assert [r["samples"] for r in rows] == [640, 2560]
    # A zero-initialised logistic regression scores 0.5; trained on the planted task it learns.
    assert before["click"]["auc"] == pytest.approx(0.5)
    assert rows[-1]["tasks"]["click"]["auc"] > 0.6


def test_replayed_stream_gives_the_same_training() -> None:
    cfg = tiny(steps=12, eval_batches=4, batch_size=32, lr=1e-2)
    dcfg = _loop.data_config(cfg)
    mcfg = _loop.model_config(cfg, dcfg)
    ho = Q.held_out(cfg, dcfg, torch.device("cpu"))
    stream: list[object] = []
    runs = []
    for _ in range(2):  # first run records the stream, second replays it
        torch.manual_seed(0)
        model = gem_model.PooledMLP(mcfg)
        runs.append(Q.curve("mlp", model, cfg, dcfg, torch.device("cpu"), ho, [12], stream=stream))
    assert len(stream) == 12
    assert runs[0][-1]["tasks"] == runs[1][-1]["tasks"]
