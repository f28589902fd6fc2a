"""Python's garbage collector inside the training loop: its pauses, booked per step, and a
freeze of the heap the warm-up leaves.

A compiled model leaves a large heap of long-lived Python objects: dynamo's guards and
graphs, inductor's and Triton's kernels, the modules. A full (generation-2) collection of
CPython 3.12 walks all of them, with the GIL held, whenever the objects that survived younger
collections reach a quarter of that heap. In a steady loop that happens at a few fixed steps,
because the loop's allocations repeat. On the CPU tiny preset one such pass over ~350 k
objects took 0.11-0.14 s.

`GcWatch` books every collection's pause (a `gc.callbacks` hook) so the summary and
`slow_steps` show what the collector cost. With `freeze=True` it runs one full collection at
the end of the warm-up and then `gc.freeze()`: the surviving objects move to the permanent
generation, which later collections skip. The collector stays on for what the steady steps
allocate, so cycles made there are still reclaimed. `stop()` unfreezes what it froze (not a
freeze the caller made before the run) and removes the hook.
"""
from __future__ import annotations

import gc
import time
from typing import Any


class GcWatch:
    """Books the collector's pauses; optionally freezes the warm-up's heap (see the module)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]  # collections per generation
        self.pause_s = 0.0  # all pauses so far (read at step boundaries for per-step figures)
        self.frozen = 0  # objects moved to the permanent generation by freeze()
        self.freeze_s = 0.0  # the full collection and freeze at the end of the warm-up
        self._t = 0.0
        self._hooked = False
        self._froze = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        self.count[int(info["generation"])] += 1
        self.pause_s += time.perf_counter() - self._t

    def start(self) -> GcWatch:
        if not self._hooked:
            gc.callbacks.append(self._callback)
            self._hooked = True
        return self

    def freeze(self) -> None:
        """One full collection, then `gc.freeze()` of what survives. Once per run."""
        if self._froze:
            return
        t = time.perf_counter()
        before = gc.get_freeze_count()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count() - before
        self.freeze_s = time.perf_counter() - t
        # Unfreeze at stop() only what this run froze: a caller's earlier freeze stays.
        self._froze = before == 0

    def stop(self) -> None:
        if self._hooked:
            gc.callbacks.remove(self._callback)
            self._hooked = False
        if self._froze:
            gc.unfreeze()
            self._froze = False

    def summary(self, step_gc_s: list[float], warmup: int, start_step: int, freeze: bool) -> dict[str, Any]:
        """The summary's `gc` entry; `step_gc_s`: each step's pauses (Timers.gc_s), the first
        `warmup` of them the warm-up's; `start_step`: the step the loop started from."""
        steady = step_gc_s[warmup:]
        worst = max(range(len(steady)), key=steady.__getitem__) if steady else None
        return {"gc": {
            "freeze": freeze,
            "frozen_objects": self.frozen,
            "freeze_s": self.freeze_s,
            "collections": list(self.count),  # generations 0, 1, 2
            "pause_s": self.pause_s,  # the whole run's, warm-up and freeze included
            "steady_pause_s": sum(steady),  # inside the steady steps' windows
            # the steady step with the longest pauses, and those pauses
            "worst_step": None if worst is None else start_step + warmup + worst + 1,
            "worst_step_s": None if worst is None else steady[worst],
        }}
