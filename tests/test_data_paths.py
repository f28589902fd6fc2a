"""The trainer on Parquet shards and on the synthetic source; bad config and data → clear errors."""
from __future__ import annotations

from pathlib import Path

import gem_data
from _run import FAST, gem, summary


def test_parquet_training(tmp_path: Path) -> None:
    cfg = gem_data.presets.tiny()
    src = gem_data.SyntheticSource(cfg, block_size=16)
    gem_data.write_parquet((src.batch(b) for b in range(6)), tmp_path / "shards", tasks=cfg.tasks,
                           samples_per_shard=32, rows_per_group=16)
    res = gem("--data", f"parquet:{tmp_path / 'shards'}", "--steps", "8", *FAST)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(res.stdout)
    assert s["steps"] == 8 and s["tokens_per_s"] > 0


def test_synthetic_summary_fields(tmp_path: Path) -> None:
    res = gem("--steps", "3", "--batch-size", "16", "--eval-batches", "1", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(res.stdout)
    for key in ("steps", "loss", "tasks", "samples_per_s", "tokens_per_s", "mfu", "mfu_steady",
                "step_s_median", "data_wait_frac", "ckpt_stall_s", "time_to_first_step_s"):
        assert key in s
    assert s["mfu"] is None and s["mfu_steady"] is None  # CPU
    assert 0 < s["step_s_median"] < s["time_to_first_step_s"] + 60
    assert set(s["tasks"]) == {"click", "conversion"}
    for m in s["tasks"].values():
        assert {"ne", "auc", "auc_bayes"} <= set(m)


def test_bad_config_and_paths(tmp_path: Path) -> None:
    res = gem("--steps", "0")
    assert res.returncode == 2 and "steps=0 must be an int >= 1" in res.stderr
    res = gem("--data", f"parquet:{tmp_path / 'missing'}", "--steps", "1", *FAST)
    assert res.returncode == 2 and "missing" in res.stderr and "not a directory" in res.stderr
    res = gem("--data", "csv:foo")
    assert res.returncode == 2 and "must be 'synthetic' or 'parquet:DIR'" in res.stderr
    res = gem("--resume")
    assert res.returncode == 2 and "--resume needs --ckpt-dir" in res.stderr  # the CLI names flags
    (tmp_path / "empty").mkdir()
    res = gem("--data", f"parquet:{tmp_path / 'empty'}", "--steps", "1", *FAST)
    assert res.returncode == 2 and "no Parquet files" in res.stderr
