"""When the trainer's background loads and compiles of its blocks start (`compile_background`).

By default (`compile_background_after_first_step`) the jobs the first step's block calls queue
wait until that step is booked: loading a kept file is Python work that shares the GIL with the
first eager step, which is host-bound. With the setting off they start at the blocks' first
calls. The compile is a stand-in that records the step count when it starts and fails, and
the failed kind runs eagerly (instead of through torch.compile), so the test compiles nothing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from gem_trainer import presets_tiny


@pytest.mark.parametrize("after_first_step", [True, False])
def test_background_jobs_start_after_the_first_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    after_first_step: bool) -> None:
    import gem_parallel._aot as aot_mod
    from gem_trainer import train

    booked = [0]  # steps booked so far (the step hook runs before the first step releases the jobs)
    started_at: list[int] = []
    holds: list[int] = []

    def stand_in(backend: str, block: nn.Module, *args: Any) -> Any:
        started_at.append(booked[0])
        raise RuntimeError("stand-in compile")

    def eager(self: Any, block: nn.Module) -> Any:
        return lambda b, *args, **kwargs: b.forward(*args, **kwargs)

    real_hold = aot_mod.AotBlocks.hold

    def hold(self: Any) -> None:
        holds.append(booked[0])
        real_hold(self)

    def hook(n: int) -> None:
        booked[0] = n

    monkeypatch.setattr(aot_mod, "_aot_compile_forward", stand_in)
    monkeypatch.setattr(aot_mod.AotBlocks, "_plain", eager)
    monkeypatch.setattr(aot_mod.AotBlocks, "hold", hold)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = presets_tiny(compile=True, compile_aot=str(tmp_path / "aot"), compile_background=True,
                       compile_background_after_first_step=after_first_step, steps=3, batch_size=16,
                       eval_batches=0, progress=False)
    with pytest.warns(RuntimeWarning, match="stand-in compile"):
        s: dict[str, Any] = train(cfg, deterministic=False, step_hook=hook)
    assert s["steps"] == 3 and math.isfinite(s["loss"]), s
    assert s["compile_aot"]["fallbacks"] >= 1 and s["compile_aot"]["eager_calls"] > 0, s
    assert started_at, "no background job ran"
    if after_first_step:
        assert holds == [0] and min(started_at) >= 1, (holds, started_at)
    else:
        assert holds == [] and min(started_at) == 0, (holds, started_at)
