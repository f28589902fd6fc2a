"""Rank bodies for the multi-process tests: each runs many checks in one world (process
start-up with torch costs seconds, so one world batches everything)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gem_comms as gc

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8]
OPS = {
    "sum": (dist.ReduceOp.SUM, lambda t: t.sum(0)),
    "max": (dist.ReduceOp.MAX, lambda t: t.amax(0)),
    "min": (dist.ReduceOp.MIN, lambda t: t.amin(0)),
    "avg": (dist.ReduceOp.AVG, lambda t: t.mean(0)),
    "product": (dist.ReduceOp.PRODUCT, lambda t: t.prod(0)),
}


def launch(fn: Callable[[int, int, str, str], None], world: int, device: str = "cpu") -> None:
    """Runs fn(rank, world, store_path, device) on `world` processes with a gloo group."""
    with tempfile.TemporaryDirectory() as tmp:
        # fork is much faster (torch is already imported) and safe for CPU-only children.
        method = "spawn" if device != "cpu" else "fork"
        mp.start_processes(
            _entry, args=(fn, world, os.path.join(tmp, "store"), device), nprocs=world, start_method=method
        )


def _entry(rank: int, fn: Callable[[int, int, str, str], None], world: int, path: str, device: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{path}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        fn(rank, world, path, device)
    finally:
        dist.destroy_process_group()


def rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen)
    elif dtype == torch.uint8:
        t = torch.randint(0, 256, shape, generator=gen)
    else:
        t = torch.randint(-1000, 1000, shape, generator=gen)
    return t.to(dtype).to(device)


def sentinel_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, 7)


# ---------------------------------------------------------------------------------------------
def check_all_gather(rank: int, world: int, device: str, backends: tuple[str, ...]) -> None:
    gen = torch.Generator().manual_seed(100 + rank)
    for dtype in DTYPES:
        for shape in [(0,), (1,), (7,), (5, 3)]:
            out = torch.empty((world * shape[0], *shape[1:]), dtype=dtype, device=device)
            for backend in backends:
                for async_op in (False, True):
                    for _ in range(2):  # same output buffer (and staging) reused with fresh data
                        x = rand(shape, dtype, gen, device)
                        out.copy_(sentinel_like(out))
                        h = gc.all_gather_into_tensor(out, x, async_op=async_op, backend=backend)  # type: ignore[arg-type]
                        if async_op:
                            assert h is not None
                            h.wait(timeout=30)
                        else:
                            assert h is None
                        ref = torch.empty_like(out).cpu()
                        dist.all_gather_into_tensor(ref, x.cpu())
                        assert torch.equal(out.cpu(), ref), (backend, dtype, shape)


def split_matrix(world: int, seed: int) -> list[list[int]]:
    """m[p][q] = rows rank p sends to rank q; shared by all ranks; many zero parts."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 5, (world, world), generator=g)
    m[torch.rand((world, world), generator=g) < 0.3] = 0
    if seed % 3 == 0:
        m[0, :] = 0  # rank 0 sends nothing at all
    if seed % 3 == 1:
        m[:, world - 1] = 0  # the last rank receives nothing at all
    return [[int(v) for v in row] for row in m.tolist()]


def check_all_to_all(rank: int, world: int, device: str, backends: tuple[str, ...]) -> None:
    gen = torch.Generator().manual_seed(200 + rank)
    for seed, dtype in enumerate(DTYPES):
        for tail in [(), (3,)]:
            m = split_matrix(world, seed * 7 + len(tail))
            ins = m[rank]
            outs = [m[q][rank] for q in range(world)]
            out = torch.empty((sum(outs), *tail), dtype=dtype, device=device)
            for backend in backends:
                for async_op in (False, True):
                    for _ in range(2):
                        x = rand((sum(ins), *tail), dtype, gen, device)
                        out.copy_(sentinel_like(out))
                        h = gc.all_to_all_single(out, x, outs, ins, async_op=async_op, backend=backend)  # type: ignore[arg-type]
                        if h is not None:
                            h.wait(timeout=30)
                        ref = torch.empty(out.shape, dtype=dtype)
                        dist.all_to_all_single(ref, x.cpu(), outs, ins)
                        assert torch.equal(out.cpu(), ref), (backend, dtype, m)
    # equal splits (None) and a size large enough to grow the copy-engine staging (> 1 MiB)
    for rows in (world * 2, world * 70_000):
        x = rand((rows,), torch.float32, gen, device)
        out = torch.empty_like(x)
        for backend in backends:
            gc.all_to_all_single(out, x, backend=backend)  # type: ignore[arg-type]
            ref = torch.empty(rows)
            dist.all_to_all_single(ref, x.cpu())
            assert torch.equal(out.cpu(), ref), (backend, rows)


def check_reduce_scatter(rank: int, world: int, device: str, backends: tuple[str, ...]) -> None:
    gen = torch.Generator().manual_seed(300 + rank)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.int64: 0.0}
    for dtype, op_names in [
        (torch.float32, ["sum", "max", "min", "avg", "product"]),
        (torch.bfloat16, ["sum", "max"]),
        (torch.int64, ["sum", "min", "product"]),
    ]:
        for n in (0, 1, 9):
            x = rand((world * n, 2), dtype, gen, device)
            if dtype == torch.int64:
                x = x % 5 + 1
            gathered = torch.empty((world * world * n * 2,), dtype=dtype)
            dist.all_gather_into_tensor(gathered, x.cpu().reshape(-1))
            stacked = gathered.view(world, world, n * 2)[:, rank].double()
            for name in op_names:
                op, ref_fn = OPS[name]
                ref = ref_fn(stacked).view(n, 2)
                for backend in backends:
                    if backend == "gloo" and name == "avg":
                        continue  # gloo has no AVG
                    out = torch.full((n, 2), 7, dtype=dtype, device=device)
                    h = gc.reduce_scatter_tensor(out, x, op, async_op=True, backend=backend)  # type: ignore[arg-type]
                    assert h is not None
                    h.wait(timeout=30)
                    got = out.cpu().double()
                    t = tol[dtype] * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
                    assert torch.allclose(got, ref, atol=t, rtol=tol[dtype]), (backend, name, dtype, got, ref)


def check_errors(rank: int, world: int, device: str) -> None:
    """Symmetric bad calls: every rank raises before any transfer; the group stays usable."""
    x = torch.ones(4, device=device)
    for backend in ("gloo", "copy_engine", "auto") if device == "cpu" else ("copy_engine", "auto"):
        with pytest.raises(ValueError, match=r"output.numel\(\)"):
            gc.all_gather_into_tensor(torch.empty(4 * world + 1, device=device), x, backend=backend)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"sum\(input_split_sizes\)"):
            gc.all_to_all_single(torch.empty(4, device=device), x, [1] * world, [5] + [0] * (world - 1), backend=backend)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="world_size"):
            gc.all_to_all_single(torch.empty(4, device=device), x, [4], [4, 0, 0, 0, 0], backend=backend)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="output.dtype"):
            gc.all_gather_into_tensor(torch.empty(4 * world, dtype=torch.int64, device=device), x, backend=backend)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"input.numel\(\)"):
            gc.reduce_scatter_tensor(torch.empty(3, device=device), x, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend"):
        gc.all_gather_into_tensor(torch.empty(4 * world, device=device), x, backend="mpi")  # type: ignore[arg-type]

    # Cross-rank disagreement: every backend raises the same ValueError on every rank before
    # any byte moves, and the group stays usable.
    for backend in ("copy_engine", "gloo", "auto") if device == "cpu" else ("copy_engine", "auto"):
        check_mismatches(rank, world, device, backend)


def _same_error_everywhere(fn: Callable[[], object], match: str) -> str:
    with pytest.raises(ValueError, match=match) as e:
        fn()
    msgs: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(msgs, str(e.value))
    assert all(m == msgs[0] for m in msgs), msgs  # the same message on every rank
    return str(e.value)


def check_mismatches(rank: int, world: int, device: str, backend: str) -> None:
    # The check runs once per distinct signature, so every mismatching call here uses sizes
    # no rank has used before (a rank whose signature is cached would skip the exchange).
    b = backend
    n = 3 + (rank == world - 1)  # the last rank gathers a different size
    x = torch.arange(n, dtype=torch.float32, device=device)
    out = torch.full((world * n,), -1.0, device=device)
    _same_error_everywhere(lambda: gc.all_gather_into_tensor(out, x, backend=b),  # type: ignore[arg-type]
                           r"input_tensor.numel\(\).*no data was transferred")
    assert torch.equal(out, torch.full_like(out, -1.0)), "a transfer happened before the error"
    dtype = torch.float32 if rank == 0 else torch.int32  # same element size, different dtype
    o2 = torch.full((world * 2,), 5, dtype=dtype, device=device)
    _same_error_everywhere(
        lambda: gc.all_gather_into_tensor(o2, torch.zeros(2, dtype=dtype, device=device), backend=b),  # type: ignore[arg-type]
        "disagree.*dtype=torch.float32.*dtype=torch.int32")
    assert bool((o2 == 5).all())
    o3 = torch.full((11 + 2 * (rank == 0),), -1.0, device=device)
    _same_error_everywhere(
        lambda: gc.reduce_scatter_tensor(o3, torch.ones(world * o3.numel(), device=device), backend=b),  # type: ignore[arg-type]
        r"reduce_scatter_tensor: rank 0 sends 13 rows to rank 1")
    assert torch.equal(o3, torch.full_like(o3, -1.0))
    ins = [1] * world
    outs = [1] * world
    if rank == 0:
        ins[1 % world] += 1  # rank 0 sends one row more to rank 1 than rank 1 expects
    xa = torch.zeros(sum(ins), device=device)
    oa = torch.full((sum(outs),), -1.0, device=device)
    _same_error_everywhere(lambda: gc.all_to_all_single(oa, xa, outs, ins, backend=b),  # type: ignore[arg-type]
                           r"rank 0 sends 2 rows to rank 1 \(input_split_sizes\)")
    assert torch.equal(oa, torch.full_like(oa, -1.0))
    # ...and the group still works afterwards.
    x = torch.full((8,), float(rank), device=device)
    out = torch.empty(8 * world, device=device)
    gc.all_gather_into_tensor(out, x, backend=b)  # type: ignore[arg-type]
    assert torch.equal(out.cpu(), torch.arange(world, dtype=torch.float32).repeat_interleave(8))


def check_signature_cache(rank: int, world: int, device: str, backend: str) -> None:
    """A repeated call signature costs no host exchange; a new one costs exactly one."""
    from gem_comms import _peer

    def exchanges() -> int:
        if backend == "copy_engine":
            return _peer._groups[(_peer._group_name(None), torch.device(device).type)].channel.exchanges
        return _peer.torch_channel(None).exchanges

    x = torch.full((5,), float(rank), device=device)
    out = torch.empty(5 * world, device=device)
    gc.all_gather_into_tensor(out, x, backend=backend)  # type: ignore[arg-type]
    before = exchanges()
    for _ in range(3):
        gc.all_gather_into_tensor(out, x, backend=backend)  # type: ignore[arg-type]
    assert exchanges() == before, "a cached signature went through the store"
    gc.all_gather_into_tensor(torch.empty(23 * world, device=device), torch.zeros(23, device=device), backend=backend)  # type: ignore[arg-type]
    assert exchanges() == before + 1


def check_in_place(rank: int, world: int, device: str) -> None:
    """FSDP's in-place all-gather: the input is this rank's slice of the output."""
    gen = torch.Generator().manual_seed(600 + rank)
    for n in (1, 9, 70_000):
        out = torch.full((world * n,), -1.0, device=device)
        inp = out[rank * n:(rank + 1) * n]
        inp.copy_(rand((n,), torch.float32, gen, device))
        ref = torch.empty(world * n)
        dist.all_gather_into_tensor(ref, inp.cpu())
        gc.all_gather_into_tensor(out, inp, backend="copy_engine")
        assert torch.equal(out.cpu(), ref)


def check_prefetcher(rank: int, world: int, device: str, backends: tuple[str, ...]) -> None:
    gen = torch.Generator().manual_seed(400 + rank)
    shards = [rand((3 + i, 2), torch.float32, gen, device) for i in range(5)]
    for backend in backends:
        for depth in (1, 2):
            pf = gc.Prefetcher(iter(shards), backend=backend, depth=depth)  # type: ignore[arg-type]
            seen = 0
            for i, full in enumerate(pf):
                # while layer i is handed out, layers i+1..i+depth are already being gathered
                assert pf.started == min(i + 1 + depth, len(shards)), (pf.started, i, depth)
                assert pf.consumed == i + 1
                ref = torch.empty((world * shards[i].shape[0], 2))
                dist.all_gather_into_tensor(ref, shards[i].cpu())
                assert torch.equal(full.cpu(), ref)
                seen += 1
            assert seen == len(shards)
    outs = list(gc.overlap_all_gather(shards[:2], backend=backends[0]))  # type: ignore[arg-type]
    assert [o.shape[0] for o in outs] == [world * 3, world * 4]


def check_timeouts(rank: int, world: int, device: str) -> None:
    """Rank 1 joins late: rank 0 gets TimeoutError after `timeout`, on every backend."""
    x = torch.full((3,), float(rank), device=device)
    expect = torch.arange(world, dtype=torch.float32).repeat_interleave(3)
    out = torch.empty(3 * world, device=device)
    if device == "cpu":
        gc.all_gather_into_tensor(out, x, backend="gloo")  # signature now agreed and cached
        if rank == 0:
            h = gc.all_gather_into_tensor(out, x, async_op=True, backend="gloo")
            assert h is not None
            with pytest.raises(TimeoutError, match="did not complete"):
                h.wait(timeout=0.3)
            h.wait(timeout=30)  # rank 1 arrives: the same handle completes
            t0 = time.monotonic()  # a sync call honours timeout= too
            with pytest.raises(TimeoutError, match="did not complete within timeout=0.4"):
                gc.all_gather_into_tensor(out, x, backend="gloo", timeout=0.4)
            assert time.monotonic() - t0 < 5
        else:
            time.sleep(1.5)
            gc.all_gather_into_tensor(out, x, backend="gloo")
            time.sleep(1.5)
            gc.all_gather_into_tensor(out, x, backend="gloo")  # completes rank 0's timed-out call
        dist.barrier()  # gloo orders the barrier after the pending all-gather
        assert torch.equal(out, expect)
        # a new signature: the cross-rank check itself times out, naming the missing rank
        if rank == 0:
            with pytest.raises(TimeoutError, match=r"for ranks \[1\]"):
                gc.all_gather_into_tensor(torch.empty(7 * world), torch.zeros(7), backend="gloo", timeout=0.5)
        gc.release_buffers()
        dist.barrier()
    # copy engine, cached signature: rank 0 gives up waiting for rank 1's staged data; rank 1
    # (late) still completes, because rank 0 staged and signalled before it gave up.
    gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=30)
    if rank == 1:
        time.sleep(2.0)
    if rank == 0:
        with pytest.raises(TimeoutError, match=r"for ranks \[1\]"):
            gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=0.7)
        with pytest.raises(RuntimeError, match="timed out earlier"):
            gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=0.7)
    else:
        gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=30)
        assert torch.equal(out.cpu(), expect)
    gc.release_buffers()  # on every rank: fresh state and store keys
    dist.barrier()
    # new signature: rank 0 gives up in the cross-rank check, rank 1 (late) waiting for data.
    if rank == 1:
        time.sleep(2.0)
    with pytest.raises(TimeoutError, match="did not join"):
        gc.all_gather_into_tensor(torch.empty(4 * world, device=device), torch.zeros(4, device=device),
                                  backend="copy_engine", timeout=0.7)
    gc.release_buffers()
    dist.barrier()
    gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=30)
    assert torch.equal(out.cpu(), expect)


def world_main(rank: int, world: int, path: str, device: str) -> None:
    backends = ("gloo", "copy_engine", "auto") if device == "cpu" else ("copy_engine", "auto")
    check_all_gather(rank, world, device, backends)
    check_all_to_all(rank, world, device, backends)
    check_reduce_scatter(rank, world, device, ("gloo", "copy_engine") if device == "cpu" else ("copy_engine",))
    check_errors(rank, world, device)
    check_prefetcher(rank, world, device, backends)
    check_in_place(rank, world, device)
    for backend in ("copy_engine", "gloo") if device == "cpu" else ("copy_engine",):
        check_signature_cache(rank, world, device, backend)
    # several lanes (side streams) on small chunks: the piece boundaries and flags per lane
    from gem_comms import _peer

    gc.release_buffers()
    _peer.configure(lanes=3, lane_min_bytes=64)
    check_all_gather(rank, world, device, ("copy_engine",))
    check_all_to_all(rank, world, device, ("copy_engine",))
    check_reduce_scatter(rank, world, device, ("copy_engine",))
    check_in_place(rank, world, device)
    # the other flag placement: writers set their own flags, readers wait on the peer's memory
    gc.release_buffers()
    _peer.configure(lanes=2, lane_min_bytes=64, signal="poll")
    check_all_gather(rank, world, device, ("copy_engine",))
    check_all_to_all(rank, world, device, ("copy_engine",))
    check_reduce_scatter(rank, world, device, ("copy_engine",))
    check_in_place(rank, world, device)
    gc.release_buffers()
    default = _peer.Config()
    _peer.configure(lanes=default.lanes, lane_min_bytes=default.lane_min_bytes, signal=default.signal)
    if world == 2 and device == "cpu":  # CUDA waits are on the GPU: see the README's Faults
        check_timeouts(rank, world, device)
    if device == "cpu":
        _close(rank, world, device)
    if device != "cpu":
        assert gc.resolve_backend(torch.empty(1, device=device)) == "copy_engine"


def _close(rank: int, world: int, device: str) -> None:
    gc.release_buffers()  # drop peer mappings before any producer exits
    dist.barrier()


def check_large(rank: int, world: int, device: str) -> None:
    """GPU sizes: 64 MiB bf16 shards, all three collectives, staging growth, three reuses."""
    gen = torch.Generator().manual_seed(500 + rank)
    n = 32 * 1024 * 1024
    out = torch.empty(world * n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        x = torch.randn(n, generator=gen).to(torch.bfloat16).to(device)
        h = gc.all_gather_into_tensor(out, x, async_op=True, backend="copy_engine")
        assert h is not None
        h.wait(timeout=60)
        ref = torch.empty(world * n, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(ref, x.cpu())
        assert torch.equal(out.cpu(), ref)
    rows = [n // 8 * (1 + (rank + q) % 3) for q in range(world)]
    m = [[n // 8 * (1 + (p + q) % 3) for q in range(world)] for p in range(world)]
    ins, outs = m[rank], [m[q][rank] for q in range(world)]
    x = torch.randn(sum(ins), generator=gen).to(device)
    o = torch.empty(sum(outs), device=device)
    gc.all_to_all_single(o, x, outs, ins, backend="copy_engine")
    ref32 = torch.empty(sum(outs))
    dist.all_to_all_single(ref32, x.cpu(), outs, ins)
    assert torch.equal(o.cpu(), ref32), rows
    x = torch.randn(world * 1_000_000, generator=gen).to(device)
    o = torch.empty(1_000_000, device=device)
    gc.reduce_scatter_tensor(o, x, backend="copy_engine")
    r = torch.empty(1_000_000)
    dist.reduce_scatter_tensor(r, x.cpu())
    torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-5)


def gpu_main(rank: int, world: int, path: str, device: str) -> None:
    torch.cuda.set_device(torch.device(device))
    world_main(rank, world, path, device)
    check_large(rank, world, device)
    _close(rank, world, device)
