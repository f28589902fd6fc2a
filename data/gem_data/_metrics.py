"""Ranking and calibration metrics: AUC and normalized entropy (NE).

NE (He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook", 2014) is the
mean log loss divided by the entropy of the base rate: 1.0 is a model that predicts the
base rate, lower is better. Both functions accept torch tensors or numpy arrays of any
shape (flattened) and return a Python float; a one-class input gives NaN.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_EPS = 1e-7


def _np(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite values")
    return arr


def _weighted_auc(scores: np.ndarray, pos_w: np.ndarray, neg_w: np.ndarray) -> float:
    # P(score of a positive > score of a negative) + 0.5 P(tie), with fractional weights so
    # the same code gives the empirical AUC (0/1 labels) and the expected AUC of the true
    # probabilities (weights p and 1-p).
    order = np.argsort(scores, kind="stable")
    s, pw, nw = scores[order], pos_w[order], neg_w[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    pos_g = np.add.reduceat(pw, starts)
    neg_g = np.add.reduceat(nw, starts)
    neg_below = np.cumsum(neg_g) - neg_g
    tot_p, tot_n = float(pw.sum()), float(nw.sum())
    if tot_p <= 0 or tot_n <= 0:
        return math.nan
    return float((pos_g * (neg_below + 0.5 * neg_g)).sum() / (tot_p * tot_n))


def auc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve, ties counted half. Args: scores [N], labels [N] in {0, 1}."""
    s, y = _np(scores, "scores"), _np(labels, "labels")
    if s.shape != y.shape:
        raise ValueError(f"scores shape {s.shape} and labels shape {y.shape} must match")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    return _weighted_auc(s, y, 1.0 - y)


def _entropy(p: np.ndarray | float) -> Any:
    p = np.clip(p, _EPS, 1 - _EPS)
    return -(p * np.log(p) + (1 - p) * np.log1p(-p))


def normalized_entropy(probs: Any, labels: Any) -> float:
    """Mean log loss of `probs` on `labels` divided by the entropy of the labels' base rate."""
    p, y = _np(probs, "probs"), _np(labels, "labels")
    if p.shape != y.shape:
        raise ValueError(f"probs shape {p.shape} and labels shape {y.shape} must match")
    if p.size and (p.min() < 0 or p.max() > 1):
        raise ValueError("probs must lie in [0, 1]")
    base = float(y.mean()) if y.size else math.nan
    if not 0 < base < 1:
        return math.nan
    pc = np.clip(p, _EPS, 1 - _EPS)
    logloss = float(-(y * np.log(pc) + (1 - y) * np.log1p(-pc)).mean())
    return logloss / float(_entropy(base))


def bayes_metrics(probs: Any, labels: Any = None, tasks: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    """Bayes-optimal AUC and NE per task, i.e. those of the planted true probabilities.

    Args:
        probs: [N, num_tasks] true probabilities (`Batch.probs`).
        labels: [N, num_tasks] sampled 0/1 labels. When given, the metrics are the empirical
            ones of `probs` on these labels (what a perfect model would score on this data);
            when None, their expectations over the label noise (AUC with weights p / 1-p,
            NE = mean H(p) / H(mean p)), which have no sampling noise.
        tasks: task names for the keys (default "task0", "task1", ...).

    Returns:
        {task: {"auc": float, "ne": float, "base_rate": float}}.
    """
    p = probs.detach().cpu().double().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs, np.float64)
    if p.ndim != 2:
        raise ValueError(f"probs shape {p.shape} must be [N, num_tasks]")
    y = None
    if labels is not None:
        y = labels.detach().cpu().double().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels, np.float64)
        if y.shape != p.shape:
            raise ValueError(f"labels shape {y.shape} must equal probs shape {p.shape}")
    names = tasks if tasks is not None else tuple(f"task{i}" for i in range(p.shape[1]))
    if len(names) != p.shape[1]:
        raise ValueError(f"{len(names)=} task names for {p.shape[1]} probability columns")
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        pi = p[:, i]
        if y is None:
            base = float(pi.mean())
            a = _weighted_auc(pi, pi, 1.0 - pi)
            ne = float(_entropy(pi).mean() / _entropy(base)) if 0 < base < 1 else math.nan
        else:
            base = float(y[:, i].mean())
            a, ne = auc(pi, y[:, i]), normalized_entropy(pi, y[:, i])
        out[name] = {"auc": a, "ne": ne, "base_rate": base}
    return out
