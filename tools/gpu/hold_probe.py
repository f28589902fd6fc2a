"""A probe for the forty-seventh session's GPU call: the trainer with gem_parallel's background
worker held for HOLD_S seconds before its first job (argv: HOLD_S, then the trainer's
arguments), to see what the warm start's first step costs without the loads beside it.

    python3 tools/gpu/hold_probe.py 4 --preset h200 --steps 60 --eval-batches 0 --no-progress
"""
from __future__ import annotations

import sys
import time

import gem_parallel._aot as aot_mod
from gem_trainer.__main__ import main

hold = float(sys.argv.pop(1))
work = aot_mod.AotBlocks._work
waited: list[bool] = []  # (from gem-parallel 0.3.14 a new worker starts with each burst of jobs)


def held(self: aot_mod.AotBlocks) -> None:
    if not waited:
        waited.append(True)
        time.sleep(hold)
    work(self)


aot_mod.AotBlocks._work = held  # type: ignore[method-assign]
sys.exit(main())
