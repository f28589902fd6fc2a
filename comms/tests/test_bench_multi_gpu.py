"""The multi_gpu bench's own plumbing on CPU (gloo world of 2, host shared-memory copy engine):
stage lines per rank, rows, the JSON tee'd to $OUT, a late rank caught by the stage deadline
(never a silent hang), and the watchdog's stack dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _bench(tmp_path: Path, *args: str, stall: str = "", limit: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if stall:
        env["GEM_COMMS_BENCH_STALL"] = stall
    # --standalone: torchrun picks a free port itself (no race with other tests for one)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "gem_comms.bench.multi_gpu", "--device", "cpu", "--quick", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)


def _json(tmp_path: Path) -> dict[str, object]:
    with open(tmp_path / "comms_multi_gpu.json") as f:
        return json.load(f)  # type: ignore[no-any-return]


@pytest.mark.parametrize("signal", ["push", "poll"])
def test_cpu_run_prints_stages_rows_and_json(tmp_path: Path, signal: str) -> None:
    res = _bench(tmp_path, "--signal-mode", signal)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for rank in (0, 1):
        for stage in ("init", "all_gather", "all_to_all", "reduce_scatter", "lanes", "host", "interference", "release"):
            assert f"rank {rank}: stage {stage}" in res.stdout, (rank, stage)
    assert "| all_gather (busbw) | 0.5 MiB/rank | True |" in res.stdout
    last = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    assert last["ok"] is True and last["signal"] == signal
    saved = _json(tmp_path)
    stages = saved["stages"]
    assert isinstance(stages, dict) and set(stages) == {"all_gather", "all_to_all", "reduce_scatter", "lanes", "host",
                                                     "interference"}
    assert all(r["equal_to_ref"] for r in stages["all_gather"]) and stages["all_to_all"]["equal_to_ref"]


def test_interference_ranks_issue_the_same_collectives(tmp_path: Path) -> None:
    """Rank 1's matmul windows take 20 ms longer, so the ranks would size the run of collectives
    beside them differently (locally: 67 vs 9); they must issue the same count, or the
    copy-engine rank with the larger one waits for flags its peer never writes (the stage hung
    so on 2 H200; with the local count this test times out)."""
    res = _bench(tmp_path, "--stage-timeout", "20", "--skip", "all_to_all,reduce_scatter,lanes,host",
                 stall="interference_matmul:1:0.02", limit=90)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rows = _json(tmp_path)["stages"]["interference"]  # type: ignore[index]
    assert [r["scenario"] for r in rows] == ["matmul alone", "beside copy_engine all-gather", "beside gloo all-gather"]
    assert all(r["count"] > 2 for r in rows[1:])  # sized by rank 1's longer window


def test_late_rank_fails_the_stage_by_its_deadline(tmp_path: Path) -> None:
    """Rank 1 is 8 s late for all_to_all; rank 0 gives up after --stage-timeout 2, names the
    stage and the missing rank, keeps what was measured, and every process exits non-zero."""
    res = _bench(tmp_path, "--stage-timeout", "2", stall="all_to_all:1:8")
    assert res.returncode != 0
    assert "rank 0: FAILED: StageFailed: all_to_all" in res.stdout, res.stdout[-3000:]
    assert "ranks [1] did not arrive" in res.stdout
    saved = _json(tmp_path)
    assert saved["ok"] is False and "all_gather" in saved["stages"]  # type: ignore[operator]
    assert "all_to_all" in str(saved["error"])


def test_watchdog_dumps_every_rank_stack(tmp_path: Path) -> None:
    # The stages before lanes are skipped: the watchdog counts from init, and on a loaded 2-core
    # CI box the earlier stages outlasted its 4 s (both ranks' stacks were in `interference`).
    res = _bench(tmp_path, "--watchdog", "4", "--stage-timeout", "60",
                 "--skip", "all_gather,interference,all_to_all,reduce_scatter", stall="lanes:0:30")
    assert res.returncode != 0
    # faulthandler: the watchdog's (or, if the peer exited first, SIGTERM's) dump on each rank:
    # rank 0 sleeping in the test hook, rank 1 waiting for it at the stage's start
    assert "Timeout (0:00:04)!" in res.stderr, res.stderr[-4000:]
    # (the two ranks' dumps may interleave on the shared stderr, so look for the names alone)
    assert "_stall" in res.stderr and "agree" in res.stderr, res.stderr[-4000:]
