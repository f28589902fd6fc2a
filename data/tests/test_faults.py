"""Issue #20's data faults: each is reproduced on fresh random data and must get a DataError
naming file, column and rule (or be skipped and counted under on_error="skip")."""
import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from gem_data import DataError, JaggedLoader, ParquetSource, SyntheticSource, presets, write_parquet
from gem_data._host import HostBatch, offsets_of

CFG = presets.tiny(seq_len_min=2, seq_len_cap=40, seq_len_mean=10.0, seed=int(np.random.default_rng().integers(1 << 30)))


def _blocks(n: int = 4, bs: int = 10) -> list[HostBatch]:
    src = SyntheticSource(CFG, block_size=bs)
    return [src.read(i) for i in range(n)]


def _write(tmp: Path, blocks: list[HostBatch], tasks: tuple[str, ...] = CFG.tasks) -> list[Path]:
    # 2 shards of 20 rows, row groups of 10 (= one block each)
    return write_parquet(blocks, tmp, tasks=tasks, samples_per_shard=20, rows_per_group=10)


def _read_all(src: ParquetSource) -> list[HostBatch | None]:
    return [src.read(u) for u in range(src.num_blocks)]


def _set_meta(path: Path, raw: bytes) -> None:
    t = pq.read_table(path)
    path.unlink()
    pq.write_table(t.replace_schema_metadata({b"gem_data.schema": raw}), path, row_group_size=10)


# ---- file metadata --------------------------------------------------------------------------

@pytest.mark.parametrize("raw, rule", [
    (b'{"version": 1, "sparse_keys": [', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_corrupt_metadata_names_the_file_and_skips(tmp_path: Path, raw: bytes, rule: str) -> None:
    paths = _write(tmp_path, _blocks())
    _set_meta(paths[1], raw)
    with pytest.raises(DataError, match=rf"part-00001.parquet: file: gem_data.schema metadata.*{rule}"):
        ParquetSource(tmp_path)
    with pytest.warns(UserWarning, match="skipping.*part-00001"):
        src = ParquetSource(tmp_path, on_error="skip")
    assert [p for p, _ in src.skipped] == [str(paths[1])] and src.files == [str(paths[0])]
    assert src.num_blocks == 2


@pytest.mark.parametrize("drop", ["tasks", "num_dense", "sparse_keys"])
def test_incomplete_metadata_names_the_key(tmp_path: Path, drop: str) -> None:
    paths = _write(tmp_path, _blocks())
    meta = json.loads(pq.read_schema(paths[0]).metadata[b"gem_data.schema"])
    del meta[drop]
    _set_meta(paths[0], json.dumps(meta).encode())
    with pytest.raises(DataError, match=rf"part-00000.parquet: file: .*has no '{drop}'"):
        ParquetSource(tmp_path)
    with pytest.warns(UserWarning):
        src = ParquetSource(tmp_path, on_error="skip")
    assert len(src.skipped) == 1 and src.files == [str(paths[1])]


def test_wrong_metadata_values_and_task_names(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks())
    meta = json.loads(pq.read_schema(paths[0]).metadata[b"gem_data.schema"])
    _set_meta(paths[0], json.dumps({**meta, "num_dense": -1}).encode())
    with pytest.raises(DataError, match=r"part-00000.parquet: file: .*num_dense=-1 must be an int >= 0"):
        ParquetSource(tmp_path)
    _set_meta(paths[0], json.dumps(meta).encode())
    _set_meta(paths[1], json.dumps({**meta, "tasks": meta["tasks"][::-1]}).encode())  # same width, other order
    with pytest.raises(DataError, match=r"part-00001.parquet: column 'labels': tasks .* of .*part-00000"):
        ParquetSource(tmp_path)


def test_nothing_left_after_skipping_raises(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks())
    for p in paths:
        _set_meta(p, b"{")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no row groups.*skipped: .*not valid JSON"):
        ParquetSource(tmp_path, on_error="skip")


# ---- values -----------------------------------------------------------------------------------

def _corrupt(h: HostBatch, what: str, rng: np.random.Generator) -> tuple[str, str]:
    """Breaks one rule in a random place of h (in place); returns (column, rule regex)."""
    offs = offsets_of(h.lengths)
    row = int(rng.integers(h.num_samples))
    if what == "timestamps":
        s, e = int(offs[row]), int(offs[row + 1])
        h.timestamps = h.timestamps.copy()
        h.timestamps[s:e] = np.sort(h.timestamps[s:e])[::-1] - np.arange(e - s)  # strictly decreasing
        return "timestamps", rf"row {row} goes from .*non-decreasing"
    if what in ("labels", "labels_nan"):
        h.labels = h.labels.copy()
        h.labels[row, int(rng.integers(h.labels.shape[1]))] = np.nan if what == "labels_nan" else rng.choice([2.0, 0.5, -1.0])
        return "labels", rf"row {row}, task .*must be 0 or 1"
    if what == "probs":
        assert h.probs is not None
        h.probs = h.probs.copy()
        h.probs[row, 0] = 1.5
        return "probs", rf"row {row}, task 0: 1.5 \(probs must be in \[0, 1\]\)"
    if what == "dense":
        h.dense = h.dense.copy()
        h.dense[row, int(rng.integers(h.dense.shape[1]))] = rng.choice([np.inf, np.nan])
        return "dense", rf"row {row}, column .*must be finite"
    # negative ids
    arr = _own_column(h, what)
    if not arr.size:
        pytest.skip("no ids drawn")
    i = int(rng.integers(arr.size))
    arr[i] = -int(rng.integers(1, 1000))
    return what, rf"id {arr[i]} at value {i} is negative"


@pytest.mark.parametrize("what", ["timestamps", "labels", "labels_nan", "probs", "dense", "event_ids",
                                  "event_types", "domain", f"sparse.{CFG.sparse_names[0]}"])
def test_bad_values_raise_or_skip_one_row_group(tmp_path: Path, what: str) -> None:
    rng = np.random.default_rng()
    blocks = _blocks()
    victim = int(rng.integers(len(blocks)))
    column, rule = _corrupt(blocks[victim], what, rng)
    paths = _write(tmp_path, blocks)
    src = ParquetSource(tmp_path)
    for u in range(src.num_blocks):
        if u != victim:
            assert src.read(u) is not None
    shard, group = divmod(victim, 2)
    with pytest.raises(DataError, match=rf"part-0000{shard}.parquet: column '{column}': row group {group}: {rule}"):
        src.read(victim)
    skip = ParquetSource(tmp_path, on_error="skip")
    with pytest.warns(UserWarning, match="skipping"):
        got = _read_all(skip)
    assert [g is None for g in got] == [u == victim for u in range(len(blocks))]
    assert len(skip.skipped) == 1 and skip.skipped[0][0] == str(paths[shard])


def test_equal_timestamps_and_a_lower_next_sequence_are_fine(tmp_path: Path) -> None:
    blocks = _blocks(2)
    for h in blocks:  # every sequence restarts at 0 and repeats its values
        h.timestamps = (np.arange(h.num_tokens) - np.repeat(offsets_of(h.lengths)[:-1], h.lengths)) // 2
    _write(tmp_path, blocks)
    src = ParquetSource(tmp_path)
    back = HostBatch.concat([h for h in _read_all(src) if h is not None])
    np.testing.assert_array_equal(back.timestamps, np.concatenate([h.timestamps for h in blocks]))


def test_loader_with_skip_policy_drops_only_the_bad_row_group(tmp_path: Path) -> None:
    blocks = _blocks()
    blocks[2].labels = np.full_like(blocks[2].labels, 3.0)
    _write(tmp_path, blocks)
    with pytest.warns(UserWarning, match="column 'labels'"):
        got = list(JaggedLoader(ParquetSource(tmp_path, on_error="skip"), blocks_per_batch=2, balance=False,
                                sparse_kind="native"))
    assert [b.num_samples for b in got] == [20, 10]
    want = torch.from_numpy(np.concatenate([blocks[i].dense for i in (0, 1, 3)]))
    assert torch.equal(torch.cat([b.dense for b in got]), want)


# ---- ids against the model's vocabularies ------------------------------------------------------

def _own_column(h: HostBatch, name: str) -> np.ndarray:
    """A private, writable copy of id column `name` ("event_ids", ... or "sparse.<key>"),
    installed in `h` so that editing it edits the block and nothing else."""
    if name.startswith("sparse."):
        k = h.keys.index(name[len("sparse."):])
        h.sparse_values = list(h.sparse_values)
        arr: np.ndarray = h.sparse_values[k].copy()
        h.sparse_values[k] = arr
        return arr
    arr = getattr(h, name).copy()
    setattr(h, name, arr)
    return arr


def _out_of_range(blocks: list[HostBatch], rng: np.random.Generator) -> tuple[str, int]:
    """Puts a few ids >= the vocab into a random id column of a random block."""
    names = ["event_ids", "event_types", "domain"] + [f"sparse.{k}" for k in CFG.sparse_names]
    vocab = dict(zip(names, [CFG.event_vocab, CFG.num_event_types, CFG.num_domains, *CFG.sparse_vocabs]))
    col = str(rng.choice(names))
    b = int(rng.integers(len(blocks)))
    h = blocks[b]
    arr = _own_column(h, col)
    assert arr.size, col
    idx = rng.choice(arr.size, size=min(3, arr.size), replace=False)
    arr[idx] = vocab[col] + rng.integers(0, 5, size=idx.size)
    return col, b


def test_ids_outside_the_vocab_fatal(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    blocks = _blocks()
    col, b = _out_of_range(blocks, rng)
    _write(tmp_path, blocks)
    # before: the id reached the model's table as torch.embedding's IndexError
    plain = ParquetSource(tmp_path).read(b)
    assert plain is not None
    vocab = {"event_ids": CFG.event_vocab, "event_types": CFG.num_event_types, "domain": CFG.num_domains,
             **{f"sparse.{n}": v for n, v in CFG.sparse_features}}[col]
    ids = plain.to_batch("native")
    values = ids.sparse.to_dict()[col[7:]].values() if col.startswith("sparse.") else getattr(ids, col)
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(values, torch.zeros(vocab, 2))
    # now: DataError naming the feature, the file and the table size
    src = ParquetSource(tmp_path, expect=CFG)
    with pytest.raises(DataError, match=rf"part-0000{b // 2}.parquet: column '{col}': row group {b % 2}: "
                                        rf"id \d+ at value \d+ is outside the table of {vocab} rows"):
        src.read(b)
    with pytest.warns(UserWarning, match="skipping"):
        got = _read_all(ParquetSource(tmp_path, expect=CFG, on_error="skip"))
    assert [g is None for g in got] == [u == b for u in range(len(blocks))]


def test_ids_outside_the_vocab_warn_replaces_by_zero(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    blocks = _blocks()
    col, b = _out_of_range(blocks, rng)
    _write(tmp_path, blocks)
    src = ParquetSource(tmp_path, expect=CFG, bounds_check="warn")
    with pytest.warns(UserWarning, match=rf"part-0000{b // 2}.parquet: column '{col}'.*replaced by 0"):
        got = _read_all(src)
    want = HostBatch.concat(blocks)
    back = HostBatch.concat([g for g in got if g is not None])
    names = ["event_ids", "event_types", "domain"]
    for name in names:
        a = getattr(want, name)
        ref = np.where(a >= getattr(CFG, {"event_ids": "event_vocab", "event_types": "num_event_types",
                                          "domain": "num_domains"}[name]), 0, a)
        np.testing.assert_array_equal(getattr(back, name), ref, err_msg=name)
    for k, (n, v) in enumerate(CFG.sparse_features):
        np.testing.assert_array_equal(back.sparse_values[k], np.where(want.sparse_values[k] >= v, 0, want.sparse_values[k]))
    total = int(sum((getattr(want, n) >= getattr(CFG, f)).sum() for n, f in
                    (("event_ids", "event_vocab"), ("event_types", "num_event_types"), ("domain", "num_domains"))))
    total += int(sum((want.sparse_values[k] >= v).sum() for k, (_, v) in enumerate(CFG.sparse_features)))
    assert src.bounds is not None and sum(src.bounds.replaced.values()) == total and list(src.bounds.replaced) == [col]
    # a second pass counts again but does not warn again for the same (file, feature)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _read_all(src)
    assert src.bounds.replaced[col] == 2 * total


def test_warn_mode_matches_fbgemm_warning(tmp_path: Path) -> None:
    fbgemm = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_common")
    rng = np.random.default_rng()
    blocks = _blocks(2)
    for h in blocks:  # ids up to 2x the vocab in every sparse feature
        h.sparse_values = [rng.integers(0, 2 * v, size=x.size) for x, v in zip(h.sparse_values, CFG.sparse_vocabs)]
    _write(tmp_path, blocks)
    with pytest.warns(UserWarning):
        back = ParquetSource(tmp_path, expect=CFG, bounds_check="warn").read(0)
    assert back is not None
    h = blocks[0]
    ids = torch.from_numpy(np.concatenate(h.sparse_values))
    offsets = torch.from_numpy(offsets_of(h.sparse_lengths.reshape(-1)))
    rows = torch.tensor(CFG.sparse_vocabs, dtype=torch.int64)
    warn = torch.zeros(1, dtype=torch.int64)
    torch.ops.fbgemm.bounds_check_indices(rows, ids, offsets, fbgemm.BoundsCheckMode.WARNING.value, warn)
    assert torch.equal(torch.from_numpy(np.concatenate(back.sparse_values)), ids)


# ---- the model's shape ----------------------------------------------------------------------------

@pytest.mark.parametrize("change, column, rule", [
    ({"num_dense": CFG.num_dense + 3}, "dense", rf"dense width {CFG.num_dense} in the data != num_dense={CFG.num_dense + 3}"),
    ({"tasks": CFG.tasks[::-1]}, "labels", r"tasks \('click', 'conversion'\) in the data != tasks=\('conversion', 'click'\)"),
    ({"tasks": CFG.tasks + ("share",)}, "labels", r"tasks .* in the data != tasks=.*'share'\)"),
    ({"sparse_features": CFG.sparse_features[:-1]}, None, r"sparse features .* in the data != "),
])
def test_model_mismatch_fails_at_start_up(tmp_path: Path, change: dict[str, object], column: str | None,
                                          rule: str) -> None:
    _write(tmp_path, _blocks())
    where = f"column '{column}'" if column else "file"
    with pytest.raises(DataError, match=rf"part-00000.parquet: {where}: {rule}.*the model was built for"):
        ParquetSource(tmp_path, expect=dataclasses.replace(CFG, **change))  # type: ignore[arg-type]


def test_expect_keeps_the_data_and_orders_keys_like_the_model(tmp_path: Path) -> None:
    blocks = _blocks()
    _write(tmp_path, blocks)
    model_cfg = dataclasses.replace(CFG, sparse_features=CFG.sparse_features[::-1])
    src = ParquetSource(tmp_path, expect=model_cfg)
    back = HostBatch.concat([h for h in _read_all(src) if h is not None])
    want = HostBatch.concat(blocks)
    assert back.keys == model_cfg.sparse_names
    for name in ("event_ids", "event_types", "timestamps", "dense", "domain", "labels"):
        np.testing.assert_array_equal(getattr(back, name), getattr(want, name), err_msg=name)
    for k, key in enumerate(back.keys):
        np.testing.assert_array_equal(back.sparse_values[k], want.sparse_values[want.keys.index(key)])
    assert src.bounds is not None and src.bounds.replaced == {}


def test_bad_arguments(tmp_path: Path) -> None:
    _write(tmp_path, _blocks())
    with pytest.raises(ValueError, match=r"bounds_check='clamp' must be one of \('fatal', 'warn'\)"):
        ParquetSource(tmp_path, expect=CFG, bounds_check="clamp")
    with pytest.raises(ValueError, match="bounds_check='warn' needs expect=DataConfig"):
        ParquetSource(tmp_path, bounds_check="warn")
    with pytest.raises(TypeError, match="expect must be a gem_data.DataConfig"):
        ParquetSource(tmp_path, expect={"num_dense": 8})  # type: ignore[arg-type]
