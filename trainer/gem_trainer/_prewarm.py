"""Kernel prewarm: the run's own kernels compile in a child process while torch.compile
compiles the blocks.

A cold compiled start on a GPU spends its first minute in torch.compile (dynamo's trace,
inductor's code generation), and then, at the first step, JIT-compiles the kernels that
torch.compile does not make: gem_kernels' Triton kernels and, where flash-attn-4 is
installed, FlashAttention-4's CuTe kernels (~25 s on an H200 for the attention forward and
backward). Both keep on-disk caches that every process of the machine shares: Triton's
always, FlashAttention-4's when `FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1` (the CLI sets it).

So a single-process compiled CUDA run starts a child that runs one eager step of the same
model and optimizer on a small batch (`child_config`): it compiles those kernels into the
caches while the parent traces, and the parent's first step loads them instead of compiling.
The child writes nothing but those caches (no checkpoints, logs, compile-cache file or
teacher), is stopped at the parent's first step (SIGKILL: both caches write an entry to a
temporary name and rename it, so a kill leaves no partial entry), and its failure never
fails the run. It changes no result: the same kernels are compiled either way.
`TrainConfig.prewarm=False` (`--no-prewarm`) turns it off.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import torch

from gem_trainer.config import TrainConfig

# A child's batch: a few samples of the run's length distribution (which keeps the
# attention's path choice, gem_kernels' mean-length rule, the run's), not its token budget.
CHILD_BATCH_TOKENS = 32768
# The parent's alone: a launcher's (torchrun's) variables would make the child join the
# parent's job; the sync-debug hook is for the parent's steady steps.
_PARENT_ONLY_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GEM_SYNC_DEBUG_AFTER")


def off_reason(cfg: TrainConfig, device: torch.device, world: int) -> str | None:
    """Why this run starts no prewarm child, or None when it does."""
    if not cfg.prewarm:
        return "off (prewarm=False)"
    if device.type != "cuda":
        return "off (no CUDA device)"
    if not cfg.compile:
        return "off (compile=False: the first step compiles nothing else meanwhile)"
    if world > 1:
        return f"off ({world} processes)"
    return None


def child_config(cfg: TrainConfig) -> TrainConfig:
    """The child's run: one eager step of the same model on a small batch, writing nothing."""
    return dataclasses.replace(
        cfg, steps=1, compile=False, compile_cache="", ckpt_dir="", resume=False, log_dir="",
        eval_batches=0, progress=False, export_teacher="", prewarm=False,
        batch_tokens=min(cfg.batch_tokens, CHILD_BATCH_TOKENS) if cfg.batch_tokens else 0,
        batch_size=min(cfg.batch_size, 16))


class Prewarm:
    """The child process; `stop()` ends it (if still running) and says how it went."""

    def __init__(self, cfg: TrainConfig, deterministic: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _PARENT_ONLY_ENV}
        # the parent's import path (a Bazel or zip launcher sets sys.path, not the environment)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._err = tempfile.TemporaryFile()  # the child's stderr: its last line if it fails
        self._t0 = time.perf_counter()
        self._end: float | None = None
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "gem_trainer._prewarm",
             json.dumps({"config": dataclasses.asdict(child_config(cfg)), "deterministic": deterministic})],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err, env=env)
        self.outcome: str | None = None

    def stop(self) -> str:
        """Ends the child (SIGKILL if it still runs) and returns the outcome (idempotent)."""
        if self.outcome is not None:
            return self.outcome
        p, self._proc = self._proc, None
        assert p is not None
        took = time.perf_counter() - self._t0
        rc = p.poll()
        if rc is None:
            p.kill()
            p.wait()
            self.outcome = f"stopped at the first step after {took:.1f} s (still compiling)"
        elif rc == 0:
            self.outcome = "finished before the first step"
        else:
            self._err.seek(0)
            lines = self._err.read().decode("utf-8", "replace").strip().splitlines()
            self.outcome = f"failed (exit code {rc}): {lines[-1][:300] if lines else 'no message'}"
        self._err.close()
        return self.outcome


def start(cfg: TrainConfig, device: torch.device, world: int, deterministic: bool) -> Prewarm | str:
    """Starts the child, or returns why not (`off_reason`, or the error of the start).
    `deterministic`: the parent's setting, which picks some kernels (FlashAttention-4's
    deterministic backward), so the child's too."""
    why = off_reason(cfg, device, world)
    if why is not None:
        return why
    try:
        return Prewarm(cfg, deterministic)
    except OSError as e:  # (no fork: a full process table, no memory) the run goes on without
        return f"failed to start ({type(e).__name__}: {e})"


def _main(argv: list[str]) -> int:
    from gem_trainer._loop import train

    args = json.loads(argv[0])
    train(TrainConfig(**args["config"]), deterministic=args["deterministic"])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
