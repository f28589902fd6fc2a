"""Sharded Parquet storage of GEM-like samples: writer and streaming reader.

Schema (one row per sample; the README has the table): list<int64> `event_ids`,
list<int32> `event_types`, list<int64> `timestamps`, int32 `seq_len` (= the lists' length,
stored so the loader can read costs without the sequences), list<int64> `sparse.<name>` per
sparse feature, fixed_size_list<float32>[num_dense] `dense`, int32 `domain`,
fixed_size_list<float32>[num_tasks] `labels` and, optionally, `probs`. File metadata key
`gem_data.schema` holds JSON {version, sparse_keys, num_dense, tasks}.

The reader turns each row group into flat numpy buffers (offsets + values of the list
columns), no per-row Python. Page checksums are written and verified, so a flipped byte
in a data page is an error rather than silently different data. Files are written to a
temporary name and renamed into place; an existing file is never overwritten.
"""
from __future__ import annotations

import json
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # synthetic data and the loader work without pyarrow
    pa = pq = None

from gem_data._batch import Batch
from gem_data._checks import BOUNDS_CHECK_MODES, BoundsCheck, DataError, check_values
from gem_data._config import DataConfig
from gem_data._host import HostBatch, offsets_of

SCHEMA_VERSION = 1
_META_KEY = b"gem_data.schema"


def _need_pyarrow() -> None:
    if pa is None:
        raise ImportError("gem_data's Parquet support needs pyarrow>=15 (pip install pyarrow)")


def _sparse_col(name: str) -> str:
    return f"sparse.{name}"


def arrow_schema(sparse_keys: Sequence[str], num_dense: int, tasks: Sequence[str], with_probs: bool) -> pa.Schema:
    """The Arrow schema of a shard (without the metadata)."""
    fields = [
        pa.field("event_ids", pa.list_(pa.int64()), nullable=False),
        pa.field("event_types", pa.list_(pa.int32()), nullable=False),
        pa.field("timestamps", pa.list_(pa.int64()), nullable=False),
        pa.field("seq_len", pa.int32(), nullable=False),
    ]
    fields += [pa.field(_sparse_col(k), pa.list_(pa.int64()), nullable=False) for k in sparse_keys]
    fields += [
        pa.field("dense", pa.list_(pa.float32(), num_dense), nullable=False),
        pa.field("domain", pa.int32(), nullable=False),
        pa.field("labels", pa.list_(pa.float32(), len(tasks)), nullable=False),
    ]
    if with_probs:
        fields.append(pa.field("probs", pa.list_(pa.float32(), len(tasks)), nullable=False))
    return pa.schema(fields)


def _list(values: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    offs = offsets_of(lengths)
    if offs[-1] >= 2**31:
        raise ValueError(f"a row group holds {offs[-1]} list values, more than int32 offsets allow: lower rows_per_group")
    return pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), pa.array(values, type=typ))


def _fixed(x: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x, np.float32).reshape(-1)), x.shape[1])


def _table(h: HostBatch, tasks: Sequence[str], with_probs: bool) -> pa.Table:
    cols: list[pa.Array] = [
        _list(h.event_ids, h.lengths, pa.int64()),
        _list(h.event_types.astype(np.int32), h.lengths, pa.int32()),
        _list(h.timestamps, h.lengths, pa.int64()),
        pa.array(h.lengths.astype(np.int32)),
    ]
    cols += [_list(h.sparse_values[k], h.sparse_lengths[k], pa.int64()) for k in range(len(h.keys))]
    cols += [_fixed(h.dense), pa.array(h.domain.astype(np.int32)), _fixed(h.labels)]
    if with_probs:
        assert h.probs is not None
        cols.append(_fixed(h.probs))
    return pa.Table.from_arrays(cols, schema=arrow_schema(h.keys, h.dense.shape[1], tasks, with_probs))


def _host_of(b: Batch | HostBatch) -> HostBatch:
    if isinstance(b, HostBatch):
        return b
    sp = b.sparse
    keys = tuple(sp.keys())
    B = b.num_samples
    lengths = sp.lengths().cpu().numpy().reshape(len(keys), B) if keys else np.zeros((0, B), np.int64)
    vals = sp.values().cpu().numpy()
    cuts = np.cumsum(lengths.sum(1))[:-1]
    return HostBatch(keys, b.seq_lengths().cpu().numpy(), b.event_ids.cpu().numpy(), b.event_types.cpu().numpy(),
                     b.timestamps.cpu().numpy(), lengths, list(np.split(vals, cuts)) if keys else [],
                     b.dense.cpu().numpy(), b.domain.cpu().numpy(), b.labels.cpu().numpy(),
                     None if b.probs is None else b.probs.cpu().numpy())


def write_parquet(batches: Iterable[Batch | HostBatch], out_dir: str | os.PathLike[str], *,
                  tasks: Sequence[str], samples_per_shard: int = 4096, rows_per_group: int = 64,
                  prefix: str = "part", compression: str = "snappy") -> list[Path]:
    """Writes batches as Parquet shards `out_dir/{prefix}-{i:05d}.parquet`.

    Each shard is written under a temporary name and renamed when complete; a shard name
    that already exists raises FileExistsError (nothing is overwritten).

    Args:
        batches: Batches (CPU or not) or HostBatches, all with the same features.
        out_dir: created if missing.
        tasks: task names (stored in the metadata; len must equal labels' width).
        samples_per_shard: rows per file (the last file may have fewer).
        rows_per_group: rows per Parquet row group = the unit the loader reads and balances.
        prefix: file name prefix.
        compression: Parquet codec ("snappy", "zstd", "none", ...).

    Returns:
        The paths written, in order.
    """
    _need_pyarrow()
    if samples_per_shard < 1 or rows_per_group < 1:
        raise ValueError(f"{samples_per_shard=} and {rows_per_group=} must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    pending: list[HostBatch] = []
    n_pending = 0

    def flush(h: HostBatch) -> None:
        path = out / f"{prefix}-{len(written):05d}.parquet"
        if path.exists():
            raise FileExistsError(f"{path} exists; write_parquet never overwrites (use a new out_dir or prefix)")
        with_probs = h.probs is not None
        table = _table(h, tasks, with_probs)
        meta = {"version": SCHEMA_VERSION, "sparse_keys": list(h.keys), "num_dense": int(h.dense.shape[1]),
                "tasks": list(tasks)}
        table = table.replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
        tmp = out / f".{path.name}.{uuid.uuid4().hex}.tmp"
        try:
            pq.write_table(table, tmp, row_group_size=rows_per_group, compression=compression,
                           write_page_checksum=True, write_statistics=False)
            try:
                os.link(tmp, path)  # atomic and fails if `path` appeared meanwhile (no overwrite)
            except FileExistsError:
                raise FileExistsError(f"{path} appeared while writing; write_parquet never overwrites") from None
            except OSError:  # a file system without hard links: rename (atomic, checked just before)
                if path.exists():
                    raise FileExistsError(f"{path} exists; write_parquet never overwrites") from None
                os.rename(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(path)

    for b in batches:
        h = _host_of(b)
        if h.labels.shape[1] != len(tasks):
            raise ValueError(f"labels have {h.labels.shape[1]} columns but {len(tasks)=}")
        pending.append(h)
        n_pending += h.num_samples
        while n_pending >= samples_per_shard:
            allh = HostBatch.concat(pending)
            flush(allh.take(np.arange(samples_per_shard)))
            rest = allh.take(np.arange(samples_per_shard, allh.num_samples))
            pending, n_pending = ([rest], rest.num_samples) if rest.num_samples else ([], 0)
    if n_pending:
        flush(HostBatch.concat(pending))
    return written


def _flat_list(arr: pa.Array, path: str, column: str, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) numpy buffers of a list column, no per-row Python."""
    if arr.null_count or arr.values.null_count:
        raise DataError(path, column, "has nulls")
    offs = arr.offsets.to_numpy()
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return values.astype(dtype, copy=False), np.diff(offs).astype(np.int64)


def _fixed_np(arr: pa.Array, path: str, column: str, width: int) -> np.ndarray:
    if arr.null_count or arr.values.null_count:
        raise DataError(path, column, "has nulls")
    out: np.ndarray = arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
    return out


class ParquetSource:
    """Parquet shards read as units = row groups, in (sorted file, row group) order.

    Args:
        paths: a directory (all `*.parquet` inside, sorted) or a list of files.
        on_error: "raise" (default): a bad file or row group raises DataError naming the file,
            the column and the rule. "skip": a bad shard (unreadable footer, corrupt or
            incomplete metadata, wrong schema, not what `expect` asks for) or a bad row group
            (checksum, nulls, a value breaking a rule) is skipped with a warning and counted
            in `skipped` (never silently). A source left with no row group raises either way.
        expect: the DataConfig the model was built from. Every file's dense width, task list
            and sparse feature names must equal it (checked when opening, so a mismatch fails
            at start-up, naming both), and ids are checked against its vocabularies.
        bounds_check: with `expect`, what an id >= its table size does, after fbgemm's
            BoundsCheckMode: "fatal" (default) raises DataError naming the feature and file;
            "warn" replaces it by 0, counts it in `bounds.replaced` and warns once per
            (file, feature).

    The expected columns are those of `expect`, else of the first readable file; every
    other file must match them column by column. Values are checked per row group (ids >= 0,
    timestamps non-decreasing within a sequence, labels 0/1, probs in [0, 1], finite dense).

    Attributes:
        num_blocks: number of row groups (units).
        skipped: list of (path, reason) of what was skipped.
        bounds: the id bounds check (None without `expect`).
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 on_error: str = "raise", expect: DataConfig | None = None, bounds_check: str = "fatal") -> None:
        _need_pyarrow()
        if on_error not in ("raise", "skip"):
            raise ValueError(f"{on_error=} must be 'raise' or 'skip'")
        if expect is not None and not isinstance(expect, DataConfig):
            raise TypeError(f"expect must be a gem_data.DataConfig or None, got {type(expect).__name__}")
        if isinstance(paths, (str, os.PathLike)):
            p = Path(paths)
            if not p.is_dir():
                raise ValueError(f"paths={str(p)!r} is not a directory (pass a directory or a list of files)")
            files = sorted(str(f) for f in p.glob("*.parquet"))
        else:
            files = [str(f) for f in paths]
        if not files:
            raise ValueError(f"no Parquet files in {paths!r}")
        if bounds_check not in BOUNDS_CHECK_MODES:
            raise ValueError(f"{bounds_check=} must be one of {BOUNDS_CHECK_MODES}")
        self.on_error = on_error
        self.expect = expect
        self.bounds: BoundsCheck | None = None
        if expect is not None:
            vocab = {"event_ids": expect.event_vocab, "event_types": expect.num_event_types,
                     "domain": expect.num_domains}
            vocab.update({_sparse_col(n): v for n, v in expect.sparse_features})
            self.bounds = BoundsCheck(vocab, bounds_check)
        elif bounds_check != "fatal":
            raise ValueError(f"{bounds_check=} needs expect=DataConfig (the table sizes to check ids against)")
        self.skipped: list[tuple[str, str]] = []
        self.files: list[str] = []
        self._units: list[tuple[int, int]] = []
        self.schema: pa.Schema | None = None
        self.meta: dict[str, Any] = {}
        for f in files:
            try:
                pf = self._open(f)
            except DataError as e:
                self._bad(e)
                continue
            fi = len(self.files)
            self.files.append(f)
            self._units += [(fi, g) for g in range(pf.metadata.num_row_groups)]
        if not self._units:
            why = f"; skipped: {self.skipped[0][1]}" + (f" (+{len(self.skipped) - 1} more)" if len(self.skipped) > 1 else "")
            raise ValueError(f"no row groups to read in {len(files)} file(s) {files[:3]}"
                             + (why if self.skipped else ""))
        self._lengths: dict[int, np.ndarray] = {}
        self._local = threading.local()

    def _file(self, fi: int) -> pq.ParquetFile:
        # one ParquetFile per thread: the loader's workers read concurrently
        files: dict[int, pq.ParquetFile] | None = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = {}
        pf = files.get(fi)
        if pf is None:
            pf = files[fi] = pq.ParquetFile(self.files[fi], page_checksum_verification=True)
        return pf

    def _bad(self, e: DataError) -> None:
        if self.on_error == "raise":
            raise e
        self.skipped.append((e.path, str(e)))
        warnings.warn(f"gem_data: skipping bad data ({len(self.skipped)} skipped so far): {e}", stacklevel=3)

    @staticmethod
    def _meta_of(f: str, schema: pa.Schema) -> dict[str, Any]:
        """The file's gem_data.schema metadata, parsed and checked field by field."""
        key = _META_KEY.decode()
        raw = (schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise DataError(f, None, f"no {key} metadata: not written by gem_data.write_parquet")
        try:
            meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise DataError(f, None, f"{key} metadata is not valid JSON ({e}): corrupt file metadata") from e
        if not isinstance(meta, dict):
            raise DataError(f, None, f"{key} metadata must be a JSON object, got {type(meta).__name__}")
        if meta.get("version") != SCHEMA_VERSION:
            raise DataError(f, None, f"{key} metadata: schema version {meta.get('version')!r} != {SCHEMA_VERSION}")
        rules: dict[str, tuple[Callable[[Any], bool], str]] = {
            "sparse_keys": (lambda v: isinstance(v, list) and all(isinstance(k, str) and k for k in v)
                            and len(set(v)) == len(v), "a list of unique non-empty names"),
            "num_dense": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an int >= 0"),
            "tasks": (lambda v: isinstance(v, list) and bool(v) and all(isinstance(t, str) for t in v)
                      and len(set(v)) == len(v), "a non-empty list of unique names"),
        }
        for name, (ok, rule) in rules.items():
            if name not in meta:
                raise DataError(f, None, f"{key} metadata has no {name!r} (needs version, sparse_keys, num_dense, "
                                         f"tasks): incomplete file metadata")
            if not ok(meta[name]):
                raise DataError(f, None, f"{key} metadata: {name}={meta[name]!r} must be {rule}")
        return meta

    def _check_expect(self, f: str, meta: dict[str, Any]) -> None:
        exp = self.expect
        assert exp is not None
        if meta["num_dense"] != exp.num_dense:
            raise DataError(f, "dense", f"dense width {meta['num_dense']} in the data != num_dense={exp.num_dense} "
                                        f"the model was built for")
        if tuple(meta["tasks"]) != exp.tasks:
            raise DataError(f, "labels", f"tasks {tuple(meta['tasks'])} in the data != tasks={exp.tasks} "
                                         f"the model was built for (same names, same order)")
        if set(meta["sparse_keys"]) != set(exp.sparse_names):
            raise DataError(f, None, f"sparse features {tuple(meta['sparse_keys'])} in the data != "
                                     f"{exp.sparse_names} the model was built for")

    def _open(self, f: str) -> pq.ParquetFile:
        try:
            pf = pq.ParquetFile(f, page_checksum_verification=True)
            schema = pf.schema_arrow
        except (pa.ArrowException, OSError) as e:
            raise DataError(f, None, f"unreadable Parquet footer/metadata (corrupt or truncated): {e}") from e
        meta = self._meta_of(f, schema)
        if self.expect is not None:
            self._check_expect(f, meta)
        expected, first = self.schema, self.meta
        if expected is None:  # this file sets the columns every other file must have
            if self.expect is not None:  # the model's key order
                meta = {**meta, "sparse_keys": list(self.expect.sparse_names)}
            expected = arrow_schema(meta["sparse_keys"], meta["num_dense"], meta["tasks"], "probs" in schema.names)
            first = meta
        elif meta["tasks"] != first["tasks"]:
            raise DataError(f, "labels", f"tasks {meta['tasks']} != {first['tasks']} of {self.files[0]} "
                                         f"(all files must have the same tasks)")
        for field in expected:
            if field.name not in schema.names:
                raise DataError(f, field.name, "missing")
            got = schema.field(field.name).type
            if got != field.type:
                raise DataError(f, field.name, f"type {got} != expected {field.type}")
        extra = set(schema.names) - set(expected.names)
        if extra:
            raise DataError(f, sorted(extra)[0], "unexpected column (schema mismatch)")
        self.schema, self.meta = expected, first
        return pf

    @property
    def num_blocks(self) -> int:
        return len(self._units)

    def __len__(self) -> int:
        return len(self._units)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.meta.get("sparse_keys", ()))

    def lengths(self, u: int) -> np.ndarray:
        """[rows] int64 sequence lengths of unit u (reads the small `seq_len` column only, cached)."""
        got = self._lengths.get(u)
        if got is None:
            fi, g = self._units[u]
            try:
                col = self._file(fi).read_row_group(g, columns=["seq_len"], use_threads=False).column(0)
                got = col.to_numpy().astype(np.int64)
            except (pa.ArrowException, OSError) as e:
                err = DataError(self.files[fi], "seq_len", f"row group {g}: {e}")
                self._bad(err)
                got = np.zeros(0, np.int64)
            self._lengths[u] = got
        return got

    def read(self, u: int) -> HostBatch | None:
        """Unit u as numpy buffers; None if it is bad and on_error="skip" (then counted in `skipped`)."""
        fi, g = self._units[u]
        try:
            return self._read(fi, g)
        except DataError as e:
            self._bad(e)
            return None

    def _read(self, fi: int, g: int) -> HostBatch:
        path, pf = self.files[fi], self._file(fi)
        assert self.schema is not None
        try:
            t = pf.read_row_group(g, columns=self.schema.names, use_threads=False)
        except (pa.ArrowException, OSError) as e:
            for name in self.schema.names:  # find the column that fails
                try:
                    pf.read_row_group(g, columns=[name], use_threads=False)
                except (pa.ArrowException, OSError) as e2:
                    raise DataError(path, name, f"row group {g}: {e2}") from e2
            raise DataError(path, None, f"row group {g}: {e}") from e

        def col(name: str) -> pa.Array:
            return t.column(name).combine_chunks()

        ids, lengths = _flat_list(col("event_ids"), path, "event_ids", np.int64)
        for name, arr_dtype in (("event_types", np.int64), ("timestamps", np.int64)):
            v, ln = _flat_list(col(name), path, name, arr_dtype)
            if not np.array_equal(ln, lengths):
                raise DataError(path, name, f"row group {g}: list lengths differ from event_ids'")
            if name == "event_types":
                types = v
            else:
                ts = v
        seq_len = col("seq_len").to_numpy().astype(np.int64)
        if not np.array_equal(seq_len, lengths):
            raise DataError(path, "seq_len", f"row group {g}: differs from the length of event_ids")
        keys = self.keys
        sl = np.empty((len(keys), len(lengths)), np.int64)
        sv: list[np.ndarray] = []
        for k, key in enumerate(keys):
            v, sl[k] = _flat_list(col(_sparse_col(key)), path, _sparse_col(key), np.int64)
            sv.append(v)
        nt = len(self.meta["tasks"])
        dense = _fixed_np(col("dense"), path, "dense", int(self.meta["num_dense"]))
        labels = _fixed_np(col("labels"), path, "labels", nt)
        probs = _fixed_np(col("probs"), path, "probs", nt) if "probs" in self.schema.names else None
        domain = col("domain").to_numpy().astype(np.int64)
        h = HostBatch(keys, lengths, ids, types, ts, sl, sv, dense, domain, labels, probs)
        check_values(h, path, g)
        return h if self.bounds is None else self.bounds.apply(h, path, g)

    def split(self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1) -> list[str]:
        """The shard files of (rank, worker): files[rank * num_workers + worker :: world_size * num_workers]."""
        if not 0 <= rank < world_size or not 0 <= worker < num_workers:
            raise ValueError(f"need 0 <= {rank=} < {world_size=} and 0 <= {worker=} < {num_workers=}")
        return self.files[rank * num_workers + worker::world_size * num_workers]

    def stream(self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1) -> Iterator[HostBatch]:
        """Streams the row groups of this (rank, worker)'s shards (see `split`), in order."""
        mine = set(self.split(rank, world_size, worker, num_workers))
        for u, (fi, _) in enumerate(self._units):
            if self.files[fi] in mine:
                h = self.read(u)
                if h is not None:
                    yield h
