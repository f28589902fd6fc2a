"""The summary's `startup_s`: the time to first step split into its phases, each phase's time
booked where it was spent (a slow model build, a late first batch, a slow device at the
first step), and the phases adding up to `time_to_first_step_s`; `before_train_s`: the
process's age when `train()` starts (its imports), which the time to first step leaves out."""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gem_data
import gem_model
from gem_trainer import _loop, _metrics, presets_tiny, train

PHASES = ["setup", "build", "parallelize", "loader", "before_first_step", "first_batch",
          "first_forward_backward", "first_optimizer", "first_wait"]


def test_each_phase_holds_its_own_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random()
    # Fresh delays each run, 2 s apart, so a delay booked in the wrong phase shows.
    build, batch, wait = (round(rng.uniform(0.4, 0.7), 3) + k for k in (0.0, 2.0, 4.0))
    real_init = gem_model.GEMModel.__init__
    real_next = gem_data.JaggedLoader.__next__
    real_values = _loop._Pending.values
    calls = {"next": 0, "values": 0}

    def slow_init(self: gem_model.GEMModel, cfg: gem_model.GEMConfig) -> None:
        time.sleep(build)
        real_init(self, cfg)

    def late_next(self: gem_data.JaggedLoader) -> gem_data.Batch:
        calls["next"] += 1
        if calls["next"] == 1:
            time.sleep(batch)
        return real_next(self)

    def slow_values(self: _loop._Pending) -> list[float]:
        calls["values"] += 1
        if calls["values"] == 1:  # the first step's read waits, as for a slow device
            time.sleep(wait)
        return real_values(self)

    monkeypatch.setattr(gem_model.GEMModel, "__init__", slow_init)
    monkeypatch.setattr(gem_data.JaggedLoader, "__next__", late_next)
    monkeypatch.setattr(_loop._Pending, "values", slow_values)
    s = train(presets_tiny(steps=2, batch_size=8, eval_batches=0, progress=False))
    assert s["steps"] == 2, s
    ph = s["startup_s"]
    assert list(ph) == PHASES, ph
    assert all(v >= 0 for v in ph.values()), ph
    assert sum(ph.values()) == pytest.approx(s["time_to_first_step_s"], abs=1e-3), (ph, s["time_to_first_step_s"])
    assert s["triton_precompile"] is None  # on CPU no worker starts (triton_precompile="auto")
    # each delay in its phase, and not also in another. The phases' own work on the tiny
    # preset must stay below the 2 s between the delays: ~0.5 s for the build on an idle
    # 2-core CPU, 1.5 s with two other processes busy on it (a margin of 1.4 s once failed so)
    assert build <= ph["build"] < build + 1.9, ph
    assert batch <= ph["first_batch"] < batch + 1.9, ph
    assert wait <= ph["first_wait"] < wait + 1.9, ph
    assert ph["before_first_step"] < 0.2, ph  # the loop's own set-up; no step failed
    # this pytest process started before train() did
    assert 0 < s["before_train_s"] <= _metrics.process_age_s(), s["before_train_s"]


def test_process_age_counts_from_the_process_start() -> None:
    """A child process reads its age before and after a fresh random sleep: the difference is
    the sleep (to /proc's 10 ms ticks), and the first reading (the interpreter's start and
    its imports) is positive and within the wall time the parent measured around the child."""
    nap = round(random.uniform(0.3, 0.9), 2)
    code = ("import json, time; from gem_trainer._metrics import process_age_s; a = process_age_s(); "
            f"time.sleep({nap}); print(json.dumps([a, process_age_s()]))")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t
    a, b = json.loads(out.strip().splitlines()[-1])
    assert 0 < a < b <= wall + 0.02, (a, b, wall)
    assert b - a == pytest.approx(nap, abs=0.05), (a, b, nap)


def test_no_completed_step_has_no_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every loss non-finite: no step completes, so there is no first step to split.
    monkeypatch.setattr(_loop, "loss_fn", lambda logits, labels: (logits.float() * float("nan")).mean())
    s = train(presets_tiny(steps=3, batch_size=8, eval_batches=0, progress=False, max_bad_steps=2))
    assert s["steps"] == 0 and s["time_to_first_step_s"] is None and s["startup_s"] is None, s


@pytest.mark.parametrize("where", ["__iter__", "__next__"])
def test_a_loader_that_fails_to_start_leaves_no_handler_behind(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The loader's start (`iter`) or its first batch raises: train() raises that error, and
    the SIGTERM/SIGINT handlers and gc callbacks it installed are gone again (a caller that
    catches the error keeps its own handlers; before gem-trainer 0.2.20 a failing `iter`
    left the run's handlers installed)."""
    import gc
    import signal

    token = f"loader failed {random.randrange(10**9)}"

    def fail(self: gem_data.JaggedLoader) -> None:
        raise RuntimeError(token)

    monkeypatch.setattr(gem_data.JaggedLoader, where, fail)
    mine = {s: (lambda signum, frame: None) for s in (signal.SIGTERM, signal.SIGINT)}
    old = {s: signal.signal(s, h) for s, h in mine.items()}
    callbacks = list(gc.callbacks)
    try:
        with pytest.raises(RuntimeError, match=token):
            train(presets_tiny(steps=2, batch_size=8, eval_batches=0, progress=False))
        assert {s: signal.getsignal(s) for s in mine} == mine
        assert gc.callbacks == callbacks
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@pytest.mark.parametrize("where", ["loop", "evaluation"])
def test_a_run_that_raises_closes_its_metric_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 where: str) -> None:
    """The loop (a step's loss) or the evaluation raises: train() raises that error, and its
    metric log is closed: the JSONL lines written so far are there, and TensorBoard's writer
    is flushed (before gem-trainer 0.2.21 the log was closed only by a run that finished, so
    a failed run lost the scalars TensorBoard had not flushed yet, up to two minutes)."""
    token = f"failed {random.randrange(10**9)}"
    steps_before = random.randrange(2, 5)
    real_loss = _loop.loss_fn
    calls = {"n": 0}

    def loss(*args: object) -> object:
        calls["n"] += 1
        if where == "loop" and calls["n"] > steps_before:
            raise RuntimeError(token)
        return real_loss(*args)

    def evaluate(*args: object) -> object:
        raise RuntimeError(token)

    monkeypatch.setattr(_loop, "loss_fn", loss)
    if where == "evaluation":
        monkeypatch.setattr(_loop, "evaluate", evaluate)
    closed: list[bool] = []
    real_close = _metrics.MetricLog.close

    def close(self: _metrics.MetricLog) -> None:
        closed.append(self._f is not None)  # the file was still open
        real_close(self)

    monkeypatch.setattr(_metrics.MetricLog, "close", close)
    log_dir = str(tmp_path)
    steps = steps_before + 2
    with pytest.raises(RuntimeError, match=token):
        train(presets_tiny(steps=steps, batch_size=8, eval_batches=2, progress=False, log_dir=log_dir, log_every=1))
    assert closed and closed[0], closed  # closed once with its file open; later closes are no-ops
    with open(f"{log_dir}/metrics.jsonl") as f:
        logged = [json.loads(line)["step"] for line in f]
    want = steps_before if where == "loop" else steps
    assert logged and max(logged) == want, logged
