"""Value checks of a decoded row group, and the id bounds check against a model's vocabularies.

Why here: a bad value that reaches the model fails far from its cause (`torch.embedding`'s
IndexError, a NaN loss many steps later) or not at all (a label of 2 trains silently). The
reader already holds each row group as flat numpy buffers, so each rule is one vectorised
pass over a buffer (min/max, a diff) — a few ns per token, no per-row Python.

Rules (the README's fault table lists them with their tests):
- ids (`event_ids`, `event_types`, `sparse.<name>`, `domain`) are >= 0;
- `timestamps` are non-decreasing within each sequence;
- `labels` are 0 or 1; `probs` are in [0, 1]; `dense` is finite;
- with a vocabulary (`ParquetSource(..., expect=DataConfig)`), ids are < the table size, under
  a bounds-check mode like fbgemm's `BoundsCheckMode`: "fatal" raises, "warn" replaces each
  out-of-range id by 0 (what fbgemm's WARNING mode does), counts it and warns once per
  (file, feature).
"""
from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping

import numpy as np

from gem_data._host import HostBatch, offsets_of

BOUNDS_CHECK_MODES = ("fatal", "warn")


class DataError(ValueError):
    """A bad data file: names the file and, when known, the column."""

    def __init__(self, path: str | os.PathLike[str], column: str | None, reason: str) -> None:
        self.path, self.column, self.reason = str(path), column, reason
        where = f"column {column!r}" if column else "file"
        super().__init__(f"{self.path}: {where}: {reason}")


def _row_of(lengths: np.ndarray, pos: int) -> int:
    """The row (sample) holding flat position `pos` of a jagged column."""
    return int(np.searchsorted(offsets_of(lengths), pos, side="right") - 1)


def _check_ids(v: np.ndarray, path: str, column: str, where: str) -> None:
    if v.size and v.min() < 0:
        i = int(np.argmax(v < 0))
        raise DataError(path, column, f"{where}: id {int(v[i])} at value {i} is negative (ids must be >= 0)")


def check_values(h: HostBatch, path: str, group: int) -> None:
    """Raises DataError on the first rule `h` breaks (see the module docstring)."""
    where = f"row group {group}"
    _check_ids(h.event_ids, path, "event_ids", where)
    _check_ids(h.event_types, path, "event_types", where)
    for key, v in zip(h.keys, h.sparse_values):
        _check_ids(v, path, f"sparse.{key}", where)
    _check_ids(h.domain, path, "domain", where)
    ts = h.timestamps
    if ts.size > 1:
        down = np.diff(ts) < 0
        starts = offsets_of(h.lengths)[1:-1]
        down[starts[(starts > 0) & (starts < ts.size)] - 1] = False  # a new sequence may start lower
        if down.any():
            i = int(np.argmax(down))
            raise DataError(path, "timestamps",
                            f"{where}: row {_row_of(h.lengths, i + 1)} goes from {int(ts[i])} to {int(ts[i + 1])} "
                            f"(timestamps must be non-decreasing within a sequence)")
    bad = (h.labels != 0) & (h.labels != 1)
    if bad.any():
        r, t = (int(x) for x in np.argwhere(bad)[0])
        raise DataError(path, "labels", f"{where}: row {r}, task {t}: label {float(h.labels[r, t])!r} "
                                        f"(labels must be 0 or 1)")
    if h.probs is not None:
        bad = ~((h.probs >= 0) & (h.probs <= 1))
        if bad.any():
            r, t = (int(x) for x in np.argwhere(bad)[0])
            raise DataError(path, "probs", f"{where}: row {r}, task {t}: {float(h.probs[r, t])!r} "
                                           f"(probs must be in [0, 1])")
    if h.dense.size and not np.isfinite(h.dense).all():
        r, c = (int(x) for x in np.argwhere(~np.isfinite(h.dense))[0])
        raise DataError(path, "dense", f"{where}: row {r}, column {c}: {float(h.dense[r, c])!r} "
                                       f"(dense features must be finite)")


class BoundsCheck:
    """Checks ids against table sizes {column: vocab}, in one of BOUNDS_CHECK_MODES.

    Attributes:
        replaced: {column: ids replaced by 0} under "warn" (thread-safe counts).
    """

    def __init__(self, vocab: Mapping[str, int], mode: str) -> None:
        if mode not in BOUNDS_CHECK_MODES:
            raise ValueError(f"bounds_check={mode!r} must be one of {BOUNDS_CHECK_MODES}")
        self.vocab, self.mode = dict(vocab), mode
        self.replaced: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _one(self, v: np.ndarray, path: str, column: str, where: str) -> np.ndarray:
        n = self.vocab[column]
        if not v.size or v.max() < n:
            return v
        bad = v >= n
        if self.mode == "fatal":
            i = int(np.argmax(bad))
            raise DataError(path, column, f"{where}: id {int(v[i])} at value {i} is outside the table of {n} rows "
                                          f"(ids must be < {n}; bounds_check='warn' replaces them by 0)")
        count = int(bad.sum())
        v = np.where(bad, 0, v)
        with self._lock:
            self.replaced[column] = self.replaced.get(column, 0) + count
            first = (path, column) not in self._warned
            self._warned.add((path, column))
        if first:
            warnings.warn(f"gem_data: {path}: column {column!r}: {where}: {count} ids >= the table size {n} "
                          f"replaced by 0 (bounds_check='warn'; later ones in this file are counted in "
                          f"source.bounds.replaced, not warned)", stacklevel=2)
        return v

    def apply(self, h: HostBatch, path: str, group: int) -> HostBatch:
        """`h` with every id column checked (and, under "warn", out-of-range ids replaced by 0)."""
        where = f"row group {group}"
        h.event_ids = self._one(h.event_ids, path, "event_ids", where)
        h.event_types = self._one(h.event_types, path, "event_types", where)
        h.sparse_values = [self._one(v, path, f"sparse.{k}", where) for k, v in zip(h.keys, h.sparse_values)]
        h.domain = self._one(h.domain, path, "domain", where)
        return h
