"""The garbage collector inside the loop (gem_trainer._gc): every collection's pause is booked
(per step in `slow_steps`, in total in the summary's `gc`), and with `gc_freeze` (the default)
the warm-up's heap is frozen once the warm-up ends and unfrozen when the run ends."""
from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from gem_trainer import _optim, presets_tiny, train
from gem_trainer._gc import GcWatch
from gem_trainer._metrics import WARMUP_STEPS


class _Node:
    def __init__(self) -> None:
        self.other: Any = self


def _cyclic_garbage(n: int) -> None:
    """n objects that only the collector can free (each refers to itself): held by a list
    until all exist (so no young collection frees them early), then let go."""
    junk = [_Node() for _ in range(n)]
    del junk


@pytest.fixture(autouse=True)
def _no_freeze_left() -> Any:
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_watch_books_a_collection_and_removes_its_hook() -> None:
    hooks = len(gc.callbacks)
    w = GcWatch().start()
    assert len(gc.callbacks) == hooks + 1
    _cyclic_garbage(50_000)
    n2, p0 = w.count[2], w.pause_s  # (building the garbage may have triggered collections)
    t = time.perf_counter()
    assert gc.collect() >= 50_000
    took = time.perf_counter() - t
    assert w.count[2] == n2 + 1 and 0 < w.pause_s - p0 <= took
    w.stop()
    assert len(gc.callbacks) == hooks
    before = list(w.count)
    gc.collect()
    assert w.count == before  # unhooked: nothing more booked


def test_freeze_moves_the_heap_and_stop_undoes_only_its_own() -> None:
    w = GcWatch().start()
    w.freeze()
    # (<= and - 100, not ==: objects freed by refcount leave the frozen generation, and in a
    # shared pytest process another test's thread may free some at any moment)
    assert w.frozen > 1000 and w.frozen - 100 <= gc.get_freeze_count() <= w.frozen and w.freeze_s > 0
    frozen = w.frozen
    w.freeze()  # once per run: the second call freezes nothing more
    assert w.frozen == frozen and gc.get_freeze_count() <= frozen
    w.stop()
    assert gc.get_freeze_count() == 0
    # A freeze the caller made before the run stays after it.
    gc.freeze()
    mine = gc.get_freeze_count()
    w = GcWatch().start()
    _Node()
    w.freeze()
    assert gc.get_freeze_count() >= mine - 100
    w.stop()
    assert gc.get_freeze_count() >= mine - 100 > 0  # (objects freed by refcount leave it)


def _run(monkeypatch: pytest.MonkeyPatch, freeze: bool) -> tuple[dict[str, Any], list[int], float]:
    """A tiny run; in one steady step's optimizer phase a full collection of 400 k cyclic
    objects is forced (timed from outside); the freeze count seen at each step."""
    target = WARMUP_STEPS + 3  # set_step gets the steps done so far: this is step target + 1
    real = _optim.Optimizers.set_step
    seen: list[int] = []
    forced = [0.0]

    def set_step(self: _optim.Optimizers, step: int) -> None:
        seen.append(gc.get_freeze_count())
        if step == target:
            _cyclic_garbage(400_000)
            t = time.perf_counter()
            gc.collect()
            forced[0] = time.perf_counter() - t
        real(self, step)

    monkeypatch.setattr(_optim.Optimizers, "set_step", set_step)
    s = train(presets_tiny(steps=WARMUP_STEPS + 8, batch_size=16, eval_batches=0, progress=False,
                           gc_freeze=freeze))
    return s, seen, forced[0]


@pytest.mark.parametrize("freeze", [True, False])
def test_a_run_freezes_after_warmup_and_books_a_steady_collection(monkeypatch: pytest.MonkeyPatch,
                                                                   freeze: bool) -> None:
    hooks = len(gc.callbacks)
    s, seen, forced = _run(monkeypatch, freeze)
    assert s["steps"] == WARMUP_STEPS + 8, s
    g = s["gc"]
    assert g["freeze"] is freeze
    # set_step(n) runs in step n + 1: the warm-up steps see no freeze, the steady ones do
    assert seen[:WARMUP_STEPS] == [0] * WARMUP_STEPS
    if freeze:
        assert g["frozen_objects"] > 10_000 and g["freeze_s"] > 0, g
        # (objects freed by refcount leave the frozen set)
        assert all(c > g["frozen_objects"] // 2 for c in seen[WARMUP_STEPS:]), seen
    else:
        assert g["frozen_objects"] == 0 and g["freeze_s"] == 0 and set(seen) == {0}
    # the forced collection is booked in the steady window and named in its step
    assert g["collections"][2] >= 1 and g["steady_pause_s"] >= forced > 0, (g, forced)
    assert g["pause_s"] >= g["steady_pause_s"], g
    assert g["worst_step"] == WARMUP_STEPS + 4 and g["worst_step_s"] >= forced, (g, forced)
    # the run leaves neither its hook nor its freeze behind
    assert len(gc.callbacks) == hooks and gc.get_freeze_count() == 0
