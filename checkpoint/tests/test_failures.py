"""Corrupt/truncated files, fallback, injected and real write failures."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystem

from _util import recv, start
from gem_checkpoint import (
    FAULT_ENV,
    CheckpointCorruptError,
    Checkpointer,
    CheckpointWriteError,
)
from gem_checkpoint._checkpointer import describe_write_error


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
    # torch's zip writer reports the failed write() as "unexpected pos"; the message says what it was
    assert res["error"] is not None and "a file outgrew the size limit (EFBIG" in res["error"], res
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


class _FullDisk:
    """A file on a disk with `budget` bytes free: the write that fills it comes back short, the next
    fails with ENOSPC (as write(2) does); torch's zip writer turns that into "unexpected pos"."""

    def __init__(self, f: object, budget: list[int]) -> None:
        self._f, self._budget = f, budget

    def write(self, data: bytes) -> int:
        n, left = len(memoryview(data)), self._budget[0]
        if n > left:
            if not left:  # write(2) on a full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n = left  # the write that fills the disk comes back short
            data = bytes(memoryview(data)[:n])
        self._budget[0] -= n
        return self._f.write(data)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


@pytest.mark.parametrize("async_save", [True, False])
def test_disk_full_says_so_and_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool) -> None:
    """Disk full inside torch's zip writer: was reported as "unexpected pos 704 vs 598"."""
    data = _save_steps(tmp_path, [1], async_save=async_save)
    budget = [random.randrange(64, 2048)]  # fails somewhere inside the first data file
    real = FileSystem.create_stream

    @contextlib.contextmanager
    def full(self: FileSystem, path: str | os.PathLike[str], mode: str) -> Iterator[object]:
        with real(self, path, mode) as f:
            yield _FullDisk(f, budget) if "w" in mode else f

    monkeypatch.setattr(FileSystem, "create_stream", full)
    ckpt = Checkpointer(tmp_path, async_save=async_save)
    rule = (rf"saving step 2 to {tmp_path} failed, nothing was committed: the disk is full \(ENOSPC\) while "
            rf"writing {tmp_path / 'step_2.tmp'} \(.* free of .* on the file system of {tmp_path}\); "
            rf"earlier checkpoints are untouched")
    with pytest.raises(CheckpointWriteError, match=rule) as info:
        ckpt.save(2, {"w": torch.randn(512, 33), "meta": {"step": 2}})
        ckpt.wait()
    assert isinstance(info.value.__cause__, (OSError, RuntimeError))  # torch's own error kept as the cause
    assert sorted(os.listdir(tmp_path)) == ["step_1"]
    monkeypatch.undo()
    w = torch.zeros(64, 33)
    assert ckpt.load({"w": w, "meta": {}}) == 1 and torch.equal(w, data[1])


def test_disk_full_on_a_real_tiny_file_system(tmp_path: Path) -> None:
    """A real full disk: a 64 KiB tmpfs (needs root and mount; skipped elsewhere, e.g. in the sandbox)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    try:
        ckpt = Checkpointer(mnt / "ck", async_save=False)
        w = torch.randn(1000)
        ckpt.save(1, {"w": w})
        with pytest.raises(CheckpointWriteError, match=rf"the disk is full \(ENOSPC\) while writing {mnt / 'ck' / 'step_2.tmp'}"):
            ckpt.save(2, {"w": torch.randn(40_000)})
        back = torch.zeros(1000)
        assert ckpt.steps() == [1] and ckpt.load({"w": back}) == 1 and torch.equal(back, w)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_describe_write_error_other_errnos(tmp_path: Path) -> None:
    err = RuntimeError("unexpected pos 704 vs 598")
    err.__context__ = OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / "f"))
    assert describe_write_error(err, tmp_path, tmp_path).startswith(f"the disk quota is exceeded (EDQUOT) while writing {tmp_path / 'f'}")
    bare = describe_write_error(RuntimeError("unexpected pos 1 vs 0"), tmp_path, tmp_path)
    assert bare.startswith("a write came up short (unexpected pos 1 vs 0; the disk may be full)")
    assert describe_write_error(ValueError("x"), tmp_path, tmp_path) == "ValueError('x')"
