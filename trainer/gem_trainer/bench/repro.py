"""Reproducibility bench: the same command twice, with and without `--deterministic`.

    python3 -m gem_trainer.bench.repro                                   # tiny preset, CPU
    python3 -m gem_trainer.bench.repro --preset h200 --steps 30          # one GPU, ~3 min

Runs the trainer four times as a user would (`python3 -m gem_trainer`, per-step losses in
JSONL): twice with `--deterministic`, twice with `--no-deterministic`. Reports per mode
whether the two runs agree bit for bit, the first step where they differ and the largest
difference, and the median step time (what determinism costs). On the GPU the Triton GDPA
backward accumulates dK/dV with fp32 atomics, which torch's switch does not cover: the
`deterministic` pair may still differ there, and this bench says from which step.

Output: a table, `repro.json` under `--out` (default `$OUT` or a temporary folder) and a
final one-line JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any


def _run(args: list[str], log_dir: str) -> tuple[dict[int, float], dict[str, Any]]:
    cmd = [sys.executable, "-m", "gem_trainer", *args, "--log-every", "1", "--no-progress",
           "--log-dir", log_dir]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    losses: dict[int, float] = {}
    with open(os.path.join(log_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec and "samples" in rec:
                losses[int(rec["step"])] = float(rec["loss"])
    return losses, json.loads(res.stdout.strip().splitlines()[-1])


def compare(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """First differing step (None: bitwise equal) and the largest |difference|."""
    diff = [s for s in sorted(a) if a[s] != b.get(s)]
    return {"equal": not diff and a.keys() == b.keys(), "first_diff_step": diff[0] if diff else None,
            "max_abs_diff": max((abs(a[s] - b[s]) for s in diff if s in b), default=0.0)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="gem_repro_"))
    a = p.parse_args(argv)
    base = ["--preset", a.preset, "--steps", str(a.steps), "--eval-batches", "0"]
    if a.batch_size:
        base += ["--batch-size", str(a.batch_size)]
    os.makedirs(a.out, exist_ok=True)
    result: dict[str, Any] = {"preset": a.preset, "steps": a.steps}
    print(f"{'mode':>16} {'bitwise':>8} {'first diff':>10} {'max |diff|':>11} {'step s (median)':>16}")
    for mode in ("--deterministic", "--no-deterministic"):
        runs = [_run([*base, mode], os.path.join(a.out, f"{mode[2:]}_{i}")) for i in range(2)]
        row = compare(runs[0][0], runs[1][0])
        row["step_s_median"] = [r[1].get("step_s_median") for r in runs]
        row["device"] = runs[0][1].get("device")
        result[mode[2:]] = row
        first = "-" if row["first_diff_step"] is None else str(row["first_diff_step"])
        med = min(x for x in row["step_s_median"] if x is not None)
        print(f"{mode[2:]:>16} {str(row['equal']):>8} {first:>10} {row['max_abs_diff']:>11.3g} {med:>16.4f}")
    with open(os.path.join(a.out, "repro.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
