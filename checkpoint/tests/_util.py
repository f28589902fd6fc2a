"""Shared test helpers: a small training state and subprocess launching."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

WORKER = str(Path(__file__).with_name("_worker.py"))


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


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    e.pop("GEM_CKPT_FAULT", None)
    e["OMP_NUM_THREADS"] = "1"
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, *args], env=kw.pop("env", env()), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
