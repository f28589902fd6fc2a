"""Shared test helpers: a small training state and subprocess launching."""

from __future__ import annotations

import multiprocessing as mp
import socket
from multiprocessing.connection import Connection
from typing import Any

import torch

class Loader:
    """Loader-like Stateful: position + shuffled order, plain python values."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(50, generator=g).tolist()
        self.pos = 0
        self.epoch = 0

    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.order, self.pos, self.epoch = list(sd["order"]), int(sd["pos"]), int(sd["epoch"])


def trained(seed: int, steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.register_buffer("seen", torch.zeros((), dtype=torch.int64))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(steps):
        model(torch.randn(5, 7)).square().mean().backward()
        optim.step()
        optim.zero_grad()
        model.seen += 1  # type: ignore[operator]
    return model, optim


_CTX: Any = None


def start(name: str, *args: Any) -> tuple[mp.process.BaseProcess, Connection]:
    """Runs _worker.entry(name, conn, *args) in a child forked from a torch-preloaded server."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "gem_checkpoint", "_worker"])
    import _worker

    parent, child = _CTX.Pipe()
    proc = _CTX.Process(target=_worker.entry, args=(name, child, *args))
    proc.start()
    child.close()
    return proc, parent


def recv(conn: Connection, proc: mp.process.BaseProcess, timeout: float = 120.0) -> Any:
    if not conn.poll(timeout):
        proc.kill()
        raise AssertionError(f"worker sent nothing in {timeout}s (exitcode {proc.exitcode})")
    return conn.recv()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
