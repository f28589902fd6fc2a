"""2 gloo processes with torchrec table-wise tables: kill -9 → resume repeats the
uninterrupted 2-process run's losses bitwise; SIGTERM stops every rank at the same step.

Bitwise, not a tolerance: the resumed run has the same world size, the same data order
(loader position restored), the same parameters, optimizer state and RNG (restored exactly
from DCP), and a 2-rank gloo sum is order-independent, so every float op repeats.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from _run import env, losses, stderr_tail, torchrun_cmd

STEPS = 16
COMMON = ["--eval-batches", "0", "--log-every", "1", "--no-progress", "--lr", "1e-3",
          "--batch-size", "16", "--sparse-sharding", "table_wise"]


def _torchrun(*args: str) -> list[str]:
    return torchrun_cmd(2, *COMMON, *args)


def _committed(ckpt: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in ckpt.glob("step_*") if (p / "COMMIT.json").exists())


def _children(pid: int) -> list[int]:
    """Child processes of `pid` (torchrun's workers), from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return sorted(kids)


def test_two_process_sharded_kill_and_resume_is_bitwise(tmp_path: Path) -> None:
    ref = subprocess.run(_torchrun("--steps", str(STEPS), "--log-dir", str(tmp_path / "ref")),
                         env=env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, stderr_tail(ref.stderr)
    want = losses(tmp_path / "ref")
    assert sorted(want) == list(range(1, STEPS + 1))

    ckpt, logs = tmp_path / "ck", tmp_path / "run"
    run = ["--steps", str(STEPS), "--ckpt-dir", str(ckpt), "--ckpt-every", "4", "--log-dir", str(logs)]
    # Own session: kill -9 reaches torchrun and both workers at once (a crash of the job).
    p = subprocess.Popen(_torchrun(*run), env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while 4 not in _committed(ckpt) and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    left = _committed(ckpt)
    assert left and 0 < max(left) < STEPS, f"kill did not land mid-run: committed {left}"

    res = subprocess.run(_torchrun(*run, "--resume"), env=env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, stderr_tail(res.stderr)
    got = losses(logs)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == want[step], f"step {step}: resumed {got[step]!r} != uninterrupted {want[step]!r}"


def test_two_process_sigterm_stops_all_ranks_with_a_checkpoint(tmp_path: Path) -> None:
    """SIGTERM to one rank only: both ranks agree (through the per-step all-reduce) to stop
    after the same step, save it and exit 0."""
    ckpt, logs = tmp_path / "ck", tmp_path / "log"
    p = subprocess.Popen(_torchrun("--steps", "100000", "--ckpt-dir", str(ckpt), "--ckpt-every", "1000",
                                   "--log-dir", str(logs)),
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    log = logs / "metrics.jsonl"
    while (not log.exists() or log.stat().st_size == 0) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    workers = _children(p.pid)
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGTERM)  # one rank only; the other learns it from the all-reduce
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-5000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stop_reason"] == f"signal {int(signal.SIGTERM)}"
    assert 1 <= summary["steps"] < 100000
    assert _committed(ckpt) == [summary["steps"]]
