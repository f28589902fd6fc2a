"""Run-level bookkeeping: per-task NE/AUC, throughput, MFU, time breakdown, logs.

MFU = model FLOPs (forward from gem_model's analytic count, x3 for fwd+bwd) / step time /
989 TFLOP/s per GPU (H100/H200 dense bf16 datasheet peak, DESIGN.md §3).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

PEAK_BF16_FLOPS = 989e12
WARMUP_STEPS = 5


@dataclass
class Timers:
    """Wall-clock split of the run (seconds)."""

    data_wait: float = 0.0
    compute: float = 0.0
    optimizer: float = 0.0
    ckpt_stall: float = 0.0
    total: float = 0.0
    first_step: float | None = None
    samples: int = 0
    tokens: int = 0
    model_flops: float = 0.0
    bad_steps: int = 0
    steps_done: int = 0
    # Steps after the first WARMUP_STEPS (Triton compilation, new-shape specialisations,
    # allocator growth happen there): the steady-state MFU is computed over these.
    steady_flops: float = 0.0
    steady_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)


def mfu(model_flops: float, seconds: float, num_gpus: int) -> float | None:
    """Model FLOPs utilisation against the bf16 dense peak; None on CPU or for no time."""
    if num_gpus <= 0 or seconds <= 0:
        return None
    return model_flops / seconds / (PEAK_BF16_FLOPS * num_gpus)


class MetricLog:
    """JSONL lines (always, if a log dir is given) plus TensorBoard scalars (if importable)."""

    def __init__(self, log_dir: str, rank: int) -> None:
        self._f: TextIO | None = None
        self._tb: Any = None
        if not log_dir or rank != 0:
            return
        os.makedirs(log_dir, exist_ok=True)
        self._f = open(os.path.join(log_dir, "metrics.jsonl"), "a", encoding="utf-8")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(log_dir, "tb"))
        except Exception:  # tensorboard missing (e.g. the GPU box): JSONL only
            self._tb = None

    def write(self, step: int, **values: Any) -> None:
        if self._f is not None:
            self._f.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
            self._f.flush()
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
