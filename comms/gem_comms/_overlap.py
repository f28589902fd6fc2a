"""Overlap for the trainer: gather layer i+1's parameters while layer i computes.

FSDP-style training needs each layer's full weights just before its forward. Issuing the
all-gather for the *next* layer(s) before handing out the current one hides the transfer behind
the current layer's compute; with the copy-engine backend that transfer also leaves the SMs to
the compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from gem_comms import _peer
from gem_comms._api import Backend, all_gather_into_tensor
from gem_comms._handle import CommHandle


class Prefetcher:
    """Iterates over gathered shards, keeping `depth` all-gathers in flight ahead of the consumer.

    Example:
        for layer, w in zip(layers, Prefetcher(shards, depth=1)):
            x = layer(x, w)        # w: [world * n, ...]; next layer's gather is in flight

    Args:
        shards: this rank's `[n, ...]` shards in consumption order (any iterable; consumed
            lazily, so shards can be produced on the fly).
        group, backend, timeout: forwarded to `all_gather_into_tensor`.
        depth: how many gathers run ahead of the one being consumed (>= 1).

    Attributes:
        started: gathers issued so far; consumed: gathers handed out so far.
    """

    def __init__(
        self,
        shards: Iterable[torch.Tensor],
        *,
        group: dist.ProcessGroup | None = None,
        backend: Backend = "auto",
        depth: int = 1,
        timeout: float | None = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"{depth=} must be an int >= 1")
        self._shards = shards
        self._group = group
        self._backend: Backend = backend
        self._depth = depth
        self._timeout = timeout
        self._world = _peer.world_of(group)[1]
        self.started = 0
        self.consumed = 0

    def _start(self, shard: torch.Tensor) -> tuple[torch.Tensor, CommHandle]:
        if not isinstance(shard, torch.Tensor) or shard.dim() == 0:
            raise ValueError(f"shard {self.started} must be a tensor with >= 1 dim, got {shard!r}")
        out = shard.new_empty((self._world * shard.shape[0], *shard.shape[1:]))
        handle = all_gather_into_tensor(
            out, shard.contiguous(), self._group, async_op=True, backend=self._backend, timeout=self._timeout
        )
        assert handle is not None
        self.started += 1
        return out, handle

    def __iter__(self) -> Iterator[torch.Tensor]:
        it = iter(self._shards)
        pending: deque[tuple[torch.Tensor, CommHandle]] = deque()

        def refill() -> None:
            while len(pending) < self._depth:
                shard = next(it, None)
                if shard is None:
                    return
                pending.append(self._start(shard))

        refill()
        while pending:
            out, handle = pending.popleft()
            refill()  # the next gathers are issued before this one is handed out
            handle.wait(self._timeout)
            self.consumed += 1
            yield out


def overlap_all_gather(
    shards: Iterable[torch.Tensor],
    *,
    group: dist.ProcessGroup | None = None,
    backend: Backend = "auto",
    depth: int = 1,
    timeout: float | None = None,
) -> Iterator[torch.Tensor]:
    """Functional form of `Prefetcher`: yields each gathered shard, the next ones in flight."""
    return iter(Prefetcher(shards, group=group, backend=backend, depth=depth, timeout=timeout))
