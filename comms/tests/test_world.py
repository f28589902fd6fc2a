"""gem_comms against torch.distributed's own collectives in gloo CPU worlds of 2 and 4."""

import pytest
import torch

from _workers import launch, world_main


@pytest.mark.parametrize("world", [2, 4])
def test_world_matches_torch_distributed(world: int) -> None:
    # all_gather / all_to_all / reduce_scatter x dtypes x backends (gloo, copy_engine over
    # host shared memory, auto), uneven and zero splits, buffer reuse, async handles,
    # errors before transfer, cross-rank mismatch, Prefetcher, timeouts (world 2).
    launch(world_main, world, "cpu")
