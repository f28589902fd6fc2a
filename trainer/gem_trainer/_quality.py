"""Quality bench core: GEM vs plain rankers on identical sample streams and one held-out set.

Every model sees the same batches in the same order (the trainer's own loader, rebuilt per
model from the same seed), takes the same number of optimizer updates, and is scored at the
same sample counts on the same held-out blocks (the trainer's evaluation split). AUC/NE are
reported next to the planted task's Bayes-optimal values, with the AUC's standard error
(Hanley & McNeil 1982), so a user can see whether two models differ by more than noise.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import gem_data
import gem_model
from gem_trainer import _loop
from gem_trainer._stats import task_metrics
from gem_trainer.config import TrainConfig


@dataclass
class HeldOut:
    """The held-out batches (on the device), their labels and the Bayes-optimal metrics."""

    batches: list[Any]
    labels: torch.Tensor
    bayes: dict[str, dict[str, float]]
    tasks: tuple[str, ...]

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])


def held_out(cfg: TrainConfig, dcfg: gem_data.DataConfig, device: torch.device) -> HeldOut:
    """The trainer's evaluation split (`eval_batches` batches), materialised once."""
    loader = _loop.make_loader(cfg, dcfg, 0, 1, device, eval_split=True)
    batches = []
    for _ in range(cfg.eval_batches):
        try:
            batches.append(next(loader))
        except StopIteration:
            break
    loader.close()
    labels = torch.cat([b.labels.cpu() for b in batches])
    truth = torch.cat([b.probs.cpu() for b in batches]) if batches[0].probs is not None else None
    bayes = gem_data.bayes_metrics(truth, labels, dcfg.tasks) if truth is not None else {}
    return HeldOut(batches, labels, bayes, tuple(dcfg.tasks))


def score(model: torch.nn.Module, ho: HeldOut, amp: str | None) -> dict[str, dict[str, float]]:
    """Per-task AUC (+ standard error) and NE of `model` on the held-out set."""
    was = model.training
    model.eval()
    probs = []
    with torch.no_grad():
        for b in ho.batches:
            with _loop.autocast(amp):
                probs.append(torch.sigmoid(model(b).float()).cpu())
    model.train(was)
    return task_metrics(torch.cat(probs), ho.labels, ho.tasks)


def lift(auc: float, bayes: float) -> float:
    """Share of the achievable AUC lift over chance: (auc - 0.5) / (bayes - 0.5)."""
    return (auc - 0.5) / (bayes - 0.5) if bayes > 0.5 else math.nan


def curve(
    name: str, model: torch.nn.Module, cfg: TrainConfig, dcfg: gem_data.DataConfig,
    device: torch.device, ho: HeldOut, eval_at: Sequence[int],
    make_opt: Callable[[torch.nn.Module], Any] | None = None,
    stream: list[Any] | None = None,
) -> list[dict[str, Any]]:
    """Trains `model` for cfg.steps on the trainer's stream, scoring it at each step in eval_at.

    `stream`: None reads the trainer's loader; an empty list reads the loader and keeps each
    batch in it; a filled list is replayed (the very same batches, no loader cost).
    Returns one row per evaluation: {"model", "step", "samples", "tasks": {task: metrics}}.
    """
    if make_opt is None:  # the trainer's optimizer, with the trainer's table gradients
        _loop.apply_table_grads(model, cfg, world=1)  # (cfg.table_grads: dense unless asked)
        opt = _loop.build_optimizer(model, cfg)
    else:
        opt = make_opt(model)
    amp = _loop.autocast_device(cfg, device)
    torch.manual_seed(cfg.seed)
    replay = stream is not None and len(stream) >= cfg.steps
    loader = None if replay else _loop.make_loader(cfg, dcfg, 0, 1, device)
    rows: list[dict[str, Any]] = []
    samples, t0 = 0, time.perf_counter()
    targets = sorted(set(eval_at))
    for step in range(1, cfg.steps + 1):
        if replay:
            assert stream is not None
            batch = stream[step - 1]
        else:
            assert loader is not None
            batch = next(loader)
            if stream is not None:
                stream.append(batch)
        if hasattr(opt, "set_step"):
            opt.set_step(step - 1)
        with _loop.autocast(amp):
            logits = model(batch)
        loss = _loop.loss_fn(logits, batch.labels)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)
        samples += batch.num_samples
        if step in targets:
            rows.append({"model": name, "step": step, "samples": samples,
                         "train_s": time.perf_counter() - t0, "tasks": score(model, ho, amp)})
    if loader is not None:
        loader.close()
    return rows


def baselines(mcfg: gem_model.GEMConfig) -> dict[str, Callable[[], torch.nn.Module]]:
    """The simple rankers, and GEM with its sequence attention switched off."""
    import dataclasses

    return {
        "logreg": lambda: gem_model.LogisticRegression(mcfg),
        "pooled_mlp": lambda: gem_model.PooledMLP(mcfg),
        "gem_no_attention": lambda: gem_model.GEMModel(dataclasses.replace(mcfg, sequence_attention=False)),
    }
