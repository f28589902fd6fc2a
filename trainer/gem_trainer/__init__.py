"""gem_trainer: the end-to-end GEM trainer (`./bazelw run //trainer:gem`).

    from gem_trainer import presets_tiny, train
    summary = train(presets_tiny(steps=100))   # dict: loss, per-task NE/AUC, tokens/s, MFU, ...
"""
from collections.abc import Callable

from gem_trainer.config import PRESETS, TrainConfig
from gem_trainer.config import h200 as presets_h200
from gem_trainer.config import multi as presets_multi
from gem_trainer.config import tiny as presets_tiny


def train(cfg: TrainConfig, *, deterministic: bool | None = None,
          step_hook: Callable[[int], None] | None = None) -> dict[str, object]:
    """Runs one training job (see gem_trainer._loop.train); `deterministic`: torch's
    deterministic algorithms (None: on for CPU, off for CUDA, as `--deterministic`);
    `step_hook(n)` is called after the n-th completed step (e.g. a profiler's `step`)."""
    from gem_trainer._loop import train as _train

    return _train(cfg, deterministic=deterministic, step_hook=step_hook)


__version__ = "0.2.30"
__all__ = ["PRESETS", "TrainConfig", "presets_h200", "presets_multi", "presets_tiny", "train", "__version__"]
