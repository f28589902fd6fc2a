"""JaggedLoader: balanced, prefetching, resumable loading of jagged batches.

A source is a sequence of *blocks* (synthetic blocks or Parquet row groups) with cheap
`lengths(b)` and `read(b)`. Each global step takes the next n blocks of the epoch's order
(n = world_size * blocks_per_batch, or enough blocks for world_size * tokens_per_batch
tokens), every rank computes the same plan from the lengths (base-batch shuffling, no
communication) and materialises only its own blocks. The loader's position is the global
(epoch, cursor) in that order: plain ints, independent of world size, restored exactly by
`load_state_dict`.

Threads: one planner thread computes plans and submits them to `num_workers` worker threads
(numpy, pyarrow and pinning release the GIL); a bounded queue holds `prefetch` batches. On
CUDA, batches are pinned by the workers, copied on a side stream with non_blocking=True one
batch ahead, and `record_stream`-ed on the consumer's stream.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import queue
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from gem_data._balance import CostFn, attention_cost, shuffle_base_batches
from gem_data._batch import Batch
from gem_data._host import HostBatch

_STATE_VERSION = 1


class Source(Protocol):
    """What the loader reads: blocks 0..num_blocks-1 (num_blocks None = endless)."""

    @property
    def num_blocks(self) -> int | None: ...

    def lengths(self, b: int) -> np.ndarray: ...

    def read(self, b: int) -> HostBatch | None: ...


@dataclasses.dataclass(frozen=True)
class _Plan:
    step: int
    epoch: int
    cursor: int  # position in the epoch after this step
    blocks: tuple[int, ...]  # this rank's block ids


_END = object()


class JaggedLoader:
    """Iterates `Batch`es of a source for one rank, balanced by attention cost across ranks.

    Args:
        source: a SyntheticSource, ParquetSource or anything with num_blocks/lengths/read.
        blocks_per_batch: blocks per rank per step (a step takes world_size * this blocks).
        tokens_per_batch: instead of blocks_per_batch: a step takes consecutive blocks until
            it holds world_size * tokens_per_batch tokens (rounded up to a multiple of
            world_size blocks): token-budget batching.
        rank, world_size: this process's place; all ranks must use the same other arguments.
        balance: base-batch shuffling by `cost_fn` (True) or contiguous blocks per rank.
        cost_fn: per-sample cost from lengths (default len², `attention_cost`).
        shuffle: permute the block order every epoch (seeded by `seed` and the epoch).
        seed: shuffle seed.
        num_epochs: passes over a finite source (None = endless); ignored for endless sources.
        num_workers: worker threads materialising batches (>= 1).
        prefetch: batches kept ready ahead of the consumer (>= 1).
        device: where batches are returned (None = CPU). On CUDA: pinned memory and async copy.
        sparse_kind: "auto" (KeyedJaggedTensor if torchrec imports), "kjt" or "native".

    Iterating (again) continues from the current position; `close()` stops the threads.

    Example:
        loader = JaggedLoader(SyntheticSource(cfg, block_size=8), blocks_per_batch=4,
                              rank=rank, world_size=world, device="cuda")
        for batch in loader: ...
        state = loader.state_dict()   # later: loader.load_state_dict(state) resumes exactly
    """

    def __init__(self, source: Source, *, blocks_per_batch: int | None = 1, tokens_per_batch: int | None = None,
                 rank: int = 0, world_size: int = 1, balance: bool = True, cost_fn: CostFn = attention_cost,
                 shuffle: bool = False, seed: int = 0, num_epochs: int | None = 1, num_workers: int = 1,
                 prefetch: int = 2, device: torch.device | str | None = None, sparse_kind: str = "auto") -> None:
        for name in ("num_blocks", "lengths", "read"):
            if not hasattr(source, name):
                raise TypeError(f"source must have .{name} (a SyntheticSource/ParquetSource), got {type(source).__name__}")
        if tokens_per_batch is not None:
            if tokens_per_batch < 1:
                raise ValueError(f"{tokens_per_batch=} must be >= 1")
            blocks_per_batch = None
        elif blocks_per_batch is None or blocks_per_batch < 1:
            raise ValueError(f"{blocks_per_batch=} must be >= 1 (or give tokens_per_batch)")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got {rank=} {world_size=}")
        if num_workers < 1 or prefetch < 1:
            raise ValueError(f"{num_workers=} and {prefetch=} must be >= 1")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"{num_epochs=} must be >= 1 or None")
        if sparse_kind not in ("auto", "kjt", "native"):
            raise ValueError(f"{sparse_kind=} must be 'auto', 'kjt' or 'native'")
        self.source = source
        self.blocks_per_batch = blocks_per_batch
        self.tokens_per_batch = tokens_per_batch
        self.rank, self.world_size = rank, world_size
        self.balance, self.cost_fn = balance, cost_fn
        self.shuffle, self.seed, self.num_epochs = shuffle, seed, num_epochs
        self.num_workers, self.prefetch = num_workers, prefetch
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.sparse_kind = sparse_kind
        n = source.num_blocks
        if n is not None and blocks_per_batch is not None and n < world_size * blocks_per_batch:
            raise ValueError(f"source has {n} blocks, fewer than world_size*blocks_per_batch="
                             f"{world_size * blocks_per_batch}: not one step")
        self._epoch, self._cursor, self._step = 0, 0, 0
        self._pipe: _Pipeline | None = None
        self._staged: tuple[Batch, _Plan, torch.cuda.Event | None] | None = None
        self._copy_stream: torch.cuda.Stream | None = None

    # ---- planning (pure function of the position: the same on every rank) -------------
    def _order(self, epoch: int) -> np.ndarray | None:
        n = self.source.num_blocks
        if n is None or not self.shuffle:
            return None
        out: np.ndarray = np.random.default_rng([self.seed, epoch]).permutation(n)
        return out

    def _plans(self, epoch: int, cursor: int, step: int) -> Iterator[_Plan]:
        n_total = self.source.num_blocks
        W = self.world_size
        while self.num_epochs is None or n_total is None or epoch < self.num_epochs:
            order = self._order(epoch)

            def block(i: int) -> int:
                return int(order[i]) if order is not None else i

            while True:
                if self.blocks_per_batch is not None:
                    count = W * self.blocks_per_batch
                    if n_total is not None and cursor + count > n_total:
                        break
                    ids = [block(cursor + j) for j in range(count)]
                    lens = [self.source.lengths(b) for b in ids] if self.balance else None
                else:
                    ids, lens, tokens = [], [], 0
                    budget = W * int(self.tokens_per_batch or 0)
                    while (tokens < budget or len(ids) % W) and (n_total is None or cursor + len(ids) < n_total):
                        b = block(cursor + len(ids))
                        ln = self.source.lengths(b)
                        ids.append(b)
                        lens.append(ln)
                        tokens += int(ln.sum())
                    count = len(ids) - len(ids) % W
                    if count == 0:
                        break
                    ids, lens = ids[:count], lens[:count]
                if self.balance and lens is not None:
                    costs = np.array([float(self.cost_fn(ln).sum()) for ln in lens])
                    mine = shuffle_base_batches(costs, W)[self.rank]
                else:
                    k = count // W
                    mine = list(range(self.rank * k, (self.rank + 1) * k))
                cursor += count
                step += 1
                yield _Plan(step, epoch, cursor, tuple(ids[j] for j in mine))
            if n_total is None:
                return
            epoch, cursor = epoch + 1, 0

    def _materialise(self, plan: _Plan) -> Batch:
        parts = [h for h in (self.source.read(b) for b in plan.blocks) if h is not None]
        if not parts:
            raise RuntimeError(f"step {plan.step}: every block of this rank was skipped as bad data")
        batch = HostBatch.concat(parts).to_batch(self.sparse_kind)
        if self.device.type == "cuda":
            batch = batch.pin_memory()
        return batch

    # ---- iteration -----------------------------------------------------------------------
    def __iter__(self) -> JaggedLoader:
        self.close()
        self._pipe = _Pipeline(self._plans(self._epoch, self._cursor, self._step), self._materialise,
                               self.num_workers, self.prefetch)
        return self

    def __next__(self) -> Batch:
        if self._pipe is None:
            iter(self)
        assert self._pipe is not None
        if self.device.type != "cuda":
            batch, plan = self._pipe.get()
            self._advance(plan)
            return batch
        # CUDA: keep one batch in flight on the copy stream
        if self._staged is None:
            self._staged = self._stage(*self._pipe.get())
        batch, plan, event = self._staged
        try:
            self._staged = self._stage(*self._pipe.get())
        except StopIteration:
            self._staged = None
        consumer = torch.cuda.current_stream(self.device)
        if event is not None:
            consumer.wait_event(event)
        batch.record_stream(consumer)
        self._advance(plan)
        return batch

    def _stage(self, batch: Batch, plan: _Plan) -> tuple[Batch, _Plan, torch.cuda.Event | None]:
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(self._copy_stream):
            dev = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._copy_stream)
        return dev, plan, event

    def _advance(self, plan: _Plan) -> None:
        self._epoch, self._cursor, self._step = plan.epoch, plan.cursor, plan.step

    def close(self) -> None:
        """Stops the background threads (the position is kept)."""
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        self._staged = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch returned: plain ints, world-size independent."""
        return {"version": _STATE_VERSION, "epoch": self._epoch, "cursor": self._cursor, "step": self._step,
                "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state`; the next batch is the one the saved run would have returned next.

        With the same world size and arguments the batches are identical; with another
        world size no block is repeated or skipped (the position counts global blocks).
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')} != {_STATE_VERSION}")
        for key in ("epoch", "cursor", "step"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise ValueError(f"loader state[{key!r}]={state.get(key)!r} must be an int >= 0")
        if state.get("seed") != self.seed or state.get("shuffle") != self.shuffle:
            raise ValueError(f"loader state seed/shuffle {state.get('seed')}/{state.get('shuffle')} != "
                             f"this loader's {self.seed}/{self.shuffle}: the block order would differ")
        self.close()
        self._epoch, self._cursor, self._step = int(state["epoch"]), int(state["cursor"]), int(state["step"])

    @property
    def step(self) -> int:
        """Batches returned so far (global steps)."""
        return self._step


class _Pipeline:
    """Planner thread -> worker pool -> bounded queue of futures, consumed in order."""

    def __init__(self, plans: Iterator[_Plan], work: Any, num_workers: int, prefetch: int) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._pool = cf.ThreadPoolExecutor(num_workers, thread_name_prefix="gem_data_worker")
        self._thread = threading.Thread(target=self._run, args=(plans, work), daemon=True,
                                        name="gem_data_planner")
        self._done = False
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, plans: Iterator[_Plan], work: Any) -> None:
        try:
            for plan in plans:
                if not self._put((plan, self._pool.submit(work, plan))):
                    return
            self._put(_END)
        except BaseException as e:  # surfaces in the consumer
            self._put(e)

    def get(self) -> tuple[Batch, _Plan]:
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        plan, fut = item
        return fut.result(), plan

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock the planner
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
