"""Helpers: run the trainer as a subprocess (what a user runs) and read its logs."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# Small and fast: the tiny preset with small batches; every test overrides what it checks.
FAST = ["--batch-size", "16", "--eval-batches", "0", "--log-every", "1", "--no-progress"]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(extra or {})
    return e


def gem(*args: str, cwd: Path | None = None, timeout: float = 600,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gem_trainer", *args], env=env(extra_env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def gem_popen(*args: str, new_session: bool = False) -> subprocess.Popen[str]:
    """The trainer as a child; `new_session`: in its own process group (`os.killpg(p.pid, ...)`
    then signals it and its children, as a terminal or a scheduler does)."""
    return subprocess.Popen([sys.executable, "-m", "gem_trainer", *args], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    """`torchrun --nproc-per-node nproc ... -m gem_trainer args` on a free local port (gloo on CPU)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "gem_trainer", *args]


# Warnings every rank prints at start-up; in a failed multi-rank run they filled the kept tail
# of stderr and hid the failing rank's own lines.
_NOISE = ("is_fx_tracing will return true", "dense tensor size calculation in dry run")


def stderr_tail(err: str, n: int = 5000) -> str:
    """The last `n` characters of a run's stderr without the ranks' repeated start-up warnings
    (an assertion message: what a failure shows)."""
    return "\n".join(ln for ln in err.splitlines() if not any(w in ln for w in _NOISE))[-n:]


def summary(out: str) -> dict[str, Any]:
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def losses(log_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl (the last line written for each step wins)."""
    out: dict[int, float] = {}
    with open(log_dir / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec and "samples" in rec:
                out[int(rec["step"])] = float(rec["loss"])
    return out
