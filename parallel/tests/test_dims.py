"""ParallelDims: validation errors and mesh layouts (no processes needed)."""

from __future__ import annotations

import pytest
import torch

from gem_parallel import ParallelDims


def test_defaults_shard_inside_host_replicate_across() -> None:
    d = ParallelDims(hosts=4, gpus_per_host=8).validate()
    assert (d.world_size, d.replicate, d.shard, d.sparse_model_parallel, d.sparse_replicas) == (
        32, 4, 8, 32, 1)
    lay = d.dense_layout()
    assert lay.shape == (4, 8)
    # each shard group (row) is one host; each replica group (column) spans all hosts
    for row in lay.tolist():
        assert len({d.host_of(r) for r in row}) == 1
    assert {d.host_of(r) for r in lay[:, 3].tolist()} == {0, 1, 2, 3}


@pytest.mark.parametrize("hosts,gpus,mp,within", [(2, 4, 4, True), (2, 4, 4, False),
                                                   (4, 2, 2, True), (1, 8, 8, True),
                                                   (3, 2, 3, True), (2, 2, 1, True)])
def test_sparse_layout_is_a_partition_matching_torchrec(hosts: int, gpus: int, mp: int,
                                                        within: bool) -> None:
    d = ParallelDims(hosts=hosts, gpus_per_host=gpus, sparse_mp=mp,
                     sparse_replicas_within_host=within).validate()
    lay = d.sparse_layout()
    world = hosts * gpus
    assert lay.shape == (world // mp, mp)
    assert sorted(lay.flatten().tolist()) == list(range(world))
    # torchrec DMPCollection._create_process_groups, written out independently
    step = world // mp
    if within:
        want = [[step * r + g for r in range(mp)] for g in range(step)]
    else:
        want = [list(range(i, i + mp)) for i in range(0, world, mp)]
    assert lay.tolist() == want


def test_uneven_sparse_shard_with_non_power_of_two() -> None:
    d = ParallelDims(hosts=3, gpus_per_host=4, dp_shard=2, sparse_mp=6).validate()
    assert (d.replicate, d.shard, d.sparse_replicas) == (6, 2, 2)


@pytest.mark.parametrize("kw,match", [
    (dict(hosts=2, gpus_per_host=4, dp_shard=3), r"dp_shard=3 must divide world size 8"),
    (dict(hosts=2, gpus_per_host=4, dp_replicate=3, dp_shard=4),
     r"dp_replicate=3 x dp_shard=4 must equal world size 8"),
    (dict(hosts=2, gpus_per_host=4, dp_shard=8), r"shard_within_host=True"),
    (dict(hosts=3, gpus_per_host=4, dp_shard=6), r"dp_shard=6 must divide gpus_per_host=4"),
    (dict(hosts=2, gpus_per_host=4, sparse_mp=3), r"sparse_mp=3 must divide world size 8"),
    (dict(hosts=2, gpus_per_host=4, sparse_mp=16), r"sparse_mp=16 must divide"),
    (dict(hosts=0, gpus_per_host=4), r"hosts=0 must be a positive int"),
    (dict(hosts=1, gpus_per_host=4, dp_shard=0), r"dp_shard=0 must be a positive int or -1"),
    (dict(hosts=1, gpus_per_host=True), r"gpus_per_host=True must be a positive int"),
])
def test_invalid_degrees_give_clear_errors(kw: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ParallelDims(**kw).validate()  # type: ignore[arg-type]


def test_shard_across_hosts_allowed_when_asked() -> None:
    d = ParallelDims(hosts=2, gpus_per_host=4, dp_shard=8, shard_within_host=False).validate()
    assert d.replicate == 1
    assert {d.host_of(r) for r in d.dense_layout()[0].tolist()} == {0, 1}


def test_frozen_and_keyword_only() -> None:
    d = ParallelDims(hosts=1, gpus_per_host=2)
    with pytest.raises(AttributeError):
        d.hosts = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        ParallelDims(1, 2)  # type: ignore[misc]


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    d = ParallelDims.from_env(sparse_mp=4).validate()
    assert (d.hosts, d.gpus_per_host, d.sparse_mp) == (2, 8, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "5")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=5 must divide WORLD_SIZE=16"):
        ParallelDims.from_env()


def test_build_meshes_needs_a_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with pytest.raises(ValueError, match="init_process_group"):
        ParallelDims(hosts=1, gpus_per_host=1).build_meshes("cpu")


def test_build_meshes_single_process() -> None:
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "s"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            with pytest.raises(ValueError, match="process group has 1 ranks"):
                ParallelDims(hosts=1, gpus_per_host=2).build_meshes("cpu")
            m = ParallelDims(hosts=1, gpus_per_host=1).build_meshes("cpu")
            assert m.dense.mesh_dim_names == ("replicate", "shard")
            assert m.sparse.mesh_dim_names == ("replicate", "shard")
            assert m.dense.mesh.shape == (1, 1) and m.world.mesh.shape == (1,)
            assert torch.equal(m.sparse.mesh, torch.tensor([[0]]))
        finally:
            dist.destroy_process_group()
