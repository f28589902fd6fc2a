"""Statistics for evaluation: the standard error of an AUC, so a reader can tell a real
difference between two models from held-out noise."""
from __future__ import annotations

import math

import torch


def auc_stderr(auc: float, labels: torch.Tensor) -> float:
    """Standard error of an empirical AUC (Hanley & McNeil 1982) from the label counts."""
    n1 = float(labels.sum())
    n0 = float(labels.numel()) - n1
    if n1 < 1 or n0 < 1 or not math.isfinite(auc):
        return math.nan
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n0 - 1) * (q2 - auc * auc)) / (n1 * n0)
    return math.sqrt(max(var, 0.0))
