"""Issue #19: `export_teacher` saves the trainer's trained model as a gem_transfer teacher.

The check that the file holds the *trained* weights: the loaded teacher, scored on the
trainer's own held-out batches (`evaluate`, same seed, same data), reproduces the summary's
per-task NE/AUC exactly, and an untrained model of the same config does not. Then
gem_transfer scores a few synthetic blocks with it. CPU, a few steps.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gem_data
import gem_model
import gem_transfer
from gem_trainer import _preflight, presets_tiny, train
from gem_trainer._loop import data_config, evaluate

_FAST = {"steps": 12, "batch_size": 16, "eval_batches": 4, "log_every": 100, "progress": False}


def _eval(model: torch.nn.Module, cfg: object) -> dict[str, dict[str, float]]:
    dcfg = data_config(cfg)  # type: ignore[arg-type]
    return evaluate(model, cfg, dcfg, 0, 1, torch.device("cpu"), None)


def test_exported_teacher_is_the_trained_model(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "teacher.pt"
    cfg = presets_tiny(export_teacher=str(path), **_FAST)
    summary = train(cfg)
    assert summary["teacher_export"] == str(path) and path.is_file()
    teacher = gem_transfer.load_teacher(path)
    got = _eval(teacher, cfg)
    want = summary["tasks"]
    assert isinstance(want, dict) and set(got) == set(want) and want
    for task, m in want.items():
        assert got[task]["auc"] == pytest.approx(m["auc"], abs=1e-6), task
        assert got[task]["ne"] == pytest.approx(m["ne"], abs=1e-6), task
    # The check can fail: an untrained model of the same config scores differently.
    torch.manual_seed(123)
    fresh = gem_model.GEMModel(teacher.cfg).eval()
    other = _eval(fresh, cfg)
    assert any(abs(other[t]["ne"] - want[t]["ne"]) > 1e-4 for t in want), (other, want)

    # gem_transfer scores synthetic blocks with it (per-task logits = the teacher's outputs).
    src = gem_data.SyntheticSource(data_config(cfg), block_size=8)
    res = gem_transfer.score_to_parquet(teacher, src, tmp_path / "scores", blocks=[0, 1],
                                        blocks_per_shard=1, progress=False)
    assert res["samples"] == 16
    scores = gem_transfer.read_scores(tmp_path / "scores", blocks=[0, 1])
    logits, _ = gem_transfer.teacher_outputs(teacher, src.batch(0, "native"))
    torch.testing.assert_close(torch.tensor(scores["logits"][:8]), logits, rtol=1e-5, atol=1e-6)


def test_export_teacher_refuses_sharded_tables_several_processes_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="export_teacher=.* needs one process \\(world size 2\\)"):
        _preflight.check_export(presets_tiny(export_teacher=str(tmp_path / "t.pt")), 2)
    with pytest.raises(ValueError, match="export_teacher=.* needs sparse_sharding='none'"):
        presets_tiny(export_teacher=str(tmp_path / "t.pt"), sparse_sharding="table_wise").validate()
    with pytest.raises(ValueError, match="export_teacher=.* is a directory"):
        train(presets_tiny(export_teacher=str(tmp_path), **_FAST))
