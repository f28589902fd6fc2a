"""Run-level bookkeeping: per-task NE/AUC, throughput, MFU, time breakdown, logs.

MFU = model FLOPs (forward from gem_model's analytic count, x3 for fwd+bwd) / step time /
989 TFLOP/s per GPU (H100/H200 dense bf16 datasheet peak, DESIGN.md §3).
"""
from __future__ import annotations

import json
import math
import os
import sys
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
    ckpt_saves: list[float] = field(default_factory=list)  # stall of each save inside the loop
    start_step: int = 0  # the step the loop started from (a resumed run's checkpoint step)
    total: float = 0.0
    first_step: float | None = None
    samples: int = 0
    tokens: int = 0
    model_flops: float = 0.0
    bad_steps: int = 0
    steps_done: int = 0
    # The warm-up's steps: WARMUP_STEPS, or more while background compiles are pending
    # (`--compile-background`: the steps run eager blocks until the compiled ones take over).
    warmup: int = WARMUP_STEPS
    # Steps after the warm-up (Triton compilation, new-shape specialisations,
    # allocator growth happen there): the steady-state MFU is computed over these.
    steady_flops: float = 0.0
    steady_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    opt_host_s: list[float] = field(default_factory=list)  # each step's host time in the optimizer phase
    gc_s: list[float] = field(default_factory=list)  # each step's garbage-collector pauses (gem_trainer._gc)
    # Each step's device time (CUDA events: batch in hand .. optimizer done; None off CUDA). When
    # the GPU is the bottleneck, the host's step windows are uneven while this stays flat.
    gpu_s: list[float | None] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)


def slow_steps(timers: Timers, warmup: int, *, factor: float = 1.5, top: int = 5) -> list[dict[str, float | None]]:
    """The steady steps (after `warmup`) that took more than `factor` x the steady median, the
    slowest first (at most `top`): step number, step seconds (the host's window), the host
    seconds of its optimizer phase, the garbage collector's pauses inside the step, and the
    step's device time (`gpu_s`, CUDA only). A few such steps are what separates a run's steady
    MFU from its median step (one-off compilations, allocator growth, a stalled write, a full
    garbage collection). A slow window whose `gpu_s` is the usual one lost no device time: with
    the GPU the bottleneck the host runs ahead, blocks when the launch queue is full, and its
    windows come out uneven (a long one is paid back by short ones)."""
    steady = list(enumerate(timers.step_s))[warmup:]
    if not steady:
        return []
    times = sorted(t for _, t in steady)
    median = times[len(times) // 2]
    slow = sorted((i for i, t in steady if t > factor * median), key=lambda i: -timers.step_s[i])[:top]
    return [{"step": timers.start_step + i + 1, "step_s": timers.step_s[i],
             "opt_host_s": timers.opt_host_s[i] if i < len(timers.opt_host_s) else None,
             "gc_s": timers.gc_s[i] if i < len(timers.gc_s) else None,
             "gpu_s": timers.gpu_s[i] if i < len(timers.gpu_s) else None} for i in slow]


def mfu(model_flops: float, seconds: float, num_gpus: int) -> float | None:
    """Model FLOPs utilisation against the bf16 dense peak; None on CPU or for no time."""
    if num_gpus <= 0 or seconds <= 0:
        return None
    return model_flops / seconds / (PEAK_BF16_FLOPS * num_gpus)


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in /proc/self/stat against
    /proc/uptime, to the clock tick, 10 ms), or NaN where that cannot be read. At the start of
    `train()` it is what the time to first step leaves out: the interpreter's start and the
    imports (torch's alone took 13.2 s on a box whose Python writes no bytecode caches)."""
    try:
        with open("/proc/self/stat") as f:
            # the fields after the command name (which may hold spaces and parentheses);
            # starttime is field 22 of the line, the 20th after the name
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return math.nan


def strict(value: Any, notes: dict[str, str] | None = None) -> Any:
    """`value` with every non-finite float replaced by None, so `json.dumps(...,
    allow_nan=False)` succeeds (bare NaN/Infinity are not JSON).

    In a dict, a key `k` whose value was non-finite also gets `k_note`: `notes[k]` when
    given (why the value is missing, e.g. "no step completed"), else "was nan" / "was inf".
    """
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out[k] = strict(v, notes)
            if isinstance(v, float) and not math.isfinite(v) and f"{k}_note" not in value:
                out[f"{k}_note"] = (notes or {}).get(str(k), f"was {v}")
        return out
    if isinstance(value, (list, tuple)):
        return [strict(v, notes) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any) -> str:
    """Strict JSON (see `strict`): what the summary line and the JSONL log are written with."""
    return json.dumps(strict(value), allow_nan=False)


def _scalars(prefix: str, value: Any) -> list[tuple[str, float]]:
    """Finite numbers of a (nested) record as TensorBoard tags `a/b/c`."""
    if isinstance(value, dict):
        out: list[tuple[str, float]] = []
        for k, v in value.items():
            out += _scalars(f"{prefix}/{k}" if prefix else str(k), v)
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
        return [(prefix, float(value))]
    return []


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    h, rem = divmod(s, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


class ProgressLine:
    """One line every `every` steps on stderr when there is no progress bar (stdout or
    stderr not a terminal: a pipe, a file, a batch job): step, loss, tokens/s, ETA."""

    def __init__(self, total: int, start: int, every: int, stream: TextIO | None = None) -> None:
        self.total, self.start, self.every = total, start, every
        self.stream = stream if stream is not None else sys.stderr
        self._t0 = time.perf_counter()
        self._tokens = 0

    def update(self, step: int, loss: float, tokens: int) -> str | None:
        """Records one finished step with `tokens` tokens; prints (and returns) a line every
        `every` steps and at the last one."""
        self._tokens += tokens
        if step % self.every != 0 and step != self.total:
            return None
        dt = time.perf_counter() - self._t0
        done = step - self.start
        eta = dt / done * (self.total - step) if done > 0 else 0.0
        line = (f"step {step}/{self.total}  loss {loss:.4f}  "
                f"{self._tokens / dt if dt > 0 else 0.0:,.0f} tokens/s  ETA {_duration(eta)}")
        print(line, file=self.stream, flush=True)
        return line


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
        """One JSONL record `{"step", "time", **values}` (strict JSON: non-finite numbers are
        null) and the finite numbers as TensorBoard scalars; nested dicts become tags
        `a/b` (e.g. `eval/click/auc`)."""
        if self._f is not None:
            self._f.write(dumps({"step": step, "time": time.time(), **values}) + "\n")
            self._f.flush()
        if self._tb is not None:
            for tag, v in _scalars("", values):
                self._tb.add_scalar(tag, v, step)

    def close(self) -> None:
        """Closes the JSONL file and flushes and closes TensorBoard's writer (whose events are
        otherwise written every two minutes, so a run that ends in an error lost its last
        scalars). Idempotent: train() closes the log whatever ends the run."""
        f, tb, self._f, self._tb = self._f, self._tb, None, None
        try:
            if f is not None:
                f.close()
        finally:
            if tb is not None:
                tb.close()
