"""RNG states (python, numpy, torch CPU, CUDA) as a Stateful.

Each rank draws its own random numbers, so the state dict holds every rank's states
(gathered over the default process group when one exists) pickled into one bytes value:
the key set does not depend on the world size, so a checkpoint saved by 2 ranks loads on 3
(rank r restores entry r mod saved_world_size).
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import torch
import torch.distributed as dist

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is optional
    np = None  # type: ignore[assignment]


def capture_rng() -> dict[str, Any]:
    """The calling process's RNG states."""
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        out["numpy"] = np.random.get_state()
    # Only if CUDA is already in use: never initialise a GPU context just to checkpoint.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if np is not None and "numpy" in states:
        np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        saved = states["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(saved)


class RNGState:
    """Stateful wrapper: put `RNGState()` in the checkpointed state under e.g. "rng".

    `state_dict()` is a collective when torch.distributed is initialised (call it on every
    rank, as `Checkpointer.save/load` do).
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group

    def _dist(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def state_dict(self) -> dict[str, Any]:
        local = capture_rng()
        if self._dist():
            gathered: list[Any] = [None] * dist.get_world_size(self.process_group)
            dist.all_gather_object(gathered, local, group=self.process_group)
        else:
            gathered = [local]
        return {"per_rank": pickle.dumps(gathered), "world_size": len(gathered)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        per_rank = pickle.loads(state_dict["per_rank"])
        if not isinstance(per_rank, list) or not per_rank:
            raise ValueError("RNG state_dict['per_rank'] must pickle a non-empty list of states")
        rank = dist.get_rank(self.process_group) if self._dist() else 0
        restore_rng(per_rank[rank % len(per_rank)])
