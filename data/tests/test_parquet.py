import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gem_data import DataError, ParquetSource, SyntheticSource, presets, write_parquet
from gem_data._host import HostBatch

CFG = presets.tiny(seq_len_min=0, seq_len_cap=40, seq_len_mean=10.0)


def _blocks(n: int = 6, bs: int = 13) -> list[HostBatch]:
    src = SyntheticSource(CFG, block_size=bs)
    return [src.read(i) for i in range(n)]


def _write(tmp: Path, blocks: list[HostBatch], **kw: int) -> list[Path]:
    args = {"samples_per_shard": 30, "rows_per_group": 7}
    args.update(kw)
    return write_parquet(blocks, tmp, tasks=CFG.tasks, **args)


def _assert_same(a: HostBatch, b: HostBatch) -> None:
    assert a.keys == b.keys
    for name in ("lengths", "event_ids", "event_types", "timestamps", "sparse_lengths", "dense", "domain",
                 "labels", "probs"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    for u, v in zip(a.sparse_values, b.sparse_values):
        np.testing.assert_array_equal(u, v)


def test_exact_round_trip(tmp_path: Path) -> None:
    blocks = _blocks()
    paths = _write(tmp_path, blocks)
    assert [p.name for p in paths] == [f"part-{i:05d}.parquet" for i in range(3)]  # 78 rows / 30
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    src = ParquetSource(tmp_path)
    assert src.keys == CFG.sparse_names
    back = HostBatch.concat([h for h in (src.read(u) for u in range(src.num_blocks)) if h is not None])
    _assert_same(HostBatch.concat(blocks), back)
    # lengths() agrees with the data, row groups of 7 (last of each shard shorter)
    assert [len(src.lengths(u)) for u in range(src.num_blocks)] == [7, 7, 7, 7, 2] * 2 + [7, 7, 4]
    np.testing.assert_array_equal(np.concatenate([src.lengths(u) for u in range(src.num_blocks)]), back.lengths)
    # a Batch also round-trips (values as torch)
    b = src.read(0)
    assert b is not None and b.to_batch("native").num_samples == 7


def test_split_over_ranks_and_workers(tmp_path: Path) -> None:
    _write(tmp_path, _blocks(8, 16), samples_per_shard=16, rows_per_group=8)  # 8 shards
    src = ParquetSource(tmp_path)
    seen: list[str] = []
    for rank in range(2):
        for worker in range(2):
            part = src.split(rank, 2, worker, 2)
            assert len(part) == 2
            seen += part
            n = sum(h.num_samples for h in src.stream(rank, 2, worker, 2))
            assert n == 32
    assert sorted(seen) == src.files
    with pytest.raises(ValueError, match="rank"):
        src.split(2, 2)


def test_never_overwrites(tmp_path: Path) -> None:
    _write(tmp_path, _blocks(2))
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match="part-00000"):
        _write(tmp_path, _blocks(3))
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_truncated_and_garbage_files_name_the_file(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks())
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="part-00001.parquet"):
        ParquetSource(tmp_path)
    paths[1].write_bytes(b"not parquet at all" * 10)
    with pytest.raises(DataError, match="part-00001.parquet.*(corrupt|truncated)"):
        ParquetSource(tmp_path)


def test_skip_policy_counts_bad_shards(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks())
    paths[0].write_bytes(paths[0].read_bytes()[:100])
    with pytest.warns(UserWarning, match="skipping"):
        src = ParquetSource(tmp_path, on_error="skip")
    assert len(src.skipped) == 1 and src.skipped[0][0] == str(paths[0])
    assert src.files == [str(p) for p in paths[1:]]
    assert sum(len(src.lengths(u)) for u in range(src.num_blocks)) == 78 - 30


def test_schema_mismatch_names_the_column(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks())
    t = pq.read_table(paths[2])
    i = t.schema.get_field_index("timestamps")
    bad = t.set_column(i, pa.field("timestamps", pa.list_(pa.float64())), t.column(i).cast(pa.list_(pa.float64())))
    paths[2].unlink()
    pq.write_table(bad, paths[2])
    with pytest.raises(DataError, match=r"part-00002.parquet: column 'timestamps': type"):
        ParquetSource(tmp_path)
    t2 = t.drop_columns(["dense"])
    paths[2].unlink()
    pq.write_table(t2, paths[2])
    with pytest.raises(DataError, match=r"part-00002.parquet: column 'dense': missing"):
        ParquetSource(tmp_path)


def test_corrupt_page_names_file_and_column(tmp_path: Path) -> None:
    paths = write_parquet(_blocks(2, 40), tmp_path, tasks=CFG.tasks, samples_per_shard=80, rows_per_group=80,
                          compression="none")
    raw = bytearray(paths[0].read_bytes())
    # flip bytes inside the first column chunk's data (event_ids values) -> page checksum fails
    md = pq.ParquetFile(paths[0]).metadata.row_group(0).column(0)
    assert md.path_in_schema == "event_ids.list.element"
    end = (md.dictionary_page_offset or md.data_page_offset) + md.total_compressed_size
    start = (md.data_page_offset + end) // 2
    for k in range(start, start + 8):
        raw[k] ^= 0xFF
    paths[0].write_bytes(bytes(raw))
    src = ParquetSource(tmp_path)  # footer is fine
    with pytest.raises(DataError, match=r"part-00000.parquet: column 'event_ids'"):
        src.read(0)
    skip = ParquetSource(tmp_path, on_error="skip")
    with pytest.warns(UserWarning):
        assert skip.read(0) is None
    assert len(skip.skipped) == 1


def test_inconsistent_lists_name_the_column(tmp_path: Path) -> None:
    paths = _write(tmp_path, _blocks(2), samples_per_shard=26)
    t = pq.read_table(paths[0])
    i = t.schema.get_field_index("seq_len")
    bad = t.set_column(i, t.schema.field(i), pa.array(np.full(t.num_rows, 3, np.int32)))
    paths[0].unlink()
    pq.write_table(bad, paths[0], row_group_size=7)
    with pytest.raises(DataError, match=r"column 'seq_len'"):
        ParquetSource(tmp_path).read(0)


def test_bad_args(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_error"):
        ParquetSource(tmp_path, on_error="ignore")
    with pytest.raises(ValueError, match="no Parquet files"):
        ParquetSource(tmp_path)
    with pytest.raises(ValueError, match="samples_per_shard"):
        write_parquet([], tmp_path, tasks=CFG.tasks, samples_per_shard=0)
    with pytest.raises(ValueError, match="labels"):
        write_parquet(_blocks(1), tmp_path / "x", tasks=("only_one",))


def test_round_trip_from_torch_batches(tmp_path: Path) -> None:
    src = SyntheticSource(CFG, block_size=9)
    batches = [src.batch(i, "native") for i in range(3)]
    write_parquet(batches, tmp_path, tasks=CFG.tasks, samples_per_shard=10, rows_per_group=4)
    back = ParquetSource(tmp_path)
    got = HostBatch.concat([h for h in (back.read(u) for u in range(back.num_blocks)) if h is not None])
    _assert_same(HostBatch.concat([src.read(i) for i in range(3)]), got)
