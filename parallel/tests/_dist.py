"""Runs a function on a CPU gloo world of N processes (spawned) and returns each rank's result."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, store_path: str, out_dir: str, local: int,
           fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_WORLD_SIZE=str(local),
                      LOCAL_RANK=str(rank % local))
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_world(fn: Callable[..., Any], world: int, *args: Any, local: int | None = None) -> list[Any]:
    """Spawns ``world`` processes running ``fn(rank, world, *args)``; returns results by rank."""
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.spawn(_entry, args=(world, store, tmp, local or world, fn, args), nprocs=world,
                 join=True)
        return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(world)]
