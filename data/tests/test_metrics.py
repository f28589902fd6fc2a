import math

import numpy as np
import pytest
import torch

from gem_data import auc, normalized_entropy


def _auc_pairs(s: np.ndarray, y: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


@pytest.mark.parametrize("n", [2, 7, 300])
def test_auc_matches_pairwise_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    y = rng.integers(0, 2, n)
    y[0], y[-1] = 0, 1
    s = np.round(rng.random(n), 1)  # many ties
    assert auc(s, y) == pytest.approx(_auc_pairs(s, y), abs=1e-12)
    assert auc(torch.tensor(s), torch.tensor(y)) == pytest.approx(_auc_pairs(s, y), abs=1e-12)


def test_auc_one_class_is_nan_and_bad_input() -> None:
    assert math.isnan(auc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError, match="labels"):
        auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="shape"):
        auc([0.1, 0.2], [0])


def test_ne_reference() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500).astype(float)
    p = rng.random(500)
    ll = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    b = y.mean()
    h = -(b * np.log(b) + (1 - b) * np.log(1 - b))
    assert normalized_entropy(p, y) == pytest.approx(ll / h, rel=1e-9)
    assert normalized_entropy(np.full(500, b), y) == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(ValueError, match="probs"):
        normalized_entropy([1.5], [1.0])


def test_auc_equals_torchmetrics() -> None:
    """The AUC users know (torchmetrics' BinaryAUROC), on random scores with many ties."""
    tm = pytest.importorskip("torchmetrics.functional.classification")
    rng = np.random.default_rng()
    for n in (2, 17, 5000):
        y = rng.integers(0, 2, n)
        y[0], y[-1] = 0, 1
        s = np.round(rng.random(n), int(rng.integers(1, 4)))
        want = float(tm.binary_auroc(torch.tensor(s), torch.tensor(y)))
        assert auc(s, y) == pytest.approx(want, abs=2e-7)  # torchmetrics sums in float32


def test_ne_equals_torchrec_metrics() -> None:
    """NE as torchrec.metrics computes it (cross entropy sum / entropy of the base rate)."""
    ne_mod = pytest.importorskip("torchrec.metrics.ne")
    rng = np.random.default_rng()
    n = 4000
    y = torch.from_numpy(rng.integers(0, 2, n).astype(np.float64))
    p = torch.from_numpy(rng.random(n))
    p[:3] = torch.tensor([0.0, 1.0, 1e-9])  # clamped alike (eta = our 1e-7)
    w = torch.ones(n, dtype=torch.float64)
    ce = ne_mod.compute_cross_entropy(y, p, w, 1e-7).sum()
    want = float(ne_mod.compute_ne(ce, w.sum(), y.sum(), (1 - y).sum(), 1e-7))
    assert normalized_entropy(p, y) == pytest.approx(want, rel=1e-12)
