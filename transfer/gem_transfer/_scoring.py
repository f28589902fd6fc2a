"""Teacher scoring at scale: per-task logits + pooled representation as Parquet columns.

The scores are written as *score shards* aligned row for row with the data source, not as
extra columns inside the data files: gem_data's `ParquetSource` refuses unknown columns,
so the data stay readable by the loader, and the score shards join them by
(`block`, `row`) — the source's block (synthetic block or Parquet row group) and the row
inside it.

Score shard `scores-{i:06d}.parquet` holds blocks `blocks[i*K:(i+1)*K]` (K =
`blocks_per_shard`) and columns:

    block   int64                                 source block id
    row     int32                                 row within the block
    logits  fixed_size_list<float32>[num_tasks]   teacher logits
    repr    fixed_size_list<float32>[R]           teacher pooled representation
    labels  fixed_size_list<float32>[num_tasks]   the data's labels (for evaluation)

plus file metadata `gem_transfer.scores` = JSON {version, tasks, repr_dim, blocks_per_shard,
num_shards, blocks_digest}.

Resumable after `kill -9`: a shard is written to a temporary name, fsync-ed and then
hard-linked to its final name (atomic, never overwrites), so a shard is visible only when
complete. A restarted run skips the shards that exist (after checking their footer and row
count) and removes its own stale temporaries. Sharded: rank r of W writes the shards
i ≡ r (mod W); the shard contents depend only on i, so a resumed run may use another W.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from gem_transfer._teacher import representation_dim, teacher_outputs

VERSION = 1
_META = b"gem_transfer.scores"
_PREFIX = "scores-"


def _digest(blocks: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(blocks, np.int64).tobytes()).hexdigest()[:16]


def _shard_path(out: Path, i: int) -> Path:
    return out / f"{_PREFIX}{i:06d}.parquet"


def _fixed(x: np.ndarray) -> pa.Array:
    x = np.ascontiguousarray(x, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


class _Progress:
    """tqdm on a terminal, else a line on `stream` every ~10 % of the work."""

    def __init__(self, total: int, enabled: bool, stream: Any) -> None:
        self.total, self.done, self.stream, self.bar = total, 0, stream, None
        self.enabled, self.next_line = enabled, 0.0
        if enabled and getattr(stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="score", unit="shard", file=stream, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, samples: int, seconds: float) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and self.done / max(self.total, 1) >= self.next_line:
            rate = samples / seconds if seconds > 0 else 0.0
            print(f"score: {self.done}/{self.total} shards, {samples:,} samples, {rate:,.0f} samples/s",
                  file=self.stream, flush=True)
            self.next_line = self.done / max(self.total, 1) + 0.1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def score_to_parquet(model: nn.Module, source: Any, out_dir: str | os.PathLike[str], *,
                     blocks: Sequence[int] | None = None, blocks_per_shard: int = 16,
                     rank: int = 0, world_size: int = 1, device: torch.device | str = "cpu",
                     tasks: Sequence[str] | None = None, progress: bool = True,
                     log: Any = None) -> dict[str, Any]:
    """Scores `blocks` of `source` with the teacher and writes score shards to `out_dir`.

    Streams: one shard of blocks is in memory at a time (the next shard's blocks are read
    in a background thread while the teacher runs). Resumable and shardable, see the module
    docstring.

    Args:
        model: the teacher (a GEMModel, on `device`, eval mode is set here).
        source: a block source: `read(b)` -> HostBatch (or None for a skipped bad Parquet row
            group) and `lengths(b)`; a `SyntheticSource`, `ParquetSource` or `BlockWindow`.
        out_dir: created if missing; must hold only score shards of this same job.
        blocks: the block ids to score, in order (default `range(source.num_blocks)`).
        blocks_per_shard: blocks per output file (the unit of resumption).
        rank, world_size: this process writes shards i with i % world_size == rank.
        tasks: task names stored in the metadata (default the model's `cfg.tasks`).
        progress: progress bar (terminal) or periodic lines on `log`.
        log: text stream for progress and the final throughput line (default stderr).

    Returns:
        {"shards", "written", "skipped_existing", "samples", "tokens", "seconds",
         "samples_per_s", "tokens_per_s", "bad_blocks"} for this rank's work.
    """
    if blocks is None:
        if source.num_blocks is None:
            raise ValueError("blocks=None needs a finite source (num_blocks not None); pass blocks=")
        blocks = range(source.num_blocks)
    blocks = [int(b) for b in blocks]
    if not blocks:
        raise ValueError("blocks is empty: nothing to score")
    if blocks_per_shard < 1:
        raise ValueError(f"{blocks_per_shard=} must be >= 1")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got {rank=} {world_size=}")
    stream = log if log is not None else sys.stderr
    task_names = list(tasks if tasks is not None else getattr(model, "cfg").tasks)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    num_shards = (len(blocks) + blocks_per_shard - 1) // blocks_per_shard
    meta = {"version": VERSION, "tasks": task_names, "repr_dim": representation_dim(model),
            "blocks_per_shard": blocks_per_shard, "num_shards": num_shards, "blocks_digest": _digest(blocks)}
    mine = list(range(rank, num_shards, world_size))

    def shard_blocks(i: int) -> list[int]:
        return blocks[i * blocks_per_shard:(i + 1) * blocks_per_shard]

    todo, existing = [], 0
    for i in mine:
        for stale in out.glob(f".{_PREFIX}{i:06d}.parquet.*.tmp"):
            stale.unlink(missing_ok=True)  # a temporary of a killed run: never visible, redo
        path = _shard_path(out, i)
        if path.exists():
            rows = sum(int(source.lengths(b).shape[0]) for b in shard_blocks(i))
            _check_existing(path, meta, rows)
            existing += 1
        else:
            todo.append(i)

    model.eval()
    dev = torch.device(device)
    bar = _Progress(len(todo), progress, stream)
    samples = tokens = 0
    bad: list[int] = []
    t0 = time.perf_counter()

    def read(i: int) -> list[tuple[int, Any]]:
        return [(b, source.read(b)) for b in shard_blocks(i)]

    with cf.ThreadPoolExecutor(1, thread_name_prefix="gem_transfer_read") as pool:
        nxt = pool.submit(read, todo[0]) if todo else None
        for k, i in enumerate(todo):
            assert nxt is not None
            parts = nxt.result()
            nxt = pool.submit(read, todo[k + 1]) if k + 1 < len(todo) else None
            cols: dict[str, list[np.ndarray]] = {"block": [], "row": [], "logits": [], "repr": [], "labels": []}
            for b, h in parts:
                if h is None:
                    bad.append(b)
                    continue
                batch = h.to_batch("native").to(dev, non_blocking=True)
                logits, rep = teacher_outputs(model, batch)
                n = h.num_samples
                cols["block"].append(np.full(n, b, np.int64))
                cols["row"].append(np.arange(n, dtype=np.int32))
                cols["logits"].append(logits.cpu().numpy())
                cols["repr"].append(rep.cpu().numpy())
                cols["labels"].append(np.asarray(h.labels, np.float32))
                samples += n
                tokens += h.num_tokens
            _write_shard(out, i, cols, meta)
            bar.update(samples, time.perf_counter() - t0)
    bar.close()
    dt = time.perf_counter() - t0
    report = {"shards": len(mine), "written": len(todo), "skipped_existing": existing, "samples": samples,
              "tokens": tokens, "seconds": dt, "samples_per_s": samples / dt if dt > 0 else 0.0,
              "tokens_per_s": tokens / dt if dt > 0 else 0.0, "bad_blocks": bad}
    if progress:
        print(f"score: rank {rank}/{world_size}: {len(todo)} shards written, {existing} already there, "
              f"{samples:,} samples in {dt:.1f} s = {report['samples_per_s']:,.0f} samples/s, "
              f"{report['tokens_per_s']:,.0f} tokens/s", file=stream, flush=True)
    return report


def _check_existing(path: Path, meta: dict[str, Any], rows: int) -> None:
    try:
        pf = pq.ParquetFile(path)
        got = json.loads((pf.schema_arrow.metadata or {}).get(_META, b"{}"))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ValueError(f"{path}: existing score shard is unreadable ({e}); delete it to re-score") from e
    for key in ("version", "tasks", "repr_dim", "blocks_per_shard", "num_shards", "blocks_digest"):
        if got.get(key) != meta[key]:
            raise ValueError(f"{path}: existing score shard has {key}={got.get(key)!r}, this job "
                             f"{meta[key]!r}: out_dir belongs to another scoring job")
    if pf.metadata.num_rows != rows:
        raise ValueError(f"{path}: existing score shard has {pf.metadata.num_rows} rows, its blocks have {rows}")


def _write_shard(out: Path, i: int, cols: dict[str, list[np.ndarray]], meta: dict[str, Any]) -> None:
    nt, r = len(meta["tasks"]), int(meta["repr_dim"])

    def cat(name: str, width: int) -> np.ndarray:
        return np.concatenate(cols[name]) if cols[name] else np.zeros((0, width), np.float32)

    table = pa.table({
        "block": pa.array(np.concatenate(cols["block"]) if cols["block"] else np.zeros(0, np.int64)),
        "row": pa.array(np.concatenate(cols["row"]) if cols["row"] else np.zeros(0, np.int32)),
        "logits": _fixed(cat("logits", nt).reshape(-1, nt)),
        "repr": _fixed(cat("repr", r).reshape(-1, r)),
        "labels": _fixed(cat("labels", nt).reshape(-1, nt)),
    }).replace_schema_metadata({_META: json.dumps(meta).encode()})
    path = _shard_path(out, i)
    tmp = out / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, tmp, compression="snappy", write_page_checksum=True)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic; fails if the name exists (never overwrites)
        except FileExistsError:
            raise FileExistsError(f"{path} appeared while scoring: two jobs write the same out_dir") from None
    finally:
        tmp.unlink(missing_ok=True)


def read_scores(out_dir: str | os.PathLike[str], *, blocks: Sequence[int] | None = None,
                rows_per_block: Sequence[int] | None = None) -> dict[str, Any]:
    """All score shards of `out_dir`, concatenated in shard order.

    With `blocks` (and optionally `rows_per_block`, one count per block) the coverage is
    checked: every (block, row) exactly once, nothing else — else ValueError naming the
    first missing or duplicated row.

    Returns:
        {"block" [N] int64, "row" [N] int32, "logits" [N, num_tasks], "repr" [N, R],
         "labels" [N, num_tasks] float32, "tasks": list[str], "meta": dict}.
    """
    out = Path(out_dir)
    files = sorted(out.glob(f"{_PREFIX}*.parquet"))
    if not files:
        raise ValueError(f"out_dir={str(out)!r} has no score shards ({_PREFIX}*.parquet)")
    tables, meta = [], None
    for f in files:
        t = pq.read_table(f)
        m = json.loads((t.schema.metadata or {}).get(_META, b"{}"))
        if meta is None:
            meta = m
        elif m != meta:
            raise ValueError(f"{f}: metadata {m} differs from {files[0]}'s {meta}: shards of two jobs")
        tables.append(t)
    assert meta is not None
    t = pa.concat_tables(tables)

    def fixed(name: str) -> np.ndarray:
        col = t.column(name).combine_chunks()
        width = col.type.list_size
        arr: np.ndarray = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
        return arr

    res: dict[str, Any] = {
        "block": t.column("block").to_numpy(), "row": t.column("row").to_numpy(),
        "logits": fixed("logits"), "repr": fixed("repr"), "labels": fixed("labels"),
        "tasks": list(meta["tasks"]), "meta": meta,
    }
    if blocks is not None:
        _check_coverage(res["block"], res["row"], blocks, rows_per_block)
    return res


def _check_coverage(block: np.ndarray, row: np.ndarray, blocks: Sequence[int],
                    rows_per_block: Sequence[int] | None) -> None:
    want = np.asarray(list(blocks), np.int64)
    key = block.astype(np.int64) * (1 << 32) + row.astype(np.int64)
    uniq, counts = np.unique(key, return_counts=True)
    if (counts > 1).any():
        k = int(uniq[np.argmax(counts > 1)])
        raise ValueError(f"score row (block {k >> 32}, row {k & 0xFFFFFFFF}) appears {counts.max()} times")
    extra = np.setdiff1d(np.unique(block), want)
    if extra.size:
        raise ValueError(f"scores hold block {int(extra[0])}, which is not in `blocks`")
    missing = np.setdiff1d(want, np.unique(block))
    if missing.size:
        raise ValueError(f"block {int(missing[0])} has no scores (missing; {missing.size} blocks in all)")
    if rows_per_block is not None:
        got = np.bincount(np.searchsorted(np.sort(want), block), minlength=want.size)
        need = np.asarray(list(rows_per_block), np.int64)[np.argsort(want)]
        bad = np.flatnonzero(got != need)
        over = row.astype(np.int64) >= need[np.searchsorted(np.sort(want), block)]
        if over.any():
            j = int(np.argmax(over))
            raise ValueError(f"score row (block {int(block[j])}, row {int(row[j])}) is past the block's rows")
        if bad.size:
            b = int(np.sort(want)[bad[0]])
            raise ValueError(f"block {b} has {int(got[bad[0]])} scored rows, expected {int(need[bad[0]])}")
