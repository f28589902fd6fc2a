"""Stall per save: torch's `dcp.async_save` vs gem_checkpoint's Checkpointer, same 256 MB state.

    python3 -m gem_checkpoint.bench.vs_dcp_async
"""
from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict_saver import async_save

from gem_checkpoint import Checkpointer


class _State:
    """A Stateful wrapper, as the trainer hands its state to the Checkpointer."""

    def __init__(self, sd: dict[str, torch.Tensor]) -> None:
        self.sd = sd

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


def main() -> None:
    torch.manual_seed(0)
    state = {"w%d" % i: torch.randn(16 << 20) for i in range(4)}  # 4 x 64 MB = 256 MB
    d = tempfile.mkdtemp()
    # torch's own async_save (its default stager: a host copy, then a thread writes)
    dcp_stall = []
    for s in range(3):
        t = time.perf_counter()
        fut: Any = async_save(state, checkpoint_id=f"{d}/dcp{s}")
        dcp_stall.append(time.perf_counter() - t)
        fut.result()
    ck = Checkpointer(f"{d}/gem", keep_last=2)
    gem_stall = []
    for s in range(3):
        t = time.perf_counter()
        ck.save(s + 1, {"m": _State(state)})
        gem_stall.append(time.perf_counter() - t)
        ck.wait()
    print("dcp.async_save stall s:", [round(x, 3) for x in dcp_stall])
    print("gem Checkpointer stall s:", [round(x, 3) for x in gem_stall])


if __name__ == "__main__":
    main()
