"""BlockWindow: blocks [start, start + n) of a block source, as a finite source of its own."""
from __future__ import annotations

from typing import Any


class BlockWindow:
    """A finite view of `source` (SyntheticSource, ParquetSource, ...): block b is `start + b`.

    Splits one endless synthetic stream into disjoint sets (teacher training, student
    training, held-out evaluation) drawn from the same planted function; usable by gem_data's
    `JaggedLoader` and by `score_to_parquet`.

    Args:
        source: anything with `lengths(b)` and `read(b)`.
        start: first block of the window (>= 0).
        num_blocks: blocks in the window (>= 1).
    """

    def __init__(self, source: Any, start: int, num_blocks: int) -> None:
        if start < 0 or num_blocks < 1:
            raise ValueError(f"need start >= 0 and num_blocks >= 1, got {start=} {num_blocks=}")
        n = getattr(source, "num_blocks", None)
        if n is not None and start + num_blocks > n:
            raise ValueError(f"window [{start}, {start + num_blocks}) exceeds the source's {n} blocks")
        self.source, self.start, self.num_blocks = source, start, num_blocks

    def __len__(self) -> int:
        return self.num_blocks

    def _check(self, b: int) -> None:
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} out of range [0, {self.num_blocks})")

    def lengths(self, b: int) -> Any:
        self._check(b)
        return self.source.lengths(self.start + b)

    def read(self, b: int) -> Any:
        self._check(b)
        return self.source.read(self.start + b)
