"""gem_checkpoint: async, atomic, verified, resharding checkpoints of the whole training state.

    ckpt = Checkpointer("ckpts", keep_last=3, keep_every=1000)
    state = {"model": model, "optim": optim, "loader": loader, "rng": RNGState(), "step": 0}
    ckpt.save(step, state)      # blocks only for the host copy; writes in the background
    ckpt.wait()
    step = ckpt.load(state)     # newest committed + verified checkpoint, in place
"""

from gem_checkpoint._checkpointer import (
    FAULT_ENV,
    CheckpointBusyError,
    Checkpointer,
    CheckpointWriteError,
)
from gem_checkpoint._fs import CheckpointCorruptError, CheckpointError
from gem_checkpoint._rng import RNGState, capture_rng, restore_rng

__version__ = "0.1.5"
__all__ = [
    "FAULT_ENV",
    "CheckpointBusyError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointer",
    "RNGState",
    "__version__",
    "capture_rng",
    "restore_rng",
]
