"""Corrupt/truncated files, fallback, injected and real write failures."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from _util import recv, start
from gem_checkpoint import (
    FAULT_ENV,
    CheckpointCorruptError,
    Checkpointer,
    CheckpointWriteError,
)


def _save_steps(root: Path, steps: list[int], **kw: object) -> dict[int, torch.Tensor]:
    ckpt = Checkpointer(root, keep_last=10, **kw)  # type: ignore[arg-type]
    data = {}
    for s in steps:
        data[s] = torch.randn(64, 33)
        ckpt.save(s, {"w": data[s], "meta": {"step": s}})
    ckpt.wait()
    return data


def _flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    i = random.randrange(len(raw))
    raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "metadata"])
def test_corruption_names_the_file_and_falls_back(tmp_path: Path, damage: str) -> None:
    data = _save_steps(tmp_path, [1, 2])
    folder = tmp_path / "step_2"
    target = folder / (".metadata" if damage == "metadata" else "__0_0.distcp")
    if damage in ("flip", "metadata"):
        _flip_byte(target)
    elif damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(target.stat().st_size // 2)
    else:
        target.unlink()
    w = torch.zeros(64, 33)
    if damage in ("flip", "metadata"):
        # Same size: still listed as committed; the checksum catches it at load.
        assert Checkpointer(tmp_path).latest() == 2
        with pytest.raises(CheckpointCorruptError, match=f"{target}: crc32"):
            Checkpointer(tmp_path).load({"w": w, "meta": {}})
        with pytest.raises(CheckpointCorruptError, match=str(target)):
            Checkpointer(tmp_path).load({"w": w, "meta": {}}, step=2)
        # An explicit step never silently falls back.
        with pytest.raises(CheckpointCorruptError):
            Checkpointer(tmp_path, fallback_to_good=True).load({"w": w, "meta": {}}, step=2)
        with pytest.warns(UserWarning, match=f"skipping corrupt checkpoint step 2: .*{target}"):
            step = Checkpointer(tmp_path, fallback_to_good=True).load(state := {"w": w, "meta": {}})
    else:
        # Size mismatch or missing file: not a valid commit, latest() skips it.
        assert Checkpointer(tmp_path).latest() == 1
        step = Checkpointer(tmp_path).load(state := {"w": w, "meta": {}})
    assert step == 1 and torch.equal(w, data[1]) and state["meta"] == {"step": 1}
    if damage == "truncate":  # but asking for it names the file
        ckpt = Checkpointer.__new__(Checkpointer)
        ckpt.__dict__.update(Checkpointer(tmp_path / "x").__dict__, root=tmp_path)
        with pytest.raises(CheckpointCorruptError, match=f"{target}: size"):
            ckpt._verify(2)


def test_all_corrupt_with_fallback_raises(tmp_path: Path) -> None:
    _save_steps(tmp_path, [1, 2])
    for s in (1, 2):
        _flip_byte(tmp_path / f"step_{s}" / "__0_0.distcp")
    with pytest.warns(UserWarning), pytest.raises(CheckpointCorruptError, match="no good checkpoint left"):
        Checkpointer(tmp_path, fallback_to_good=True).load({"w": torch.zeros(64, 33), "meta": {}})


@pytest.mark.parametrize("stage", ["write", "commit", "rename"])
@pytest.mark.parametrize("async_save", [True, False])
def test_injected_disk_full_surfaces_and_training_continues(
    tmp_path: Path, stage: str, async_save: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _save_steps(tmp_path, [1], async_save=async_save)
    ckpt = Checkpointer(tmp_path, async_save=async_save)
    monkeypatch.setenv(FAULT_ENV, stage)
    if async_save:
        ckpt.save(2, {"w": torch.randn(64, 33), "meta": {"step": 2}})  # returns: failure is in the background
        with pytest.raises(CheckpointWriteError, match="No space left on device") as info:
            ckpt.wait()
    else:
        with pytest.raises(CheckpointWriteError, match="No space left on device") as info:
            ckpt.save(2, {"w": torch.randn(64, 33), "meta": {"step": 2}})
    assert isinstance(info.value.__cause__, OSError)
    assert ckpt.latest() == 1 and sorted(os.listdir(tmp_path)) == ["step_1"]  # nothing partial left
    ckpt.wait()  # the error was reported once
    monkeypatch.delenv(FAULT_ENV)
    data[3] = torch.randn(64, 33)
    ckpt.save(3, {"w": data[3], "meta": {"step": 3}})
    ckpt.wait()
    w = torch.zeros(64, 33)
    assert ckpt.steps() == [1, 3] and ckpt.load({"w": w, "meta": {}}) == 3 and torch.equal(w, data[3])


def test_failure_reported_by_next_save(tmp_path: Path) -> None:
    calls: list[str] = []

    def hook(stage: str) -> None:
        calls.append(stage)
        if stage == "write" and calls.count("write") == 1:
            raise OSError(28, "No space left on device (test hook)")

    ckpt = Checkpointer(tmp_path, fault_hook=hook)
    ckpt.save(1, {"w": torch.ones(3)})
    with pytest.raises(CheckpointWriteError, match="saving step 1 .* failed"):
        ckpt.save(2, {"w": torch.ones(3)})
    ckpt.save(2, {"w": torch.ones(3)})
    ckpt.wait()
    assert ckpt.steps() == [2] and calls == ["write", "write", "commit", "rename", "marker"]


def test_real_write_error_from_file_size_limit(tmp_path: Path) -> None:
    """A real failing write() (EFBIG through RLIMIT_FSIZE) in a subprocess."""
    proc, conn = start("fsize", str(tmp_path))
    res = recv(conn, proc)
    proc.join(30)
    assert proc.exitcode == 0
    # torch's zip writer reports the failed write() as "unexpected pos"; any error will do,
    # what matters is that it surfaced and nothing was committed.
    assert res["error"] is not None, res
    assert res["latest_after_failure"] == 1 and res["entries_after_failure"] == ["step_1"]
    assert res["latest_after_retry"] == 3


def test_damaged_marker_is_ignored_but_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _save_steps(tmp_path, [1, 2])
    marker = tmp_path / "step_2" / "COMMIT.json"
    text = marker.read_text()
    size = json.loads(text)["files"]["__0_0.distcp"]["size"]
    marker.write_text(text.replace(f'"size": {size}', f'"size": {size + 1}', 1))  # still valid JSON
    with caplog.at_level("WARNING", logger="gem_checkpoint"):
        ckpt = Checkpointer(tmp_path)
        assert ckpt.latest() == 1
    assert f"commit marker {marker} is corrupt" in caplog.text
    assert (tmp_path / "step_2" / "__0_0.distcp").exists()  # not deleted as "stale"
    w = torch.zeros(64, 33)
    assert ckpt.load({"w": w, "meta": {}}) == 1 and torch.equal(w, data[1])
