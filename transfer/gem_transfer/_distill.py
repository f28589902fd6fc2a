"""Training students from labels alone and with each transfer method; evaluation.

Methods (`METHODS`), all on the same samples:
    label_only      BCE on the labels; own tables.
    kd              standard knowledge distillation (Hinton et al. 2015): (1 - a) BCE(labels)
                    + a T^2 BCE(student / T, sigmoid(teacher / T)); own tables.
    representation  labels only, plus the teacher's pooled representation as an input.
    sharing         labels only, on the teacher's embedding tables, frozen.
    combined        all three: teacher tables + representation + the KD loss.

Each student keeps the epoch with the lowest label BCE on a validation split of its own
training samples (`val_fraction`): the held-out evaluation set is never looked at.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import gem_data
from gem_transfer._scoring import read_scores
from gem_transfer._student import Student, StudentConfig

METHODS = ("label_only", "kd", "representation", "sharing", "combined")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """How a student is trained.

    Attributes:
        epochs: maximum passes over the student's training samples.
        batch_size: samples per step.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        kd_weights: candidates for a, the weight of the soft-target loss (kd and combined):
            a student is trained with each and the one with the lowest validation loss is
            kept (so standard KD gets its best weight, not a fixed guess).
        temperature: T of the soft targets.
        val_fraction: share of the training samples held back to pick the best epoch.
        patience: epochs without a better validation loss before stopping.
        seed: student init, split and shuffling.
    """

    epochs: int = 40
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 1e-4
    kd_weights: tuple[float, ...] = (0.5, 0.9, 1.0)
    temperature: float = 1.0
    val_fraction: float = 0.1
    patience: int = 6
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "patience"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DistillConfig.{name}={v!r} must be an int >= 1")
        if not self.lr > 0 or not self.temperature > 0 or not self.weight_decay >= 0:
            raise ValueError(f"DistillConfig lr={self.lr}, temperature={self.temperature} must be > 0 "
                             f"and weight_decay={self.weight_decay} >= 0")
        if not self.kd_weights or not all(0.0 <= a <= 1.0 for a in self.kd_weights):
            raise ValueError(f"DistillConfig.kd_weights={self.kd_weights} must be non-empty, each in [0, 1]")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"DistillConfig.val_fraction={self.val_fraction} must be in (0, 1)")


@dataclasses.dataclass
class ScoredSet:
    """Samples with the teacher's outputs, row-aligned.

    Attributes:
        host: the samples (a gem_data HostBatch: numpy buffers, `take`, `to_batch`).
        teacher_logits: [N, num_tasks] float32.
        teacher_repr: [N, R] float32.
    """

    host: Any
    teacher_logits: torch.Tensor
    teacher_repr: torch.Tensor

    def __len__(self) -> int:
        return int(self.host.num_samples)

    @property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.host.labels, np.float32))

    @staticmethod
    def load(source: Any, blocks: Sequence[int], scores_dir: Any) -> ScoredSet:
        """Reads `blocks` of `source` and joins the score shards of `scores_dir` by (block, row).

        Raises ValueError if any (block, row) is missing or duplicated in the scores, or a
        block cannot be read.
        """
        blocks = [int(b) for b in blocks]
        if len(set(blocks)) != len(blocks):
            raise ValueError("blocks must be unique")
        parts = []
        for b in blocks:
            h = source.read(b)
            if h is None:
                raise ValueError(f"block {b} of the source is bad (skipped): it cannot be a student sample")
            parts.append(h)
        rows = [p.num_samples for p in parts]
        sc = read_scores(scores_dir, blocks=blocks, rows_per_block=rows)
        host = type(parts[0]).concat(parts)
        start = dict(zip(blocks, np.cumsum([0] + rows[:-1]).tolist()))
        idx = np.fromiter((start[int(b)] for b in sc["block"]), np.int64, len(sc["block"])) + sc["row"]
        logits = np.empty_like(sc["logits"])
        rep = np.empty_like(sc["repr"])
        logits[idx], rep[idx] = sc["logits"], sc["repr"]
        return ScoredSet(host, torch.from_numpy(logits), torch.from_numpy(rep))

    def take(self, idx: np.ndarray) -> ScoredSet:
        t = torch.from_numpy(idx)
        return ScoredSet(self.host.take(idx), self.teacher_logits[t], self.teacher_repr[t])


def method_config(method: str, base: StudentConfig, repr_dim: int) -> tuple[StudentConfig, bool]:
    """(the StudentConfig, whether the KD loss is on) of a method in METHODS."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {METHODS}")
    rep = repr_dim if method in ("representation", "combined") else 0
    share = "frozen" if method in ("sharing", "combined") else "none"
    return dataclasses.replace(base, repr_dim=rep, share=share), method in ("kd", "combined")


def _loss(z: torch.Tensor, y: torch.Tensor, teacher: torch.Tensor | None, a: float, t: float) -> torch.Tensor:
    hard = F.binary_cross_entropy_with_logits(z, y)
    if teacher is None or a == 0.0:
        return hard
    soft = F.binary_cross_entropy_with_logits(z / t, torch.sigmoid(teacher / t))
    return (1.0 - a) * hard + a * t * t * soft


def _forward(student: Student, data: ScoredSet, device: torch.device) -> torch.Tensor:
    batch = data.host.to_batch("native").to(device)
    rep = data.teacher_repr.to(device) if student.cfg.repr_dim else None
    out: torch.Tensor = student(batch, rep)
    return out


def predict(student: Student, data: ScoredSet, *, batch_size: int = 1024,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """Student probabilities `[N, num_tasks]` (CPU float32), computed on `device` (the student
    is moved there for the call and back afterwards)."""
    dev = torch.device(device)
    home = student.repr_mean.device
    student.to(dev).eval()
    out = []
    try:
        with torch.no_grad():
            for s in range(0, len(data), batch_size):
                part = data.take(np.arange(s, min(s + batch_size, len(data))))
                out.append(torch.sigmoid(_forward(student, part, dev)).float().cpu())
    finally:
        student.to(home)
    return torch.cat(out)


def _trained_state(model: Student) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith("frozen_")}


def train_student(method: str, data: ScoredSet, features: Any, *, student: StudentConfig | None = None,
                  train: DistillConfig | None = None, tables: Mapping[str, torch.Tensor] | None = None,
                  device: torch.device | str = "cpu",
                  max_seconds: float | None = None) -> tuple[Student, dict[str, Any]]:
    """Trains one student with `method` on `data`.

    Args:
        method: one of METHODS.
        data: the student's training samples with the teacher's outputs.
        features: the data's feature sizes (gem_data.DataConfig or gem_model.GEMConfig).
        student: base sizes (the method sets repr_dim and share).
        train: DistillConfig.
        tables: `teacher_tables(teacher)`, needed by "sharing" and "combined".
        max_seconds: wall-time limit of the whole call (None: none), shared equally by the KD
            weight candidates; a fit that runs out stops (mid-epoch, after at least one step)
            and keeps its best validated state so far ("stopped_by": "time").

    Returns:
        (the student at its best validation epoch (and KD weight), on CPU in eval mode,
         {"method", "epochs", "best_epoch", "val_loss", "kd_weight", "train_samples"}).
    """
    tc = train or DistillConfig()
    cfg, kd = method_config(method, student or StudentConfig(), int(data.teacher_repr.shape[1]))
    dev = torch.device(device)
    perm = np.random.default_rng(tc.seed).permutation(len(data))
    n_val = max(1, int(round(len(data) * tc.val_fraction)))
    if len(data) - n_val < 1:
        raise ValueError(f"{len(data)} training samples leave none after val_fraction={tc.val_fraction}")
    val, tr = data.take(np.sort(perm[:n_val])), perm[n_val:]
    best: tuple[Student, dict[str, Any]] | None = None
    weights = tc.kd_weights if kd else (0.0,)
    t0 = time.perf_counter()
    for i, a in enumerate(weights):
        until = math.inf if max_seconds is None else t0 + max_seconds * (i + 1) / len(weights)
        model, info = _fit(cfg, features, tables, data, tr, val, a, tc, dev, until)
        if best is None or info["val_loss"] < best[1]["val_loss"]:
            best = (model, info)
    assert best is not None
    model, info = best
    info.update(method=method, train_samples=int(len(tr)))
    return model.cpu().eval(), info


def _fit(cfg: StudentConfig, features: Any, tables: Mapping[str, torch.Tensor] | None, data: ScoredSet,
         tr: np.ndarray, val: ScoredSet, a: float, tc: DistillConfig, dev: torch.device,
         until: float = math.inf) -> tuple[Student, dict[str, Any]]:
    """One student, KD weight `a` (0: labels only), early-stopped on the validation label loss
    (and stopped at wall time `until`, a perf_counter value)."""
    torch.manual_seed(tc.seed)
    model = Student(cfg, features, tables).to(dev)
    if cfg.repr_dim:
        model.set_repr_stats(data.teacher_repr[torch.from_numpy(tr)])
    rng = np.random.default_rng([tc.seed, 1])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc.lr,
                            weight_decay=tc.weight_decay)
    best, best_state, best_epoch, waited, epoch = math.inf, _trained_state(model), 0, 0, 0
    stopped = "epochs"
    for epoch in range(1, tc.epochs + 1):
        model.train()
        order = rng.permutation(tr)
        for s in range(0, len(order), tc.batch_size):
            if s and time.perf_counter() > until:
                break
            part = data.take(order[s:s + tc.batch_size])
            z = _forward(model, part, dev)
            loss = _loss(z, part.labels.to(dev), part.teacher_logits.to(dev) if a > 0 else None, a, tc.temperature)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        model.eval()
        with torch.no_grad():
            v = float(F.binary_cross_entropy_with_logits(_forward(model, val, dev), val.labels.to(dev)))
        if v < best - 1e-5:
            best, best_epoch, waited = v, epoch, 0
            best_state = _trained_state(model)
        else:
            waited += 1
            if waited >= tc.patience:
                stopped = "patience"
                break
        if time.perf_counter() > until:
            stopped = "time"
            break
    model.load_state_dict(best_state, strict=False)  # the frozen tables never changed
    return model, {"epochs": epoch, "best_epoch": best_epoch, "val_loss": best, "kd_weight": a,
                   "stopped_by": stopped}


def evaluate(probs: torch.Tensor, labels: torch.Tensor, tasks: Sequence[str]) -> dict[str, dict[str, float]]:
    """{task: {"auc", "ne"}} of probabilities `[N, num_tasks]` on labels `[N, num_tasks]`."""
    if probs.shape != labels.shape or probs.dim() != 2 or probs.shape[1] != len(tasks):
        raise ValueError(f"probs.shape={tuple(probs.shape)} and labels.shape={tuple(labels.shape)} must be "
                         f"equal [N, {len(tasks)}]")
    return {t: {"auc": gem_data.auc(probs[:, i], labels[:, i]),
                "ne": gem_data.normalized_entropy(probs[:, i], labels[:, i])} for i, t in enumerate(tasks)}
