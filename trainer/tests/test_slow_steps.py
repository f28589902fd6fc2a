"""The summary's `slow_steps`: the steady steps over 1.5x the steady median, with the host time
of their optimizer phase and their device time (what a gap between `mfu_steady` and the median
step is made of, and whether the device lost the time or only the host's window did)."""

import random
import time

import pytest
import torch

import gem_data
from gem_trainer import _optim, presets_tiny, train
from gem_trainer._metrics import WARMUP_STEPS, Timers, slow_steps


def test_slow_steps_picks_the_outliers_after_warmup() -> None:
    rng = random.Random(4)
    t = Timers(start_step=100)
    t.step_s = [5.0] * WARMUP_STEPS + [1.0 + 0.1 * rng.random() for _ in range(30)]
    t.opt_host_s = [0.01] * len(t.step_s)
    t.gc_s = [rng.random() * 1e-3 for _ in t.step_s]
    t.gpu_s = [0.9 + 0.1 * rng.random() for _ in t.step_s]
    slow = {WARMUP_STEPS + 3: 2.0, WARMUP_STEPS + 17: 4.0, WARMUP_STEPS + 20: 1.6}
    for i, v in slow.items():
        t.step_s[i] = v
        t.opt_host_s[i] = v - 1.0
    got = slow_steps(t, WARMUP_STEPS)
    assert [g["gc_s"] for g in got] == [t.gc_s[i] for i in sorted(slow, key=lambda i: -slow[i])]
    assert [g["gpu_s"] for g in got] == [t.gpu_s[i] for i in sorted(slow, key=lambda i: -slow[i])]
    # slowest first; step numbers count from the resumed run's start; warm-up steps never count
    assert [g["step"] for g in got] == [100 + i + 1 for i in sorted(slow, key=lambda i: -slow[i])]
    assert [g["step_s"] for g in got] == sorted(slow.values(), reverse=True)
    assert [g["opt_host_s"] for g in got] == pytest.approx([v - 1.0 for v in sorted(slow.values(), reverse=True)])
    assert slow_steps(t, WARMUP_STEPS, top=1)[0]["step_s"] == 4.0
    assert slow_steps(t, len(t.step_s)) == []  # nothing after the warm-up
    t.step_s = t.step_s[:WARMUP_STEPS] + [1.0] * 30
    assert slow_steps(t, WARMUP_STEPS) == []  # no outlier


def _the_step(slow: list[dict[str, float]], step: int) -> dict[str, float]:
    """The slow-steps entry of `step`. (Found by number, not taken as the slowest: on a fresh
    GPU machine the tiny model's first batch of a new length mix JIT-compiles Triton kernels,
    a real slow step of its own that can outrank the injected one; seen on the H200.)"""
    hits = [o for o in slow if o["step"] == step]
    assert hits, f"step {step} is not among the slow steps {slow}"
    return hits[0]


def test_a_slow_optimizer_step_shows_in_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    # One steady step's optimizer phase takes 1.5 s more (as a first-seen compile would): the
    # summary names that step and puts the time in its optimizer phase.
    target = WARMUP_STEPS + 3  # set_step gets the steps done so far: this is step target + 1
    real = _optim.Optimizers.set_step

    def set_step(self: _optim.Optimizers, step: int) -> None:
        if step == target:
            time.sleep(1.5)
        real(self, step)

    monkeypatch.setattr(_optim.Optimizers, "set_step", set_step)
    s = train(presets_tiny(steps=WARMUP_STEPS + 8, batch_size=16, eval_batches=0, progress=False))
    assert s["steps"] == WARMUP_STEPS + 8, s
    mine = _the_step(s["slow_steps"], target + 1)
    assert mine["opt_host_s"] >= 1.5 and mine["step_s"] >= 1.5, s["slow_steps"]
    # the time is booked to that step's optimizer phase only
    assert all(o["opt_host_s"] < 1.0 for o in s["slow_steps"] if o is not mine), s["slow_steps"]
    if not torch.cuda.is_available():
        assert mine["gpu_s"] is None and s["step_gpu_s_median"] is None, s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (device time from CUDA events)")
def test_a_late_batch_slows_the_window_not_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host waits 1.5 s for one steady step's batch (the GPU idles before the step starts):
    # that step's window is slow, its device time is not; every step has a device time.
    target = WARMUP_STEPS + 3
    real = gem_data.JaggedLoader.__next__
    calls = [0]

    def late_next(self: gem_data.JaggedLoader) -> gem_data.Batch:
        calls[0] += 1
        if calls[0] == target + 1:
            time.sleep(1.5)
        return real(self)

    monkeypatch.setattr(gem_data.JaggedLoader, "__next__", late_next)
    s = train(presets_tiny(steps=WARMUP_STEPS + 8, batch_size=16, eval_batches=0, progress=False))
    assert s["steps"] == WARMUP_STEPS + 8, s
    mine = _the_step(s["slow_steps"], target + 1)
    assert mine["step_s"] >= 1.5, s["slow_steps"]
    median = s["step_gpu_s_median"]
    assert median is not None and 0 < median < 1.0, s
    assert mine["gpu_s"] is not None and mine["gpu_s"] < 0.5 * mine["step_s"], mine
