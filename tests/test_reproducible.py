"""The same command twice gives the same run, bit for bit, whatever the machine load (issue #20).

The drift came from the backward of an index with repeated indices (`index_put_` with
accumulate), which ATen runs on several threads with atomic float adds unless torch's
deterministic algorithms are on: the order of the adds followed the threads' timing. The
trainer turns them on by default on CPU (gem_trainer._preflight.determinism). Two intra-op
threads here (the default on the 2-core box, where the drift was seen); the second run
shares the CPUs with two busy-looping processes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _run import FAST, gem, losses, summary

THREADS = {"OMP_NUM_THREADS": "2"}


def _burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_same_command_twice_is_bitwise_equal_under_load(tmp_path: Path) -> None:
    args = ["--steps", "20", *FAST, "--eval-batches", "1"]
    a = gem(*args, "--log-dir", str(tmp_path / "a"), extra_env=THREADS)
    assert a.returncode == 0, a.stderr[-3000:]
    burners = _burners(2)
    try:
        b = gem(*args, "--log-dir", str(tmp_path / "b"), extra_env=THREADS)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert b.returncode == 0, b.stderr[-3000:]
    la, lb = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(la) == list(range(1, 21)) and sorted(lb) == sorted(la)
    diff = [(s, la[s], lb[s]) for s in la if la[s] != lb[s]]
    assert not diff, f"first differing step (step, run 1, run 2): {diff[0]}"
    sa, sb = summary(a.stdout), summary(b.stdout)
    assert sa["deterministic"] is True and sa["loss"] == sb["loss"]
    assert json.dumps(sa["tasks"]) == json.dumps(sb["tasks"])  # evaluation too
