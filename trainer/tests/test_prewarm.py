"""The kernel prewarm child (gem_trainer._prewarm): when it starts, what it runs, that it
writes nothing but the kernel caches, and that stopping it (finished, running, failed) is
clean and reported. On CPU the child is started directly (the trainer starts it only for a
compiled single-process CUDA run); the GPU test runs the trainer compiled with it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gem_trainer import _prewarm, presets_tiny, train
from gem_trainer._loop import train as loop_train
from gem_trainer.config import TrainConfig

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def test_off_reasons_name_what_turns_it_off() -> None:
    on = presets_tiny(compile=True)
    assert _prewarm.off_reason(on, CUDA, 1) is None
    assert "prewarm=False" in str(_prewarm.off_reason(dataclasses.replace(on, prewarm=False), CUDA, 1))
    assert "no CUDA" in str(_prewarm.off_reason(on, CPU, 1))
    assert "compile=False" in str(_prewarm.off_reason(dataclasses.replace(on, compile=False), CUDA, 1))
    assert "2 processes" in str(_prewarm.off_reason(on, CUDA, 2))
    assert _prewarm.start(on, CPU, 1, False) == _prewarm.off_reason(on, CPU, 1)


def test_child_config_runs_one_eager_step_and_writes_nothing(tmp_path: Path) -> None:
    cfg = TrainConfig(preset="h200", steps=300, batch_size=64, batch_tokens=262144, compile=True,
                      compile_cache=str(tmp_path / "cc"), ckpt_dir=str(tmp_path / "ck"), resume=True,
                      log_dir=str(tmp_path / "log"), export_teacher=str(tmp_path / "t.pt"))
    c = _prewarm.child_config(cfg)
    assert (c.steps, c.compile, c.prewarm, c.eval_batches) == (1, False, False, 0)
    assert (c.compile_cache, c.ckpt_dir, c.log_dir, c.export_teacher, c.resume) == ("", "", "", "", False)
    assert c.batch_tokens == _prewarm.CHILD_BATCH_TOKENS and c.batch_size == 16
    # the model is the parent's: every field that shapes it is kept
    keep = {"preset", "precision", "seed", "sparse_sharding", "lr", "sparse_lr", "data"}
    assert all(getattr(c, k) == getattr(cfg, k) for k in keep)
    c.validate()
    assert _prewarm.child_config(dataclasses.replace(cfg, batch_tokens=0)).batch_tokens == 0


def _wait(p: _prewarm.Prewarm, limit: float = 300.0) -> None:
    proc = p._proc
    assert proc is not None
    proc.wait(timeout=limit)


def test_a_finished_child_trained_one_step_and_wrote_nothing(tmp_path: Path) -> None:
    cfg = presets_tiny(steps=50, batch_size=16, eval_batches=8, ckpt_dir=str(tmp_path / "ck"),
                       log_dir=str(tmp_path / "log"), export_teacher=str(tmp_path / "t.pt"))
    p = _prewarm.Prewarm(cfg)
    _wait(p)
    assert p.stop() == "finished before the first step"
    assert p.stop() == "finished before the first step"  # idempotent
    assert list(tmp_path.iterdir()) == []  # no checkpoint, log or teacher of the child's


def test_a_running_child_is_killed_and_reported() -> None:
    p = _prewarm.Prewarm(presets_tiny(steps=50, batch_size=16))
    proc = p._proc
    assert proc is not None
    out = p.stop()
    assert out.startswith("stopped at the first step after") and proc.poll() is not None


def test_a_failing_child_is_reported_with_its_error(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_dir"
    p = _prewarm.Prewarm(presets_tiny(steps=5, batch_size=16, data=f"parquet:{missing}"))
    _wait(p)
    out = p.stop()
    assert out.startswith("failed (exit code 1): ") and str(missing) in out, out


def test_a_cpu_run_reports_it_off() -> None:
    s = train(presets_tiny(steps=2, batch_size=16, eval_batches=0, progress=False))
    assert s["kernel_prewarm"] == "off (no CUDA device)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_run_prewarms_and_keeps_its_result() -> None:
    # The same compiled run with and without the child ends at the same loss bit for bit
    # (deterministic algorithms: FlashAttention-4's default backward sums with atomics): the
    # child only fills the kernel caches.
    cfg = presets_tiny(steps=4, batch_size=16, eval_batches=0, progress=False, compile=True,
                       precision="bf16")
    with_child = loop_train(cfg, deterministic=True)
    without = loop_train(dataclasses.replace(cfg, prewarm=False), deterministic=True)
    assert str(with_child["kernel_prewarm"]).startswith(("finished", "stopped")), with_child["kernel_prewarm"]
    assert without["kernel_prewarm"] == "off (prewarm=False)"
    assert with_child["loss"] == without["loss"]

