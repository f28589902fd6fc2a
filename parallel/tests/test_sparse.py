"""torchrec sharding on a CPU gloo world equals the unsharded reference (table-wise,
row-wise, column-wise 1-D; 2-D sparse through DMPCollection with the replica sync)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from _dist import run_world  # noqa: E402
from _sparse_workers import (  # noqa: E402
    TABLES, make_batches, make_ebc, reference, reference_sparse_dense, run_1d, run_2d)

STEPS, BATCH, SEED = 3, 8, 1234


def _close(got: list[float], want: list[float]) -> None:
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_1d_table_row_column_wise_equal_reference(tmp_path: "pytest.TempPathFactory") -> None:
    steps = make_batches(SEED, STEPS, BATCH)
    want = reference(steps, SEED)
    kinds = ["table_wise", "row_wise", "column_wise"]
    res = run_world(run_1d, 2, kinds, steps, SEED, str(tmp_path / "ckpt"))
    for kind in kinds:
        for r in res:
            assert r[kind]["types"] == {kind}
            _close(r[kind]["losses"], want)
    # losses actually move (the test can fail)
    assert abs(want[-1] - want[0]) > 1e-3
    # state dict of the sharded model is DCP-compatible (DTensor / ShardedTensor) and saved
    assert set(res[0]["sd_types"].values()) <= {"DTensor", "ShardedTensor"}
    assert (tmp_path / "ckpt" / ".metadata").exists()
    # the checkpoint loads back, unsharded, into a plain EBC: equal to the reference tables
    import torch.distributed.checkpoint as dcp

    ref = make_ebc(SEED)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    from _sparse_workers import kjt_slice, loss_sum, pooled_of

    for b in steps:
        loss = loss_sum(pooled_of(ref(kjt_slice(b, 0, BATCH))), b["y"]) / BATCH
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd = {k: torch.zeros_like(v) for k, v in ref.state_dict().items()}
    dcp.load(sd, checkpoint_id=str(tmp_path / "ckpt"))
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(sd[k], v, rtol=1e-5, atol=1e-6)
    # a budget no plan fits gives a clear error
    assert "per_device_memory_bytes=64" in res[0]["budget_error"]


@pytest.mark.parametrize("kind", ["row_wise"])
def test_2d_sparse_dmpcollection_equals_reference(kind: str) -> None:
    steps = make_batches(SEED + 1, STEPS, BATCH)
    want = reference(steps, SEED)
    res = run_world(run_2d, 4, kind, steps, SEED)
    for r in res:
        _close(r["losses"], want)
    # torchrec DMPCollection layout: replicas on consecutive ranks, model-parallel strided
    assert res[0]["replica_mesh"] == [0, 1] and res[0]["mp_mesh"] == [0, 2]
    # replicas hold identical shards after sync()
    for a, b in [(0, 1), (2, 3)]:
        for k in res[a]["local"]:
            torch.testing.assert_close(res[a]["local"][k], res[b]["local"][k], rtol=0, atol=0)
    assert len(TABLES) == len(res[0]["local"])
    # torchrec tables + HSDP dense MLP composed in one model equal the plain model
    want_composed = reference_sparse_dense(steps, SEED)
    for r in res:
        _close(r["composed"], want_composed)


def test_sharder_offers_row_wise_on_cpu_and_validates_types() -> None:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from gem_parallel import row_wise_sharder

    stock = EmbeddingBagCollectionSharder().sharding_types("cpu")
    assert "row_wise" not in stock  # why the subclass exists
    ours = row_wise_sharder().sharding_types("cpu")
    assert {"row_wise", "table_row_wise"} <= set(ours) and set(stock) <= set(ours)
    assert row_wise_sharder(["row_wise", "table_wise"]).sharding_types("cpu") == [
        "table_wise", "row_wise"]
    with pytest.raises(ValueError, match="sharding_types=\\['rowwise'\\]"):
        row_wise_sharder(["rowwise"])
    with pytest.raises(ValueError, match="non-empty"):
        row_wise_sharder([])
