"""Single process: argument validation and the world-of-one path (no process group)."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import gem_comms as gc


def test_version_and_api() -> None:
    assert gc.__version__ == "0.1.0"
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
