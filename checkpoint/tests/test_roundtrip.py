"""Exact round trips of a whole training state, retention, staging, busy handling, format."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from _util import Loader, trained
from gem_checkpoint import CheckpointBusyError, CheckpointError, Checkpointer, RNGState


def _assert_same_optim(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sorted(sa["state"]) == sorted(sb["state"]) and len(sa["state"]) > 0
    for k, v in sa["state"].items():
        assert sorted(v) == sorted(sb["state"][k])
        for name, t in v.items():
            assert torch.equal(t, sb["state"][k][name]), (k, name)


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_exact(tmp_path: Path, async_save: bool) -> None:
    seed = random.randrange(1 << 30)
    model, optim = trained(seed)
    loader = Loader(seed)
    loader.pos, loader.epoch = 17, 2
    random.seed(seed), np.random.seed(seed % (1 << 31)), torch.manual_seed(seed)
    state = {"model": model, "optim": optim, "loader": loader, "rng": RNGState(),
             "step": 42, "ema": torch.randn(5, 3), "cfg": {"lr": 1e-2, "tasks": ["click", "conv"]},
             "empty": torch.empty(0, 4), "scalar": torch.tensor(3.5)}
    ckpt = Checkpointer(tmp_path, async_save=async_save)
    ckpt.save(42, state)
    ckpt.wait()
    expect = (random.random(), np.random.rand(), torch.rand(3))  # draws after the save point

    # A fresh process-equivalent: new objects, fresh (empty-state) optimizer, scrambled RNG.
    model2, optim2 = trained(seed + 1, steps=0)
    loader2 = Loader(seed + 1)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    ema2 = torch.zeros(5, 3)
    state2 = {"model": model2, "optim": optim2, "loader": loader2, "rng": RNGState(),
              "step": 0, "ema": ema2, "cfg": {}, "empty": torch.empty(0, 4), "scalar": torch.tensor(0.0)}
    assert Checkpointer(tmp_path).load(state2) == 42
    for (n1, t1), (n2, t2) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1
    _assert_same_optim(optim, optim2)
    assert loader2.state_dict() == loader.state_dict()
    assert state2["step"] == 42 and state2["cfg"] == state["cfg"]
    assert state2["ema"] is ema2 and torch.equal(ema2, state["ema"])  # filled in place
    assert state2["scalar"].item() == 3.5
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expect[0] and got[1] == expect[1] and torch.equal(got[2], expect[2])
    # Training continues identically after resume.
    x = torch.randn(4, 7)
    for m, o in ((model, optim), (model2, optim2)):
        m(x).sum().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))


def test_async_save_snapshots_at_call_time(tmp_path: Path) -> None:
    w = torch.randn(300, 300)
    meta = {"pos": 3, "hist": [1, 2]}
    snapshot = w.clone()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, {"w": w, "meta": meta})
    w.add_(1.0)  # training mutates right after save() returns
    meta["pos"] = 99
    meta["hist"].append(3)
    ckpt.wait()
    w2 = torch.zeros(300, 300)
    out = {"w": w2, "meta": {"pos": 0, "hist": []}}
    ckpt.load(out)
    assert torch.equal(w2, snapshot) and out["meta"] == {"pos": 3, "hist": [1, 2]}


def test_prepare_allocates_the_buffers_save_reuses(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    model, optim = trained(seed)
    state = {"model": model, "optim": optim, "step": 3}
    release = threading.Event()
    ckpt = Checkpointer(tmp_path, fault_hook=lambda stage: release.wait(30))  # holds the write
    nbytes = ckpt.prepare(state)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert nbytes >= 3 * params  # weights + AdamW's two moments
    before = {k: v.data_ptr() for k, v in ckpt._stager._buffers.items()}
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt.save(3, state)
    assert {k: v.data_ptr() for k, v in ckpt._stager._buffers.items()} == before  # reused, none new
    with pytest.raises(CheckpointBusyError, match="prepare"):
        ckpt.prepare(state)  # the buffers are being written from
    release.set()
    ckpt.wait()
    model2, optim2 = trained(seed + 1, steps=0)
    assert Checkpointer(tmp_path).load({"model": model2, "optim": optim2, "step": 0}) == 3
    assert all(torch.equal(v, snapshot[k]) for k, v in model2.state_dict().items())
    assert Checkpointer(tmp_path / "sync", async_save=False).prepare(state) == 0  # nothing staged


def test_retention_keep_last_and_every(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=2, keep_every=4)
    for step in range(1, 11):
        ckpt.save(step, {"x": torch.full((3,), float(step))})
    ckpt.wait()
    assert ckpt.steps() == [4, 8, 9, 10]
    assert sorted(os.listdir(tmp_path)) == ["step_10", "step_4", "step_8", "step_9"]
    x = torch.zeros(3)
    assert ckpt.load({"x": x}, step=8) == 8 and torch.equal(x, torch.full((3,), 8.0))
    # Newest committed is never deleted even if an older step is saved after it.
    ckpt.save(3, {"x": torch.zeros(3)})
    ckpt.wait()
    assert 10 in ckpt.steps() and 3 in ckpt.steps() and ckpt.latest() == 10


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save(5, {"x": torch.ones(4)})
    ckpt.save(5, {"x": torch.full((4,), 2.0)})
    ckpt.wait()
    x = torch.zeros(4)
    assert ckpt.steps() == [5] and ckpt.load({"x": x}) == 5 and torch.equal(x, torch.full((4,), 2.0))


def test_on_busy_raise_and_wait(tmp_path: Path) -> None:
    gate = threading.Event()

    def hook(stage: str) -> None:
        if stage == "write":
            gate.wait(10)

    ckpt = Checkpointer(tmp_path, on_busy="raise", fault_hook=hook)
    ckpt.save(1, {"x": torch.ones(2)})
    with pytest.raises(CheckpointBusyError, match="step 1 is still being written"):
        ckpt.save(2, {"x": torch.ones(2)})
    assert ckpt.latest() is None  # not visible before commit
    gate.set()
    ckpt.wait()
    assert ckpt.latest() == 1
    order: list[int] = []
    ckpt2 = Checkpointer(tmp_path, on_busy="wait", fault_hook=lambda s: order.append(len(os.listdir(tmp_path))))
    ckpt2.save(2, {"x": torch.ones(2)})
    ckpt2.save(3, {"x": torch.ones(2)})  # waits: the two writes never interleave
    ckpt2.wait()
    assert ckpt2.steps() == [1, 2, 3]


def test_stale_tmp_ignored_and_cleaned(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, {"x": torch.ones(2)})
    ckpt.wait()
    (tmp_path / "step_7.tmp").mkdir()
    (tmp_path / "step_7.tmp" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "step_8").mkdir()  # renamed but never marked (crash before the marker)
    assert ckpt.latest() == 1
    assert Checkpointer(tmp_path).latest() == 1
    assert sorted(os.listdir(tmp_path)) == ["step_1"]


def test_empty_dir_and_bad_arguments(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "new")
    assert ckpt.latest() is None and ckpt.steps() == []
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        ckpt.load({"x": torch.ones(1)})
    with pytest.raises(FileNotFoundError, match="step=3"):
        ckpt.load({"x": torch.ones(1)}, step=3)
    with pytest.raises(ValueError, match="keep_last"):
        Checkpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="keep_every"):
        Checkpointer(tmp_path, keep_every=0)
    with pytest.raises(ValueError, match="on_busy"):
        Checkpointer(tmp_path, on_busy="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step"):
        ckpt.save(-1, {"x": torch.ones(1)})
    with pytest.raises(TypeError, match="state must be a dict"):
        ckpt.save(1, [torch.ones(1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without '.'"):
        ckpt.save(1, {"a.b": torch.ones(1)})


def test_missing_key_in_checkpoint_is_an_error(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, {"x": torch.ones(2)})
    ckpt.wait()
    with pytest.raises(CheckpointError, match="Missing key in checkpoint state_dict: y"):
        ckpt.load({"x": torch.zeros(2), "y": torch.zeros(2)})


def test_files_are_plain_dcp(tmp_path: Path) -> None:
    model, optim = trained(random.randrange(1000))
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, {"model": model, "optim": optim, "step": 3})
    ckpt.wait()
    folder = tmp_path / "step_3"
    md = FileSystemReader(str(folder)).read_metadata()
    assert "model.0.weight" in md.state_dict_metadata and "step" in md.state_dict_metadata
    assert list(md.state_dict_metadata["model.0.weight"].size) == [16, 7]  # type: ignore[union-attr]
    out = tmp_path / "full.pt"
    dcp_to_torch_save(str(folder), str(out))
    sd = torch.load(out, weights_only=False)
    assert torch.equal(sd["model"]["0.weight"], model.state_dict()["0.weight"])
    assert sd["step"] == 3


@pytest.mark.parametrize("user_setting", [True, False])
def test_write_settings_apply_during_the_write_and_are_restored(tmp_path: Path, user_setting: bool) -> None:
    """The data files are written without torch.save's per-record crc32 (the manifest's
    whole-file crc32 covers them) and with Python's switch interval lowered; the caller's
    settings come back after the write, the files still load bit-exactly, and a flipped byte
    is still caught by verification."""
    from gem_checkpoint._checkpointer import WRITE_SWITCH_INTERVAL_S

    seen: list[tuple[bool, float]] = []

    def hook(stage: str) -> None:
        if stage == "write":
            seen.append((torch.serialization.get_crc32_options(), sys.getswitchinterval()))

    before = torch.serialization.get_crc32_options(), sys.getswitchinterval()
    torch.serialization.set_crc32_options(user_setting)
    sys.setswitchinterval(float(torch.empty(()).uniform_(0.001, 0.02)))
    # Python keeps the interval in whole microseconds, and a get/set round trip can lose one.
    user_interval = sys.getswitchinterval()
    try:
        state = {"w": torch.randn(257, 33), "b": torch.randn(1000, dtype=torch.float64)}
        ckpt = Checkpointer(tmp_path, fault_hook=hook)
        ckpt.save(1, state)
        ckpt.wait()
        assert seen == [(False, pytest.approx(WRITE_SWITCH_INTERVAL_S, abs=2e-6))]
        assert torch.serialization.get_crc32_options() is user_setting
        assert sys.getswitchinterval() == pytest.approx(user_interval, abs=2e-6)
        got = {"w": torch.zeros(257, 33), "b": torch.zeros(1000, dtype=torch.float64)}
        assert Checkpointer(tmp_path).load(got) == 1
        assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"])
        data = next(p for p in (tmp_path / "step_1").iterdir() if p.suffix == ".distcp")
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        with pytest.raises(CheckpointError, match=data.name):
            Checkpointer(tmp_path).load(got)
    finally:
        torch.serialization.set_crc32_options(before[0])
        sys.setswitchinterval(before[1])


def test_write_settings_are_counted_across_overlapping_writes() -> None:
    from gem_checkpoint._checkpointer import WRITE_SWITCH_INTERVAL_S, _while_writing

    before = torch.serialization.get_crc32_options(), sys.getswitchinterval()
    torch.serialization.set_crc32_options(True)
    sys.setswitchinterval(0.004)
    try:
        a, b = _while_writing(), _while_writing()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        # b still writing
        assert torch.serialization.get_crc32_options() is False
        assert sys.getswitchinterval() == pytest.approx(WRITE_SWITCH_INTERVAL_S, abs=2e-6)
        b.__exit__(None, None, None)
        assert torch.serialization.get_crc32_options() is True
        assert sys.getswitchinterval() == pytest.approx(0.004, abs=2e-6)
    finally:
        torch.serialization.set_crc32_options(before[0])
        sys.setswitchinterval(before[1])


def test_info_reads_the_commit_marker(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    model, optim = trained(seed)
    ckpt = Checkpointer(tmp_path, async_save=False)
    with pytest.raises(FileNotFoundError, match="has no committed checkpoint"):
        ckpt.info()  # nothing saved yet
    first, second = sorted(random.sample(range(1, 1000), 2))
    sizes = {}
    for step in (first, second):
        ckpt.save(step, {"model": model, "optim": optim})
        ckpt.wait()
        sizes[step] = sum(f.stat().st_size for f in (tmp_path / f"step_{step}").iterdir() if f.suffix == ".distcp")
        optim.step()  # the next save holds other values (same sizes)
    newest = Checkpointer(tmp_path).info()  # another Checkpointer: read from disk
    assert newest["step"] == second and newest["world_size"] == 1, newest
    assert newest["torch"] == torch.__version__ and newest["total_bytes"] >= sizes[second] > 0, newest
    assert ckpt.info(first)["step"] == first
    with pytest.raises(TypeError, match=r"step='1' must be an int or None"):
        ckpt.info("1")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match=f"step={second + 1} has no committed checkpoint"):
        ckpt.info(second + 1)
    # A step whose marker is damaged is not committed: info says so, as load does.
    (tmp_path / f"step_{second}" / "COMMIT.json").write_text("{not json")
    assert ckpt.info()["step"] == first
    with pytest.raises(FileNotFoundError, match=f"step={second} has no committed"):
        ckpt.info(second)
