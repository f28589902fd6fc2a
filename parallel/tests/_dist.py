"""Runs a function on a CPU gloo world of N processes (spawned) and returns each rank's result."""

from __future__ import annotations

import os
import tempfile
import warnings
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
        path = os.path.join(out_dir, f"{rank}.pt")
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)  # present = complete (run_world relies on it)
    finally:
        dist.destroy_process_group()


def run_world(fn: Callable[..., Any], world: int, *args: Any, local: int | None = None) -> list[Any]:
    """Spawns ``world`` processes running ``fn(rank, world, *args)``; returns results by rank.

    A rank that dies by a signal *after every rank has written its result* (gloo / torchrec
    C++ threads torn down at process exit: once in CI, "terminate called without an active
    exception", SIGABRT after the last result was saved) is reported as a warning, not a
    failure: the results are complete and the assertions run on them. A signal before that,
    or any Python exception in a rank, fails as before.
    """
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        paths = [os.path.join(tmp, f"{r}.pt") for r in range(world)]
        try:
            mp.spawn(_entry, args=(world, store, tmp, local or world, fn, args), nprocs=world,
                     join=True)
        except mp.ProcessExitedException as e:
            if not (e.signal_name and all(os.path.exists(p) for p in paths)):
                raise
            warnings.warn(f"run_world: a rank died by {e.signal_name} after every rank wrote its "
                          f"result (teardown); the results are used: {e}", stacklevel=2)
        return [torch.load(p, weights_only=False) for p in paths]
