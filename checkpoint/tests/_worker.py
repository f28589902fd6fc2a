"""Child-process bodies for the crash, real-I/O-error and multi-process tests.

Started through a forkserver that has torch imported already (see _util.start), so a
child costs milliseconds instead of a fresh torch import. Each takes a Connection `conn`
and sends its results (or "READY") through it.
"""

from __future__ import annotations

import os
import resource
import signal
from multiprocessing.connection import Connection
from typing import Any

import torch

from gem_checkpoint import FAULT_ENV, Checkpointer, CheckpointWriteError, RNGState

N = 1 << 22  # 16 MiB of float32 per step: long enough to be killed mid-write


def step_state(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(N, generator=g), "b": torch.randint(0, 1 << 30, (1000,), generator=g), "meta": {"step": step, "tag": f"s{step}"}}


def crash(conn: Connection, directory: str, fault: str) -> None:
    """Saves step 1, says READY, then saves steps 2, 3, ... until killed."""
    torch.set_num_threads(1)
    os.environ.pop(FAULT_ENV, None)
    ckpt = Checkpointer(directory, keep_last=2)
    ckpt.save(1, step_state(1))
    ckpt.wait()
    if fault != "none":
        os.environ[FAULT_ENV] = fault
    conn.send("READY")
    step = 2
    while True:
        ckpt.save(step, step_state(step))
        step += 1


def fsize(conn: Connection, directory: str) -> None:
    """A real failing write: RLIMIT_FSIZE below the checkpoint size, then lifted again."""
    torch.set_num_threads(1)
    os.environ.pop(FAULT_ENV, None)
    ckpt = Checkpointer(directory, keep_last=5)
    ckpt.save(1, step_state(1))
    ckpt.wait()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-big write then fails with EFBIG
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    ckpt.save(2, step_state(2))
    out: dict[str, Any] = {}
    try:
        ckpt.wait()
        out["error"] = None
    except CheckpointWriteError as e:
        out["error"] = str(e)
    out["latest_after_failure"] = ckpt.latest()
    out["entries_after_failure"] = sorted(os.listdir(directory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    ckpt.save(3, step_state(3))
    ckpt.wait()
    out["latest_after_retry"] = ckpt.latest()
    conn.send(out)


def dist_state(seed: int, world: int, mesh: object, zeros: bool) -> dict[str, object]:
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    assert isinstance(mesh, DeviceMesh)
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(10, 6, generator=g)  # 10 rows: uneven on 3 ranks
    bias = torch.randn(6, generator=g)
    if zeros:
        full, bias = torch.zeros_like(full), torch.zeros_like(bias)
    return {
        "model": {"w": distribute_tensor(full, mesh, [Shard(0)]), "b": bias},
        "rng": RNGState(),
        "config": {"seed": seed, "world": world},
    }


def dist_main(conn: Connection, mode: str, directory: str, seed: int, rank: int, world: int, port: int) -> None:
    """One rank of a gloo world: DTensor Shard(0) save (dist_save) or resharded load."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.pop(FAULT_ENV, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    armed = [False]

    def hook(stage: str) -> None:  # a disk-full on rank 1 only
        if armed[0] and stage == "write" and rank == 1:
            raise OSError(28, "No space left on device (rank 1 test hook)")

    ckpt = Checkpointer(directory, fault_hook=hook)
    if mode == "dist_save":
        torch.manual_seed(1000 + rank)
        state = dist_state(seed, world, mesh, zeros=False)
        ckpt.save(5, state)
        ckpt.wait()
        expect_rand = torch.rand(4)  # what this rank's RNG gives next
        torch.save(expect_rand, os.path.join(directory, f"rand_rank{rank}.pt"))
        armed[0] = True
        ckpt.save(6, state)
        try:
            ckpt.wait()
            error = None
        except CheckpointWriteError as e:
            error = str(e)
        conn.send({"rank": rank, "latest": ckpt.latest(), "error": error,
                   "entries": sorted(e for e in os.listdir(directory) if e.startswith("step_"))})
    else:
        state = dist_state(seed, world, mesh, zeros=True)
        ref = dist_state(seed, world, mesh, zeros=False)
        step = ckpt.load(state)
        w = state["model"]["w"]  # type: ignore[index]
        ok_w = torch.equal(w.full_tensor(), ref["model"]["w"].full_tensor())  # type: ignore[index]
        local_rows = w.to_local().shape[0]
        ok_b = torch.equal(state["model"]["b"], ref["model"]["b"])  # type: ignore[index]
        saved_world = state["config"]["world"]  # type: ignore[index]
        expect = torch.load(os.path.join(directory, f"rand_rank{rank % saved_world}.pt"))
        ok_rng = torch.equal(torch.rand(4), expect)
        conn.send({"rank": rank, "step": step, "w": ok_w, "b": ok_b, "rng": ok_rng, "rows": local_rows, "config": state["config"]})
    dist.destroy_process_group()


def table_state(seed: int, rank: int, zeros: bool) -> dict[str, object]:
    """torchrec's table-wise layout: table "a" lives wholly on rank 0, "b" on rank 1, so each
    rank holds a ShardedTensor with no local shard; next to them a tensor-free loader state."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    g = torch.Generator().manual_seed(seed)
    full = {"a": torch.randn(7, 4, generator=g), "b": torch.randn(5, 3, generator=g)}
    tables: dict[str, object] = {}
    for owner, (name, t) in enumerate(full.items()):
        local = t.clone() if not zeros else torch.zeros_like(t)
        md = ShardMetadata(shard_offsets=[0, 0], shard_sizes=list(t.shape), placement=f"rank:{owner}/cpu")
        shards = [Shard(local, md)] if rank == owner else []
        tables[name] = init_from_local_shards(shards, *t.shape)
    loader = {"cursor": 0 if zeros else seed % 97, "epoch": 0 if zeros else 3, "order": [] if zeros else [2, 0, 1]}
    return {"tables": tables, "loader": loader, "full": full}


def table_main(conn: Connection, directory: str, seed: int, rank: int, world: int, port: int) -> None:
    """Save and load ShardedTensors that some ranks hold no shard of (torchrec table-wise)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.pop(FAULT_ENV, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo")
    saved = table_state(seed, rank, zeros=False)
    ckpt = Checkpointer(directory)
    ckpt.save(3, {"tables": saved["tables"], "loader": saved["loader"]})
    ckpt.wait()
    fresh = table_state(seed, rank, zeros=True)
    state: dict[str, Any] = {"tables": fresh["tables"], "loader": fresh["loader"]}
    out: dict[str, Any] = {"rank": rank}
    try:
        out["step"] = Checkpointer(directory).load(state)
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = repr(e)
    out["loader"] = state["loader"] == saved["loader"]
    full: Any = saved["full"]
    out["tables"] = {n: all(torch.equal(s.tensor, full[n]) for s in st.local_shards())
                     for n, st in state["tables"].items()}
    out["local"] = {n: len(st.local_shards()) for n, st in state["tables"].items()}
    conn.send(out)
    dist.destroy_process_group()


def wrapped_state(seed: int, rank: int, mesh: object, zeros: bool) -> dict[str, object]:
    """DTensors over torchrec's LocalShardsWrapper, as DMPCollection (2-D sparse) saves its
    tables: "rows" has one row block per rank; "cols" has two column shards on rank 0 and
    none on rank 1."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torchrec.distributed.shards_wrapper import LocalShardsWrapper

    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g)
    if zeros:
        rows, cols = torch.zeros_like(rows), torch.zeros_like(cols)
    r_local = LocalShardsWrapper([rows[3 * rank:3 * rank + 3].clone()], [(3 * rank, 0)])
    c_local = (LocalShardsWrapper([cols[:, :2].clone(), cols[:, 2:].clone()], [(0, 0), (0, 2)])
               if rank == 0 else LocalShardsWrapper([], []))
    return {
        "rows": DTensor.from_local(r_local, mesh, [Shard(0)], run_check=False, shape=rows.shape, stride=rows.stride()),
        "cols": DTensor.from_local(c_local, mesh, [Replicate()], run_check=False, shape=cols.shape, stride=cols.stride()),
        "full": {"rows": rows, "cols": cols},
    }


def wrapped_main(conn: Connection, directory: str, seed: int, rank: int, world: int, port: int) -> None:
    """Save (async staging) and load DTensors whose local tensor is a LocalShardsWrapper."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.pop(FAULT_ENV, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    saved = wrapped_state(seed, rank, mesh, zeros=False)
    ckpt = Checkpointer(directory)
    ckpt.save(2, {"tables": {"rows": saved["rows"], "cols": saved["cols"]}, "loader": {"pos": seed % 89}})
    for t in (saved["rows"], saved["cols"]):  # after save() returns, training may write
        for shard in t._local_tensor.local_shards():  # type: ignore[attr-defined]
            shard.fill_(7.0)
    ckpt.wait()
    fresh = wrapped_state(seed, rank, mesh, zeros=True)
    state: dict[str, Any] = {"tables": {"rows": fresh["rows"], "cols": fresh["cols"]}, "loader": {"pos": -1}}
    out: dict[str, Any] = {"rank": rank, "step": Checkpointer(directory).load(state)}
    ref: Any = wrapped_state(seed, rank, mesh, zeros=False)["full"]
    got = {"rows": [(o, t) for o, t in zip(state["tables"]["rows"]._local_tensor.local_offsets(),
                                          state["tables"]["rows"]._local_tensor.local_shards())],
           "cols": [(o, t) for o, t in zip(state["tables"]["cols"]._local_tensor.local_offsets(),
                                          state["tables"]["cols"]._local_tensor.local_shards())]}
    out["ok"] = {n: [torch.equal(t, ref[n][o[0]:o[0] + t.shape[0], o[1]:o[1] + t.shape[1]]) for o, t in v]
                 for n, v in got.items()}
    out["loader"] = state["loader"]["pos"] == seed % 89
    conn.send(out)
    dist.destroy_process_group()


def entry(name: str, conn: Connection, *args: Any) -> None:
    {"crash": crash, "fsize": fsize, "dist_save": dist_main, "dist_load": dist_main,
     "tables": table_main, "wrapped": wrapped_main}[name](conn, *args)
