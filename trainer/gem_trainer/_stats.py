"""Statistics for evaluation: the standard error of an AUC, so a reader can tell a real
difference between two models from held-out noise."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

import gem_data


def auc_stderr(auc: float, labels: torch.Tensor) -> float:
    """Standard error of an empirical AUC (Hanley & McNeil 1982) from the label counts."""
    n1 = float(labels.sum())
    n0 = float(labels.numel()) - n1
    if n1 < 1 or n0 < 1 or not math.isfinite(auc):
        return math.nan
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n0 - 1) * (q2 - auc * auc)) / (n1 * n0)
    return math.sqrt(max(var, 0.0))


def task_metrics(probs: torch.Tensor, labels: torch.Tensor, tasks: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per-task NE, AUC, the AUC's standard error and the sample count.

    Args: probs, labels `[N, num_tasks]` (labels 0/1); tasks: the task names in column order.
    """
    out: dict[str, dict[str, float]] = {}
    for i, task in enumerate(tasks):
        a = gem_data.auc(probs[:, i], labels[:, i])
        out[task] = {"ne": gem_data.normalized_entropy(probs[:, i], labels[:, i]), "auc": a,
                     "auc_se": auc_stderr(a, labels[:, i]), "eval_samples": int(labels.shape[0])}
    return out
