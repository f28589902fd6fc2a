"""Single process: argument validation and the world-of-one path (no process group)."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import gem_comms as gc


def test_version_and_api() -> None:
    assert gc.__version__ == "0.2.1"
    assert set(gc.BACKENDS) == {"auto", "copy_engine", "nccl", "gloo"}
    assert len(gc.__all__) <= 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("async_op", [False, True])
def test_world_of_one_matches_identity(dtype: torch.dtype, async_op: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 17):
        x = (torch.randn((n, 3), generator=gen) * 50).to(dtype)
        assert gc.resolve_backend(x) == "copy_engine"
        out = torch.empty_like(x)
        h = gc.all_gather_into_tensor(out, x, async_op=async_op)
        if async_op:
            assert h is not None and h.backend == "copy_engine"
            assert h.wait(timeout=5) and h.is_completed()
        assert torch.equal(out, x)
        out2 = torch.empty_like(x)
        h = gc.all_to_all_single(out2, x, [n], [n], async_op=async_op)
        if h is not None:
            h.wait()
        assert torch.equal(out2, x)
        if dtype != torch.bool:
            out3 = torch.empty_like(x)
            h = gc.reduce_scatter_tensor(out3, x, dist.ReduceOp.MAX, async_op=async_op)
            if h is not None:
                h.wait(timedelta(seconds=5))
            assert torch.equal(out3, x)


def test_all_gather_in_place_world_of_one() -> None:
    out = torch.arange(6.0)
    gc.all_gather_into_tensor(out, out[:6])
    assert torch.equal(out, torch.arange(6.0))


def test_validation_names_the_argument() -> None:
    x = torch.ones(4)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        gc.all_gather_into_tensor(torch.empty(4), [1, 2, 3, 4])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="output must be a torch.Tensor"):
        gc.all_to_all_single(None, x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"output.numel\(\)=5 must be world_size \* input.numel\(\)"):
        gc.all_gather_into_tensor(torch.empty(5), x)
    with pytest.raises(ValueError, match="output.dtype"):
        gc.all_gather_into_tensor(torch.empty(4, dtype=torch.float64), x)
    with pytest.raises(ValueError, match="input must be contiguous"):
        gc.all_gather_into_tensor(torch.empty(2), torch.ones(2, 2).t()[0])
    with pytest.raises(ValueError, match=r"sum\(input_split_sizes\)=3 must equal input.shape\[0\]=4"):
        gc.all_to_all_single(torch.empty(4), x, [4], [3])
    with pytest.raises(ValueError, match="input_split_sizes=.* must hold non-negative ints"):
        gc.all_to_all_single(torch.empty(4), x, [4], [-1])
    with pytest.raises(ValueError, match="output_split_sizes has 2 entries"):
        gc.all_to_all_single(torch.empty(4), x, [2, 2], [4])
    with pytest.raises(ValueError, match="agree beyond dim 0"):
        gc.all_to_all_single(torch.empty(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"input.numel\(\)=4 must be world_size \* output.numel\(\)"):
        gc.reduce_scatter_tensor(torch.empty(3), x)
    with pytest.raises(ValueError, match="op="):
        gc.reduce_scatter_tensor(torch.empty(4), x, dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="op=AVG needs a floating dtype"):
        gc.reduce_scatter_tensor(torch.empty(4, dtype=torch.int32), x.int(), dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="backend="):
        gc.all_gather_into_tensor(torch.empty(4), x, backend="mpi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend='nccl' needs CUDA"):
        gc.all_gather_into_tensor(torch.empty(4), x, backend="nccl")
    with pytest.raises(ValueError, match="needs an initialized process group"):
        gc.all_gather_into_tensor(torch.empty(4), x, backend="gloo")
    with pytest.raises(ValueError, match="depth"):
        gc.Prefetcher([x], depth=0)
    h = gc.all_gather_into_tensor(torch.empty(4), x, async_op=True)
    assert h is not None
    with pytest.raises(ValueError, match="timeout"):
        h.wait(timeout=-1)


def test_prefetcher_world_of_one_order() -> None:
    shards = [torch.randn(i + 1, 2) for i in range(4)]
    produced: list[int] = []

    def gen() -> "object":
        for i, s in enumerate(shards):
            produced.append(i)
            yield s

    pf = gc.Prefetcher(gen(), depth=1)  # type: ignore[arg-type]
    for i, full in enumerate(pf):
        assert torch.equal(full, shards[i])
        assert produced == list(range(min(i + 2, 4)))  # lazily pulls exactly one ahead
    assert pf.consumed == 4


def test_lane_layout_covers_every_chunk_without_overlap() -> None:
    # Each lane stages its pieces in its own region: pieces tile each chunk exactly, and the
    # staged pieces of one lane never overlap (the CUDA race this layout prevents).
    from gem_comms import _peer

    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        world = int(torch.randint(1, 6, (1,), generator=gen))
        lanes = int(torch.randint(1, 5, (1,), generator=gen))
        rows = tuple(int(v) for v in torch.randint(0, 5000, (world,), generator=gen))
        whole = bool(torch.rand(1, generator=gen) < 0.3)
        if whole:
            rows = (rows[0],) * world
        plan = _peer.Plan(op="x", dtype="d", row_bytes=int(torch.randint(1, 9, (1,), generator=gen)),
                          send_rows=rows, recv_rows=rows, send_names=("a", "b"), send_whole_input=whole)
        sender = int(torch.randint(0, world, (1,), generator=gen))
        lay = _peer._lane_layout(plan, sender, lanes)
        for q in range(world):
            n = rows[q] * plan.row_bytes
            cuts = [lay.pieces[j][q][:2] for j in range(lanes)]
            assert cuts[0][0] == 0 and cuts[-1][1] == n
            assert all(cuts[j][1] == cuts[j + 1][0] for j in range(lanes - 1))
            assert all(a % 256 == 0 for a, _ in cuts[1:] if a != n)
        for j in range(lanes):
            staged = sorted((at, at + b - a) for q, (a, b, at) in enumerate(lay.pieces[j])
                            if q != sender and b > a and (not whole or q == (sender + 1) % world))
            assert all(e1 <= s2 for (_, e1), (s2, _) in zip(staged, staged[1:]))
            assert all(e <= lay.lane_bytes[j] for _, e in staged)


def test_auto_moves_small_all_gathers_through_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` on CUDA, 2 ranks on one host with peer access: all-gathers under auto_min_bytes
    per rank go through NCCL (the copy-engine path is host-bound there), larger ones through
    copy engines; reductions stay on NCCL; a world of one always copies locally."""
    from gem_comms import _api, _peer

    class OneHost:
        one_host = peer_access = True

    monkeypatch.setattr(_api, "_device", lambda t: torch.device("cuda", 0))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    world = [2]
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world[0])
    monkeypatch.setattr(_peer, "get_peer_group", lambda *a: OneHost())
    x = torch.empty(1)
    limit = _peer._config.auto_min_bytes
    assert limit == 64 << 20
    assert gc.resolve_backend(x) == "copy_engine"  # no size: the group's transport
    for nbytes, expect in ((0, "nccl"), (1, "nccl"), (limit - 1, "nccl"), (limit, "copy_engine"),
                           (limit + 1, "copy_engine")):
        assert gc.resolve_backend(x, nbytes=nbytes) == expect, nbytes
        assert gc.resolve_backend(x, backend="copy_engine", nbytes=nbytes) == "copy_engine"
    assert gc.resolve_backend(x, reduction=True, nbytes=limit) == "nccl"
    keep = _peer._config
    try:
        _peer.configure(auto_min_bytes=0)
        assert gc.resolve_backend(x, nbytes=1) == "copy_engine"
    finally:
        _peer._config = keep
    world[0] = 1
    assert gc.resolve_backend(x, nbytes=1) == "copy_engine"
    with pytest.raises(ValueError, match="auto_min_bytes=-1 must be a non-negative int"):
        _peer.configure(auto_min_bytes=-1)


def test_configure_and_driver_errors_are_clear() -> None:
    from gem_comms import _cuda, _peer

    with pytest.raises(ValueError, match="lanes=0 must be an int in"):
        _peer.configure(lanes=0)
    with pytest.raises(ValueError, match="lane_min_bytes=-1"):
        _peer.configure(lane_min_bytes=-1)
    with pytest.raises(ValueError, match="signal='pull' must be one of"):
        _peer.configure(signal="pull")
    assert _peer.configure() == _peer.Config()
    if not torch.cuda.is_available():
        try:
            _cuda._load()
        except RuntimeError as e:
            assert "libcuda.so.1" in str(e)
