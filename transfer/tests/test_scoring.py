"""Teacher outputs, score shards: round trip, sharding, coverage checks, resume after kill -9."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from _common import DATA, env, source, teacher
from gem_transfer import load_teacher, read_scores, save_teacher, score_to_parquet, teacher_outputs
from gem_transfer._window import BlockWindow


def _direct(model: nn.Module, src: Any, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The reference: teacher_outputs block by block, concatenated."""
    lo, rep = [], []
    for b in blocks:
        z, r = teacher_outputs(model, src.batch(b, "native"))
        lo.append(z.numpy())
        rep.append(r.numpy())
    return np.concatenate(lo), np.concatenate(rep)


def test_teacher_outputs_logits_and_representation() -> None:
    model, src = teacher(), source()
    batch = src.batch(3, "native")
    logits, rep = teacher_outputs(model, batch)
    with torch.no_grad():
        assert torch.equal(logits, model(batch))
    assert rep.shape == (batch.num_samples, model.cfg.head_hidden) and rep.dtype == torch.float32
    assert torch.isfinite(rep).all() and rep.std() > 0
    # per sample: the same sample in another batch gets the same representation
    h = src.read(3)
    sub = h.take(np.array([5, 0, 2])).to_batch("native")
    _, rep_sub = teacher_outputs(model, sub)
    torch.testing.assert_close(rep_sub, rep[[5, 0, 2]], rtol=1e-4, atol=1e-5)


def test_representation_fallback_without_bottom() -> None:
    """Heads without a `bottom` Linear: the mean over the heads' input tokens."""
    class Heads(nn.Module):
        def forward(self, x: torch.Tensor, s: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
            return x.sum((1, 2))[:, None] + s.sum((1, 2))[:, None]

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = Heads()

        def forward(self, batch: Any) -> torch.Tensor:
            out: torch.Tensor = self.heads(batch.dense[:, None, :], batch.dense[:, None, :] * 2, batch.domain)
            return out

    class B:
        dense = torch.randn(4, 6)
        domain = torch.zeros(4, dtype=torch.int64)

    _, rep = teacher_outputs(M(), B())
    torch.testing.assert_close(rep, 1.5 * B.dense)


def test_round_trip_equals_direct_scoring(tmp_path: Path) -> None:
    model, src = teacher(), source()
    blocks = [4, 5, 6, 7, 8, 9, 10]
    rep = score_to_parquet(model, src, tmp_path, blocks=blocks, blocks_per_shard=3, progress=False)
    assert rep["written"] == 3 and rep["samples"] == 7 * 8 and rep["samples_per_s"] > 0
    sc = read_scores(tmp_path, blocks=blocks, rows_per_block=[8] * 7)
    z, r = _direct(model, src, blocks)
    np.testing.assert_array_equal(sc["block"], np.repeat(blocks, 8))
    np.testing.assert_array_equal(sc["row"], np.tile(np.arange(8), 7))
    np.testing.assert_allclose(sc["logits"], z, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sc["repr"], r, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sc["labels"], np.concatenate([src.read(b).labels for b in blocks]))
    assert sc["tasks"] == list(DATA.tasks)


def test_ranks_write_disjoint_shards_and_resume_with_another_world(tmp_path: Path) -> None:
    model, src = teacher(), BlockWindow(source(), 100, 11)
    reps = [score_to_parquet(model, src, tmp_path, blocks_per_shard=2, rank=r, world_size=2, progress=False)
            for r in (1, 0)]
    assert [r["written"] for r in reps] == [3, 3]  # shards 1,3,5 and 0,2,4
    again = [score_to_parquet(model, src, tmp_path, blocks_per_shard=2, rank=r, world_size=3, progress=False)
             for r in range(3)]
    assert sum(a["written"] for a in again) == 0 and sum(a["skipped_existing"] for a in again) == 6
    sc = read_scores(tmp_path, blocks=range(11), rows_per_block=[8] * 11)
    assert len(sc["block"]) == 88


def test_coverage_check_finds_missing_and_duplicate_rows(tmp_path: Path) -> None:
    model, src = teacher(), source()
    score_to_parquet(model, src, tmp_path / "a", blocks=range(6), blocks_per_shard=2, progress=False)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    read_scores(tmp_path / "a", blocks=range(6), rows_per_block=[8] * 6)  # complete: passes
    with pytest.raises(ValueError, match="block 5 has 8 scored rows, expected 9"):
        read_scores(tmp_path / "a", blocks=range(6), rows_per_block=[8] * 5 + [9])
    with pytest.raises(ValueError, match="block 6 has no scores"):
        read_scores(tmp_path / "a", blocks=range(7))
    with pytest.raises(ValueError, match="block 5, which is not in"):
        read_scores(tmp_path / "a", blocks=range(5))
    (tmp_path / "a" / "scores-000001.parquet").unlink()
    with pytest.raises(ValueError, match="block 2 has no scores"):
        read_scores(tmp_path / "a", blocks=range(6))
    shutil.copy(tmp_path / "b" / "scores-000001.parquet", tmp_path / "b" / "scores-000009.parquet")
    with pytest.raises(ValueError, match=r"\(block 2, row 0\) appears 2 times"):
        read_scores(tmp_path / "b", blocks=range(6))


def test_other_job_in_out_dir_is_refused(tmp_path: Path) -> None:
    model, src = teacher(), source()
    score_to_parquet(model, src, tmp_path, blocks=range(4), blocks_per_shard=2, progress=False)
    with pytest.raises(ValueError, match="blocks_per_shard=2"):
        score_to_parquet(model, src, tmp_path, blocks=range(4), blocks_per_shard=4, progress=False)
    with pytest.raises(ValueError, match="blocks_digest"):
        score_to_parquet(model, src, tmp_path, blocks=[0, 1, 2, 5], blocks_per_shard=2, progress=False)


def test_bad_arguments_are_named() -> None:
    model, src = teacher(), source()
    with pytest.raises(ValueError, match="blocks_per_shard=0"):
        score_to_parquet(model, src, "/tmp/never", blocks=[0], blocks_per_shard=0)
    with pytest.raises(ValueError, match="rank=2"):
        score_to_parquet(model, src, "/tmp/never", blocks=[0], rank=2, world_size=2)
    with pytest.raises(ValueError, match="finite source"):
        score_to_parquet(model, src, "/tmp/never")
    with pytest.raises(ValueError, match="no score shards"):
        read_scores("/tmp")


def test_save_load_teacher_round_trip(tmp_path: Path) -> None:
    model, src = teacher(seed=3), source()
    path = save_teacher(model, tmp_path / "t.pt")
    loaded = load_teacher(path)
    batch = src.batch(1, "native")
    z0, r0 = teacher_outputs(model, batch)
    z1, r1 = teacher_outputs(loaded, batch)
    assert torch.equal(z0, z1) and torch.equal(r0, r1)
    (tmp_path / "x.pt").write_bytes(b"not a teacher")
    with pytest.raises(Exception):
        load_teacher(tmp_path / "x.pt")
    with pytest.raises(ValueError, match="is not a file"):
        load_teacher(tmp_path / "missing.pt")


def test_resume_after_sigkill_no_row_missing_or_duplicated(tmp_path: Path) -> None:
    """A real `python -m gem_transfer score` process killed with SIGKILL mid-run, then rerun."""
    model = teacher(seed=1)
    path = save_teacher(model, tmp_path / "t.pt")
    out = tmp_path / "scores"
    n_blocks = 160
    cmd = [sys.executable, "-m", "gem_transfer", "score", "--teacher", str(path), "--out", str(out),
           "--blocks", f"0:{n_blocks}", "--block-size", "8", "--blocks-per-shard", "1", "--no-progress",
           "--device", "cpu"]
    # the CLI uses the transfer tiny data preset; the reference below must read the same data
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.glob("scores-*.parquet"))) < 5:
        if proc.poll() is not None:
            raise AssertionError(f"scorer ended early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list(out.glob("scores-*.parquet")))
    assert proc.returncode == -signal.SIGKILL and 5 <= done_before < n_blocks, done_before
    (out / ".scores-000159.parquet.deadbeef.tmp").write_bytes(b"half a shard")  # as a kill mid-write leaves
    with pytest.raises(ValueError, match="missing"):
        read_scores(out, blocks=range(n_blocks))
    rerun = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert not list(out.glob(".*.tmp"))
    sc = read_scores(out, blocks=range(n_blocks), rows_per_block=[8] * n_blocks)  # exactly once each
    import gem_data
    from gem_transfer._pipeline import data_config
    from gem_transfer.presets import tiny
    src = gem_data.SyntheticSource(data_config(tiny()), block_size=8)
    z, r = _direct(load_teacher(path), src, list(range(n_blocks)))
    np.testing.assert_allclose(sc["logits"], z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sc["repr"], r, rtol=1e-5, atol=1e-5)
