"""TransferConfig presets: `tiny()` (CPU, a few minutes) and `gem()` (one H200).

Variants: `presets.tiny(teacher_samples=65_536)` or `dataclasses.replace(presets.gem(), seed=1)`.
`SWEEP[preset]`: the student-sample counts the bench's `--sweep` trains (nested subsets of the
preset's student samples), e.g. `presets.gem(student_samples_sweep=presets.SWEEP["gem"])`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from gem_transfer._pipeline import TransferConfig
from gem_transfer._student import StudentConfig

__all__ = ["tiny", "gem", "SWEEP"]

# tiny: around where best/KD crossed 2 in separate runs (384-512, BENCHMARKS.md); gem: the
# preset's 4,096 down to 1/8 of it, in halvings
SWEEP: dict[str, tuple[int, ...]] = {"tiny": (256, 384, 512, 1024, 2048), "gem": (512, 1024, 2048, 4096)}


def tiny(**overrides: Any) -> TransferConfig:
    """CPU: tiny teacher on 65,536 samples, students on 2,048, 4,096 held out (3-5 min on 2 cores)."""
    return dataclasses.replace(TransferConfig(), **overrides)


def gem(**overrides: Any) -> TransferConfig:
    """One H200: the h200 teacher (bf16) on GEM-like histories (cap 8,192), 131,072-token steps,
    for at most 200k samples or 240 s (the bench must fit a 10-minute slot); students on 4,096.
    A sample-count sweep trains 1 seed per method at its N other than 4,096 (`sweep_seeds`; the
    4,096 students keep the bench's 2): the students are time-sliced on the H200, and 2 seeds
    at every N would give each about half the epochs of a run without the sweep.

    Dense lr 1e-4, the trainer's h200 value: the d_model-1024 teacher stalls at AUC ~0.60 at
    1e-3 (H200, 2026-11-30: teacher 0.60 / 0.60 / 0.60, below the label-only students;
    model/BENCHMARKS.md has the same finding for the trainer)."""
    base = TransferConfig(preset="gem", teacher_samples=200_000, teacher_seconds=240.0, teacher_tokens=131_072,
                          teacher_lr=1e-4, student_samples=4096, sweep_seeds=1, eval_samples=4096, block_size=16,
                          blocks_per_shard=16, student=StudentConfig(emb_dim=32, hidden=(128, 64)))
    return dataclasses.replace(base, **overrides)
