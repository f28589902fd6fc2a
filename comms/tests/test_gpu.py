"""Copy-engine path on a GPU: a world of one, and two processes sharing one GPU through the
same CUDA-IPC machinery (staging buffers + IPC events) that peers on several GPUs use."""

import pytest
import torch

import gem_comms as gc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32])
def test_world_of_one_cuda(dtype: torch.dtype) -> None:
    dev = torch.device("cuda")
    x = (torch.randn(8 * 1024 * 1024, device=dev) * 100).to(dtype)
    assert gc.resolve_backend(x) == "copy_engine"
    out = torch.empty_like(x)
    gc.all_gather_into_tensor(out, x, backend="copy_engine")
    assert torch.equal(out, x)
    out2 = torch.empty((x.numel() // 4, 4), dtype=dtype, device=dev)
    h = gc.all_to_all_single(out2, x.view(-1, 4), async_op=True, backend="copy_engine")
    assert h is not None
    h.wait(timeout=30)
    assert torch.equal(out2.view(-1), x)
    out3 = torch.empty_like(x)
    gc.reduce_scatter_tensor(out3, x, backend="copy_engine")
    assert torch.equal(out3, x)


def test_stream_order_and_buffer_lifetime() -> None:
    dev = torch.device("cuda")
    n = 64 * 1024 * 1024
    for _ in range(3):
        x = torch.empty(n, device=dev)
        torch.cuda._sleep(20_000_000)  # the producer is slow: the side stream must wait for it
        x.fill_(3.0)
        out = torch.zeros(n, device=dev)
        h = gc.all_gather_into_tensor(out, x, async_op=True, backend="copy_engine")
        assert h is not None
        del x  # record_stream keeps the block out of the allocator until the copy is done
        junk = [torch.full((n,), -1.0, device=dev) for _ in range(3)]
        h.wait(timeout=60)
        assert bool((out == 3.0).all()), "copy raced with its producer or with a reuse of input"
        del junk
    assert h.is_completed()


def test_two_processes_one_gpu_ipc() -> None:
    from _workers import gpu_main, launch

    launch(gpu_main, 2, "cuda:0")
