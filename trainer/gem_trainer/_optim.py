"""The trainer's optimizers: row-wise Adagrad for embedding tables, AdamW for the rest.

Why two: an embedding row is updated only when its id occurs, and in a Zipf-distributed id
stream most rows occur a handful of times. AdamW at a transformer's learning rate (1e-3)
moves such a row by ~1e-3 per occurrence, so the tail never learns (measured: GEM lost to a
pooled MLP by up to 0.10 AUC, model/BENCHMARKS.md). Recommendation practice (DLRM, torchrec,
fbgemm's `EXACT_ROWWISE_ADAGRAD`) trains tables with row-wise Adagrad at a large step: one
accumulator per row (the mean squared gradient over the row's columns), so a rare row takes
a large first step and a frequent one anneals. This file is that optimizer (the GPU box has no
fbgemm; the update is `gem_kernels.rowwise_adagrad_`, one Triton pass on CUDA), with the same
update as fbgemm's exact row-wise Adagrad:

    state[r] += mean_j g[r, j]^2 ;  w[r] -= lr * g[r] / (sqrt(state[r]) + eps)

Rows whose gradient is zero in a step (absent ids) are left untouched.

A step can be skipped on the device (`skip`, a bool device scalar: the trainer's
"this step's loss is not finite"): the dense AdamW is torch's fused kernel, which reads
`found_inf` on the device (the flag torch's GradScaler sets) and leaves parameters, moments
and step count untouched when it is 1; the tables' update reads the flag on the device and
changes nothing. No host sync either way (issue #16 item 3).

The dense learning rate follows a linear warm-up and a cosine decay to `final_frac` of the
peak, computed from the step number alone, so a resumed run needs no scheduler state.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import gem_kernels
import torch
from torch import nn


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad for 2-D embedding tables `[rows, dim]` (fbgemm's exact row-wise rule).

    Args:
        params: 2-D tables (dense gradients; rows with an all-zero gradient are skipped).
        lr: step size (recsys practice: 0.01-0.1).
        eps: added to the root of the accumulator.
        backend: `gem_kernels.rowwise_adagrad_`'s: "auto" (its one-pass Triton kernel on CUDA,
            plain PyTorch elsewhere), "triton" or "reference".
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 0.05, eps: float = 1e-8,
                 *, backend: str = "auto") -> None:
        if not lr > 0:
            raise ValueError(f"RowWiseAdagrad lr={lr} must be > 0")
        super().__init__(params, {"lr": lr, "eps": eps})
        self.backend = backend
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"RowWiseAdagrad takes 2-D tables, got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None, *,  # type: ignore[override]
             skip: torch.Tensor | None = None) -> None:
        """One update; with `skip` (a bool scalar on the tables' device) set, a no-op decided on
        the device: accumulators and weights are unchanged bit for bit, whatever the gradients
        held (NaN included)."""
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                # FSDP2 shards tables by rows (Shard(0)): the row-wise rule is exact on the
                # local rows, so a DTensor is updated through its local shard.
                w = p.to_local() if hasattr(p, "to_local") else p
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = _accumulator(p, w)
                acc = state["sum"]
                acc = acc.to_local() if hasattr(acc, "to_local") else acc
                # One pass on CUDA (gem_kernels' Triton kernel: rows absent from the step are
                # not even read), the plain-PyTorch rule elsewhere.
                gem_kernels.rowwise_adagrad_(w, acc, grad, lr=lr, eps=eps, skip=skip, backend=self.backend)


def _accumulator(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """The zero row accumulator `[rows]` of table `p`: a DTensor placed like `p` when `p` is
    one (FSDP2 shards rows unevenly, so ranks hold different row counts; a plain tensor would
    be saved as if replicated and fail to load on a rank with another row count)."""
    acc = torch.zeros(local.shape[0], device=local.device, dtype=torch.float32)
    if not hasattr(p, "device_mesh"):
        return acc
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(acc, p.device_mesh, p.placements, run_check=False,  # type: ignore[attr-defined]
                              shape=torch.Size([p.shape[0]]), stride=(1,))


def dense_adamw(params: list[nn.Parameter], lr: float) -> torch.optim.AdamW:
    """torch's AdamW, fused where the parameters' device has the fused kernel (CUDA, CPU): one
    kernel per dtype group instead of a foreach chain, and the device-side `found_inf` skip
    that `Optimizers.step(skip=...)` relies on."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    ok = set(_get_fused_kernels_supported_devices())
    fused = bool(params) and all(p.device.type in ok and torch.is_floating_point(p) for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=fused or None)


def embedding_tables(model: nn.Module) -> list[nn.Parameter]:
    """The embedding-table weights of `model` (nn.Embedding / nn.EmbeddingBag, also inside
    torchrec's EmbeddingBagCollection, which is built from nn.EmbeddingBag)."""
    out: list[nn.Parameter] = []
    seen: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            out.append(mod.weight)  # type: ignore[arg-type]
    return out


def lr_scale(step: int, total: int, warmup: int, final_frac: float) -> float:
    """Multiplier of the peak dense lr at `step` (0-based): linear warm-up, cosine decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    t = min(max(step - warmup, 0) / span, 1.0)
    return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + math.cos(math.pi * t))


class Optimizers:
    """The dense AdamW and the tables' RowWiseAdagrad stepped as one optimizer.

    Exposes `step`, `zero_grad`, `set_step` (applies the dense lr schedule for the coming
    step) and `optimizers` (the inner ones; checkpoints save and load them one by one).
    """

    def __init__(self, dense: torch.optim.Optimizer, tables: torch.optim.Optimizer | None,
                 *, total_steps: int, warmup: int, final_frac: float) -> None:
        self.dense, self.tables = dense, tables
        self.total_steps, self.warmup, self.final_frac = total_steps, warmup, final_frac
        self._peak = [g["lr"] for g in dense.param_groups]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.dense] + ([self.tables] if self.tables is not None else [])

    def set_step(self, step: int) -> None:
        s = lr_scale(step, self.total_steps, self.warmup, self.final_frac)
        for g, peak in zip(self.dense.param_groups, self._peak, strict=True):
            g["lr"] = peak * s

    def step(self, skip: torch.Tensor | None = None) -> None:
        """Steps both optimizers; `skip` (bool scalar on the device): when true, the step is a
        no-op decided on the device (parameters and optimizer state unchanged, no host sync).
        The dense optimizer must then be fused (`dense_adamw` makes it so where supported)."""
        if skip is None:
            for o in self.optimizers:
                o.step()
            return
        if self.tables is not None and not isinstance(self.tables, RowWiseAdagrad):
            raise ValueError("Optimizers.step(skip=...) needs RowWiseAdagrad tables, got "
                             f"{type(self.tables).__name__}")
        if not all(g.get("fused") for g in self.dense.param_groups):
            raise ValueError("Optimizers.step(skip=...) needs a fused dense optimizer "
                             f"(found_inf); got {type(self.dense).__name__} without fused=True")
        # Fused Adam(W) skips the update and un-counts the step where found_inf == 1
        # (torch.optim.adam._fused_adam; the flag GradScaler sets): float32, on the device.
        self.dense.found_inf = skip.float()  # type: ignore[attr-defined]
        try:
            self.dense.step()
        finally:
            del self.dense.found_inf  # type: ignore[attr-defined]
        if isinstance(self.tables, RowWiseAdagrad):
            self.tables.step(skip=skip)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)
