from pathlib import Path

import numpy as np
import pytest
import torch

from gem_data import Batch, DataError, JaggedLoader, ParquetSource, SyntheticSource, attention_cost, presets, write_parquet

CFG = presets.tiny(seq_len_mean=12.0, seq_len_cap=64, seq_len_min=0)


def _same(a: Batch, b: Batch) -> bool:
    names = ("event_ids", "event_types", "timestamps", "seq_offsets", "dense", "domain", "labels")
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in names) and torch.equal(
        a.sparse.values(), b.sparse.values()) and torch.equal(a.sparse.lengths(), b.sparse.lengths())


@pytest.mark.parametrize("mode", [
    {"blocks_per_batch": 2, "balance": True},
    {"blocks_per_batch": 3, "balance": False},
    {"tokens_per_batch": 150, "balance": True},
])
def test_resume_is_exact(mode: dict[str, object]) -> None:
    src = SyntheticSource(CFG, block_size=5, num_blocks=37)
    kw: dict[str, object] = dict(rank=1, world_size=2, shuffle=True, seed=3, num_epochs=3, num_workers=2,
                                 sparse_kind="native", **mode)
    full = list(JaggedLoader(src, **kw))  # type: ignore[arg-type]
    assert len(full) > 6
    k = int(np.random.default_rng().integers(1, len(full) - 1))
    first = JaggedLoader(src, **kw)  # type: ignore[arg-type]
    it = iter(first)
    got = [next(it) for _ in range(k)]
    state = first.state_dict()
    first.close()
    assert all(isinstance(v, int | bool) for v in state.values())
    again = JaggedLoader(src, **kw)  # type: ignore[arg-type]
    again.load_state_dict(state)
    rest = list(again)
    assert len(got) + len(rest) == len(full)
    assert all(_same(a, b) for a, b in zip(got + rest, full))
    assert again.step == len(full)


@pytest.mark.parametrize("balance", [True, False])
def test_ranks_partition_every_step(balance: bool) -> None:
    W, src = 3, SyntheticSource(CFG, block_size=4, num_blocks=24)
    per_rank = [list(JaggedLoader(src, blocks_per_batch=2, rank=r, world_size=W, balance=balance,
                                  sparse_kind="native")) for r in range(W)]
    assert all(len(p) == 4 for p in per_rank)
    # every sample (identified by its dense row) appears exactly once over ranks and steps
    seen = torch.cat([b.dense for p in per_rank for b in p])
    want = torch.cat([src.batch(i, "native").dense for i in range(24)])
    assert seen.shape == want.shape
    assert torch.equal(seen[torch.argsort(seen[:, 0])], want[torch.argsort(want[:, 0])])


def test_balancing_lowers_rank_cost_spread() -> None:
    cfg = presets.gem(seq_len_mean=300.0, seq_len_cap=4096, event_vocab=1000, sparse_features=(("u", 10),))
    src = SyntheticSource(cfg, block_size=2, num_blocks=8 * 16 * 3)
    def rank_costs(balance: bool) -> np.ndarray:
        out = []
        for r in range(8):
            ld = JaggedLoader(src, blocks_per_batch=16, rank=r, world_size=8, balance=balance, sparse_kind="native")
            out.append([float(attention_cost(b.seq_lengths().numpy()).sum()) for b in ld])
        return np.array(out)  # [ranks, steps]
    bal, unbal = rank_costs(True), rank_costs(False)
    assert np.allclose(bal.sum(0), unbal.sum(0))  # same work per step, only redistributed
    imb_b, imb_u = (bal.max(0) / bal.mean(0)), (unbal.max(0) / unbal.mean(0))
    # the best possible max is >= max(mean, the heaviest single block)
    heaviest = np.array([max(attention_cost(src.lengths(b)).sum() for b in range(s * 128, (s + 1) * 128))
                         for s in range(3)])
    assert np.all(bal.max(0) <= 1.05 * np.maximum(bal.mean(0), heaviest))
    assert imb_u.mean() > imb_b.mean()


def test_endless_source_and_world_size_change() -> None:
    src = SyntheticSource(CFG, block_size=3)  # endless
    ld = JaggedLoader(src, blocks_per_batch=2, world_size=2, rank=0, balance=False, sparse_kind="native")
    it = iter(ld)
    for _ in range(5):
        next(it)
    st = ld.state_dict()
    assert st["cursor"] == 5 * 4 and st["step"] == 5
    ld.close()
    one = JaggedLoader(src, blocks_per_batch=4, world_size=1, balance=False, sparse_kind="native")
    one.load_state_dict(st)  # a different world size continues at the same global block
    nxt = next(iter(one))
    assert torch.equal(nxt.dense[:3], src.batch(20, "native").dense)
    one.close()


def test_parquet_loader_and_worker_errors(tmp_path: Path) -> None:
    syn = SyntheticSource(CFG, block_size=10, num_blocks=8)
    write_parquet((syn.read(i) for i in range(8)), tmp_path, tasks=CFG.tasks, samples_per_shard=40, rows_per_group=10)
    pq_batches = list(JaggedLoader(ParquetSource(tmp_path), blocks_per_batch=2, sparse_kind="native"))
    syn_batches = list(JaggedLoader(syn, blocks_per_batch=2, sparse_kind="native"))
    assert len(pq_batches) == 4 and all(_same(a, b) for a, b in zip(pq_batches, syn_batches))
    # a corrupt shard surfaces from next() as DataError naming the file
    f = tmp_path / "part-00001.parquet"
    raw = bytearray(f.read_bytes())
    src = ParquetSource(tmp_path)
    raw[200:260] = bytes(60)
    f.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="part-00001.parquet"):
        list(JaggedLoader(src, blocks_per_batch=2, balance=False, sparse_kind="native"))


def test_bad_args() -> None:
    src = SyntheticSource(CFG, block_size=2, num_blocks=4)
    with pytest.raises(ValueError, match="rank"):
        JaggedLoader(src, rank=2, world_size=2)
    with pytest.raises(ValueError, match="blocks_per_batch"):
        JaggedLoader(src, blocks_per_batch=0)
    with pytest.raises(ValueError, match="fewer than world_size"):
        JaggedLoader(src, blocks_per_batch=3, world_size=2)
    with pytest.raises(ValueError, match="num_workers"):
        JaggedLoader(src, num_workers=0)
    with pytest.raises(ValueError, match="tokens_per_batch"):
        JaggedLoader(src, tokens_per_batch=0)
    with pytest.raises(TypeError, match="source"):
        JaggedLoader([1, 2, 3])  # type: ignore[arg-type]
    ld = JaggedLoader(src)
    with pytest.raises(ValueError, match="version"):
        ld.load_state_dict({"version": 99})
    with pytest.raises(ValueError, match="seed"):
        ld.load_state_dict({**ld.state_dict(), "seed": 5})
    with pytest.raises(ValueError, match="cursor"):
        ld.load_state_dict({**ld.state_dict(), "cursor": -1})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_prefetch_pinned_nonblocking() -> None:
    src = SyntheticSource(presets.gem(), block_size=16, num_blocks=64)
    ld = JaggedLoader(src, blocks_per_batch=4, device="cuda", num_workers=2, sparse_kind="native")
    ref = JaggedLoader(src, blocks_per_batch=4, sparse_kind="native")
    for g, c in zip(ld, ref):
        assert g.event_ids.is_cuda and g.sparse.values().is_cuda
        assert _same(g.to("cpu"), c)


def test_batches_carry_host_lengths_equal_to_the_offsets() -> None:
    import gem_data

    src = gem_data.SyntheticSource(gem_data.presets.tiny(seed=3), block_size=8)
    loader = gem_data.JaggedLoader(src, blocks_per_batch=3, num_workers=1, prefetch=2)
    for _ in range(3):
        b = next(loader)
        assert b.seq_lengths_host is not None
        assert list(b.seq_lengths_host) == b.seq_lengths().tolist()
        assert max(b.seq_lengths_host) == b.max_seq_len
    loader.close()


def test_sparse_per_key_lengths_are_host_ints_carried_to_the_device() -> None:
    # Splitting the sparse ids per key must not read device lengths (a host sync every step
    # on the GPU). "meta" tensors have no data: reading them would raise.
    b = SyntheticSource(presets.tiny(), block_size=int(np.random.randint(2, 40))).batch(
        int(np.random.randint(0, 1000)), sparse_kind="native")
    want = [int(j.lengths().sum()) for j in b.sparse.to_dict().values()]
    moved = b.sparse.to("meta")
    assert moved.length_per_key() == want == b.sparse.length_per_key()
    parts = moved.to_dict()
    assert [p.values().shape[0] for p in parts.values()] == want
    from gem_data._batch import SparseFeatures
    with pytest.raises(ValueError, match="length_per_key"):
        SparseFeatures(["a", "b"], torch.zeros(3, dtype=torch.int64), torch.ones(4, dtype=torch.int64), [3])
