"""The end of a run on two GPUs under NCCL (issue #18): evaluation, summary, checkpoint and
resume, with FSDP's all-gathers through NCCL and through gem_comms' copy engines.

A 2-GPU run once trained fine and then crashed in evaluation (a CPU all-gather on the NCCL
group), which no CPU test could see. This launches `torchrun --nproc-per-node 2 -m
gem_trainer` itself on the tiny preset; it skips without two GPUs (`tools/gpu/multi_gpu.sh` runs it
on a lent 2-GPU machine)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

BATCH, EVAL_BATCHES, STEPS = 32, 2, 6


def _torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "4")
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "gem_trainer", *args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    print(res.stdout[-4000:])  # shown by pytest -rA / on failure: the run's table and JSON
    print(res.stderr[-4000:], file=sys.stderr)
    return res


def _summary(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr[-6000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert lines, res.stdout[-3000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("comms", ["nccl", "copy_engine"])
def test_two_gpu_run_evaluates_summarises_checkpoints_and_resumes(tmp_path: Path, comms: str) -> None:
    ck = tmp_path / "ck"
    common = ["--batch-size", str(BATCH), "--eval-batches", str(EVAL_BATCHES), "--ckpt-dir", str(ck),
              "--ckpt-every", "3", "--log-every", "1", "--no-progress", "--comms", comms]
    s = _summary(_torchrun("--steps", str(STEPS), "--log-dir", str(tmp_path / "logs"), *common))
    assert s["world_size"] == 2 and s["steps"] == STEPS and s["stop_reason"] == "steps", s
    assert s["device"].startswith("cuda"), s
    assert isinstance(s["loss"], float) and math.isfinite(s["loss"]), s
    assert s["tokens_per_s"] > 0 and s["samples_per_s"] > 0, s
    assert s["tasks"], "evaluation returned no tasks"
    for task, m in s["tasks"].items():
        # every rank's held-out samples were gathered: 2 ranks x eval batches x batch size
        assert m["eval_samples"] == 2 * EVAL_BATCHES * BATCH, (task, m)
        assert 0.0 <= m["auc"] <= 1.0 and math.isfinite(m["ne"]), (task, m)
        assert 0.5 < m["auc_bayes"] < 1.0, (task, m)
    for step in (3, STEPS):
        assert (ck / f"step_{step}" / "COMMIT.json").is_file(), sorted(p.name for p in ck.iterdir())
    metrics = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    assert any('"eval"' in ln for ln in metrics) and any('"summary"' in ln for ln in metrics)
    if comms == "nccl":
        # resume from the last checkpoint on the same 2 GPUs: distributed load under NCCL
        r = _summary(_torchrun("--steps", str(STEPS + 2), "--resume", *common))
        assert r["resumed_from"] == STEPS and r["steps"] == STEPS + 2, r
        assert (ck / f"step_{STEPS + 2}" / "COMMIT.json").is_file()
