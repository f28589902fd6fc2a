"""Checkpointer(writer="process"): DCP's serialisation in a child process with its own GIL.

The host copies live in shared memory and the child maps each once: these tests change the
state between saves (the child must read the new contents, not a stale copy), grow a tensor
(a new buffer must reach the child), check the files are the thread writer's format, and cover
the failure paths: an injected full disk in the child, the child killed mid-write, the parent
killed (the child must not outlive it), bad arguments.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from _util import Loader, trained
from gem_checkpoint import CheckpointError, Checkpointer
from gem_checkpoint._checkpointer import FAULT_ENV


def _state(seed: int) -> dict[str, object]:
    model, optim = trained(seed)
    return {"model": model, "optim": optim, "loader": Loader(seed), "step": 0,
            "empty": torch.empty(0, 3), "ids": torch.randint(0, 1 << 40, (33,))}


def _snapshot(state: dict[str, object]) -> dict[str, torch.Tensor]:
    model = state["model"]
    assert isinstance(model, torch.nn.Module)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_saves_track_changes_between_saves_and_load_exactly(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    state = _state(seed)
    ckpt = Checkpointer(tmp_path, keep_last=5, writer="process")
    snaps: dict[int, dict[str, torch.Tensor]] = {}
    loaders: dict[int, dict[str, object]] = {}
    model = state["model"]
    assert isinstance(model, torch.nn.Module)
    for step in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))  # new contents in the same shared buffers
        state["step"] = step
        loader = state["loader"]
        assert isinstance(loader, Loader)
        loader.pos = step * 7
        if step == 3:  # a grown tensor: the Stager allocates a new buffer the child has not mapped
            state["ids"] = torch.randint(0, 1 << 40, (65,))
        snaps[step] = _snapshot(state)
        loaders[step] = loader.state_dict()
        ckpt.save(step, state)
    ckpt.close()
    assert ckpt.steps() == [1, 2, 3]
    for step in (1, 2, 3):
        fresh = _state(seed + 1)
        fresh["ids"] = torch.zeros(65 if step == 3 else 33, dtype=torch.int64)
        assert Checkpointer(tmp_path).load(fresh, step=step) == step
        got = fresh["model"]
        assert isinstance(got, torch.nn.Module)
        for k, v in got.state_dict().items():
            assert torch.equal(v, snaps[step][k]), (step, k)
        loader = fresh["loader"]
        assert isinstance(loader, Loader) and loader.state_dict() == loaders[step]
        assert fresh["step"] == step
    # the files are plain DCP, as the thread writer's
    out = tmp_path / "flat.pt"
    dcp_to_torch_save(tmp_path / "step_3", out)
    flat = torch.load(out, weights_only=False)
    assert torch.equal(flat["ids"], state["ids"])  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="after close"):
        ckpt.save(4, state)


def test_same_bytes_as_the_thread_writer(tmp_path: Path) -> None:
    state = _state(random.randrange(1 << 30))
    for writer in ("thread", "process"):
        ckpt = Checkpointer(tmp_path / writer, writer=writer)  # type: ignore[arg-type]
        ckpt.save(1, state)
        ckpt.close()
    a, b = ({p.name: p.read_bytes() for p in (tmp_path / w / "step_1").glob("*.distcp")} for w in ("thread", "process"))
    assert a == b and a


def test_disk_full_in_the_child_is_reported_and_nothing_committed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(random.randrange(1 << 30))
    first = Checkpointer(tmp_path)  # a good one first (thread writer)
    first.save(1, state)
    first.wait()
    monkeypatch.setenv(FAULT_ENV, "write")  # the child inherits the environment at start-up
    ckpt = Checkpointer(tmp_path, writer="process")
    ckpt.save(2, state)
    with pytest.raises(CheckpointError, match=r"disk is full \(ENOSPC\)"):
        ckpt.wait()
    assert ckpt.steps() == [1]
    assert not [e for e in os.listdir(tmp_path) if e.endswith(".tmp")]
    ckpt.close()


def test_child_killed_mid_write_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(random.randrange(1 << 30))
    monkeypatch.setenv(FAULT_ENV, "write:kill")
    ckpt = Checkpointer(tmp_path, writer="process")
    ckpt.save(1, state)
    with pytest.raises(CheckpointError, match="writer process died"):
        ckpt.wait()
    assert ckpt.steps() == []
    ckpt.save(2, state)  # the dead child is reported again, clearly, not a hang
    with pytest.raises(CheckpointError, match="writer process died"):
        ckpt.wait()
    ckpt.close()


_PARENT = """
import sys, time, torch
from gem_checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1], writer="process")
ck.save(1, {"w": torch.randn(64, 64)})
ck.wait()
print(ck._process._proc.pid, flush=True)
time.sleep(60)
"""


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"writer process {child} outlived its killed parent")


def test_group_stop_signals_leave_the_writer_to_its_parent(tmp_path: Path) -> None:
    """SIGTERM / SIGINT sent to the whole process group (`timeout`, a scheduler, Ctrl-C) reach the
    child too: it must live on to write the trainer's last save (on the H200 a `timeout`'s
    SIGTERM killed it and the trainer's save on SIGTERM failed), and end at close()."""
    state = _state(random.randrange(1 << 30))
    ckpt = Checkpointer(tmp_path, writer="process")
    ckpt.save(1, state)
    ckpt.wait()
    assert ckpt._process is not None
    proc = ckpt._process._proc
    assert proc.pid is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        os.kill(proc.pid, sig)
    time.sleep(0.5)
    assert proc.is_alive()
    ckpt.save(2, state)
    ckpt.wait()
    ckpt.close()
    assert ckpt.steps() == [1, 2] and not proc.is_alive()


def test_bad_writer_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writer='x' must be 'thread' or 'process'"):
        Checkpointer(tmp_path, writer="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs async_save=True"):
        Checkpointer(tmp_path, writer="process", async_save=False)
