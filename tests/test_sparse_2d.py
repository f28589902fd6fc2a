"""2-D sparse parallelism (`--sparse-mp`, torchrec DMPCollection through gem_parallel) on 4
gloo processes: tables sharded table-wise over groups of 2 ranks, 2 replica groups averaged
after every step. Matches 1 process on the same global batch; checkpoints resume bitwise.

Why equality holds: each rank trains on its batch's mean loss; torchrec divides the table
gradients by the model-parallel group size, so each group steps on its own mean; averaging
the replicas after an exact-SGD step is a step on the global mean. The tolerance (2e-5
relative) sits between float noise (~1e-7 seen) and a run without the replica sync (2e-4
and growing at --sparse-lr 1.0 by step 2, seen), so a missing sync fails the test.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from _run import env, gem, losses, stderr_tail, torchrun_cmd

STEPS = 5
COMMON = ["--eval-batches", "0", "--log-every", "1", "--no-progress", "--lr", "1e-3",
          "--sparse-sharding", "table_wise", "--sparse-lr", "1.0"]


def _four(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = torchrun_cmd(4, *COMMON, "--batch-size", "16", "--sparse-mp", "2", *args)
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)


def test_2d_sparse_matches_one_process_and_resumes_bitwise(tmp_path: Path) -> None:
    one = gem(*COMMON, "--steps", str(STEPS), "--batch-size", "64", "--log-dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    ck = tmp_path / "ck"
    four = _four("--steps", str(STEPS), "--ckpt-dir", str(ck), "--ckpt-every", "3",
                 "--log-dir", str(tmp_path / "four"))
    assert four.returncode == 0, stderr_tail(four.stderr)
    summary = json.loads(four.stdout.strip().splitlines()[-1])
    assert summary["sparse"] == {"sharding": "table_wise", "mp": 2, "replicas": 2, "replica_sync": True}
    a, b = losses(tmp_path / "one"), losses(tmp_path / "four")
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in a:
        assert abs(a[step] - b[step]) <= 2e-5 * abs(a[step]), (step, a[step], b[step])

    # Checkpoints of the 2-D tables (DTensors over torchrec's LocalShardsWrapper): drop the
    # final step's checkpoint, resume from step 3: steps 4 and 5 repeat bitwise.
    assert sorted(p.name for p in ck.iterdir()) == ["step_3", "step_5"]
    shutil.rmtree(ck / "step_5")
    again = _four("--steps", str(STEPS), "--ckpt-dir", str(ck), "--resume", "--log-dir", str(tmp_path / "again"))
    assert again.returncode == 0, stderr_tail(again.stderr)
    got = losses(tmp_path / "again")
    assert sorted(got) == [4, 5]
    for step in got:
        assert got[step] == b[step], (step, got[step], b[step])


def test_sparse_mp_must_divide_the_world(tmp_path: Path) -> None:
    bad = _four("--steps", "1", "--sparse-mp", "3")
    assert bad.returncode != 0 and "--sparse-mp=3 must divide world size 4" in bad.stderr, bad.stderr[-3000:]
