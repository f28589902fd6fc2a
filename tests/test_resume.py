"""Train → kill -9 → resume repeats the uninterrupted run's losses bitwise (CPU)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from _run import FAST, gem, gem_popen, losses, summary

STEPS = "12"


def _committed(ckpt: Path, step: int) -> bool:
    return (ckpt / f"step_{step}" / "COMMIT.json").exists()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The uninterrupted run's losses: the same command (no checkpoints, so no writer) for
    both writers' kill-and-resume runs, trained once per module."""
    log = tmp_path_factory.mktemp("ref")
    ref = gem("--steps", STEPS, *FAST, "--log-dir", str(log))
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = losses(log)
    assert sorted(want) == list(range(1, 13))
    return want


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_kill_and_resume_matches_uninterrupted(tmp_path: Path, writer: str,
                                               uninterrupted: dict[int, float]) -> None:
    want = uninterrupted

    ckpt, logs = tmp_path / "ckpt", tmp_path / "run"
    run = ["--steps", STEPS, *FAST, "--ckpt-dir", str(ckpt), "--ckpt-every", "4", "--log-dir", str(logs),
           "--ckpt-writer", writer]
    p = gem_popen(*run)
    deadline = time.time() + 300
    while not _committed(ckpt, 8) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert _committed(ckpt, 4), "no checkpoint was committed before the kill"
    res = gem(*run, "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    got = losses(logs)
    assert sorted(got) == list(range(1, 13))
    for step in range(1, 13):
        assert got[step] == want[step], f"step {step}: resumed {got[step]!r} != uninterrupted {want[step]!r}"
    assert summary(res.stdout)["steps"] == 12


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigterm_checkpoints_and_exits_zero(tmp_path: Path, writer: str) -> None:
    """SIGTERM to the trainer's whole process group (as `timeout`, a scheduler or a terminal
    send it; the process writer is in the group too): a last checkpoint, exit 0."""
    ckpt = tmp_path / "ckpt"
    p = gem_popen("--steps", "100000", *FAST, "--ckpt-dir", str(ckpt), "--ckpt-every", "1000",
                  "--log-dir", str(tmp_path / "log"), "--ckpt-writer", writer, new_session=True)
    deadline = time.time() + 300
    log = tmp_path / "log" / "metrics.jsonl"
    while (not log.exists() or log.stat().st_size == 0) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    s = summary(out)
    assert s["stop_reason"].startswith("signal")
    assert 1 <= s["steps"] < 100000
    assert _committed(ckpt, s["steps"]), f"no checkpoint at the stop step {s['steps']}"


def test_resume_with_torchrec_tables_is_bitwise(tmp_path: Path) -> None:
    """One process with the tables sharded by torchrec (world of one): stop at step 4,
    resume to 8, same losses as 8 uninterrupted steps."""
    sparse = ["--sparse-sharding", "table_wise"]
    ref = gem("--steps", "8", *FAST, *sparse, "--log-dir", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    ck = str(tmp_path / "ck")
    first = gem("--steps", "4", *FAST, *sparse, "--ckpt-dir", ck, "--log-dir", str(tmp_path / "run"))
    assert first.returncode == 0, first.stderr[-3000:]
    second = gem("--steps", "8", *FAST, *sparse, "--ckpt-dir", ck, "--resume", "--log-dir", str(tmp_path / "run"))
    assert second.returncode == 0, second.stderr[-3000:]
    want, got = losses(tmp_path / "ref"), losses(tmp_path / "run")
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):
        assert got[step] == want[step], (step, got[step], want[step])
