"""The communication-volume model against hand-counted bytes, and its scaling rules."""

from __future__ import annotations

import dataclasses

import pytest

from gem_parallel import CommConfig, ParallelDims, comm_table, comm_volume

CFG = CommConfig(dense_params=1000, embedding_bytes=8000, embedding_dim=4,
                 lookups_per_sample=3, batch_per_rank=10, optimizer_state_ratio=0.5)


def test_hand_counted_2_hosts_x_4() -> None:
    d = ParallelDims(hosts=2, gpus_per_host=4, sparse_mp=4)
    items = {i.name: i for i in comm_volume(CFG, d)}
    assert set(items) == {"fsdp_allgather", "fsdp_reducescatter", "hsdp_allreduce",
                          "emb_a2a_fwd", "emb_a2a_bwd", "sparse_sync"}
    # FSDP over 4 ranks in a host: all-gather twice (fwd + bwd re-gather), bf16
    ag = items["fsdp_allgather"]
    assert (ag.bytes_per_rank, ag.group_size, ag.crosses_hosts, ag.dim) == (
        2 * 1000 * 2 * 3 / 4, 4, False, "shard")
    assert items["fsdp_reducescatter"].bytes_per_rank == 1000 * 4 * 3 / 4
    # replica all-reduce of a 1/4 grad shard across the 2 hosts
    ar = items["hsdp_allreduce"]
    assert (ar.bytes_per_rank, ar.group_size, ar.crosses_hosts) == (2 * 1 / 2 * 1000, 2, True)
    assert ar.offhost_bytes_per_rank == ar.bytes_per_rank
    # model-parallel group {0, 2, 4, 6}: half the peers are on the other host
    a2a = items["emb_a2a_fwd"]
    act = 10 * 3 * 4 * 2
    assert (a2a.bytes_per_rank, a2a.offhost_bytes_per_rank, a2a.crosses_hosts) == (
        act * 3 / 4, act * 2 / 4, True)
    assert items["emb_a2a_bwd"].bytes_per_rank == a2a.bytes_per_rank
    # replicas {0, 1} share a host: the sync stays on NVLink
    sync = items["sparse_sync"]
    assert (sync.bytes_per_rank, sync.crosses_hosts, sync.dim) == (8000 * 1.5 / 4, False,
                                                                     "replicate")
    assert all(i.seconds > 0 for i in items.values())


def test_single_host_nothing_crosses_and_no_trivial_groups() -> None:
    items = comm_volume(CFG, ParallelDims(hosts=1, gpus_per_host=8))
    names = {i.name for i in items}
    assert "hsdp_allreduce" not in names and "sparse_sync" not in names  # groups of one
    assert not any(i.crosses_hosts for i in items)
    assert comm_volume(CFG, ParallelDims(hosts=1, gpus_per_host=1)) == []


def test_scaling_from_1_to_512_hosts() -> None:
    per_host = []
    for hosts in (1, 2, 8, 64, 512):
        d = ParallelDims(hosts=hosts, gpus_per_host=8, sparse_mp=8 * min(hosts, 8))
        per_host.append({i.name: i for i in comm_volume(CFG, d)})
    # FSDP traffic per rank is independent of the number of hosts
    assert len({p["fsdp_allgather"].bytes_per_rank for p in per_host}) == 1
    # ring all-reduce per rank grows towards 2 x shard bytes, never beyond
    ars = [p["hsdp_allreduce"].bytes_per_rank for p in per_host[1:]]
    assert ars == sorted(ars) and ars[-1] < 2 * 1000 * 4 / 8
    # the sync per rank follows the shard size (1/mp of the tables), not the replica count
    assert per_host[-1]["sparse_sync"].bytes_per_rank == 8000 * 1.5 / 64 * 2 * (63 / 64)


def test_sync_every_and_fp8_allgather() -> None:
    d = ParallelDims(hosts=2, gpus_per_host=4, sparse_mp=4)
    base = {i.name: i for i in comm_volume(CFG, d)}
    cfg = dataclasses.replace(CFG, sparse_sync_every=10, param_bytes=1,
                              reshard_after_forward=False)
    new = {i.name: i for i in comm_volume(cfg, d)}
    assert new["sparse_sync"].bytes_per_rank == base["sparse_sync"].bytes_per_rank / 10
    assert new["fsdp_allgather"].bytes_per_rank == base["fsdp_allgather"].bytes_per_rank / 4


def test_bad_config_rejected() -> None:
    with pytest.raises(ValueError, match="dense_params=-1 must be >= 0"):
        dataclasses.replace(CFG, dense_params=-1)
    with pytest.raises(ValueError, match="sparse_sync_every=0"):
        dataclasses.replace(CFG, sparse_sync_every=0)
    with pytest.raises(ValueError, match="sparse_mp=3"):
        comm_volume(CFG, ParallelDims(hosts=1, gpus_per_host=8, sparse_mp=3))


def test_table_marks_host_crossing() -> None:
    d1, d2 = ParallelDims(hosts=1, gpus_per_host=8), ParallelDims(hosts=2, gpus_per_host=4,
                                                                  sparse_mp=4)
    text = comm_table([("a", d1, comm_volume(CFG, d1)), ("b", d2, comm_volume(CFG, d2))])
    lines = text.splitlines()
    row_a = next(ln for ln in lines if ln.startswith("a "))
    row_b = next(ln for ln in lines if ln.startswith("b "))
    assert "*" not in row_a and "*" in row_b
    assert "2 x 4" in row_b and "4x2" in row_b
