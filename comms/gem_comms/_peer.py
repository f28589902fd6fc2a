"""Copy-engine collectives: peer staging buffers exchanged once, moved by cudaMemcpyAsync.

Why this file exists: NCCL's all-gather / all-to-all kernels occupy SMs (tens of them) for the
whole transfer, which slows the compute that is meant to overlap with it. Within one host,
the same bytes can be moved by the GPU's DMA copy engines instead: each rank owns a staging
buffer that every peer has mapped (CUDA IPC, `torch.multiprocessing.reductions`), and a
collective is a set of `cudaMemcpyAsync` calls on a dedicated side stream (torch's
`Tensor.copy_` of contiguous same-dtype bytes is exactly one `cudaMemcpyAsync`).

Protocol of one collective on rank r (push model, one staging slot):

1. *meta*: all ranks post (op, dtype, row bytes, rows sent to / received from each peer) to
   the store and read everyone's. Mismatches raise `ValueError` on every rank, before any
   transfer; the largest chunk fixes the staging size, grown identically on all ranks.
2. side stream waits for the caller's current stream and for every peer's `D` event (peer
   finished reading its staging area from the previous call), then copies r's chunk for peer
   p into p's staging region r (peer-to-peer copy), and its own chunk straight to the output.
   Records its IPC event `W` (writes done).
3. *barrier* through the store: every rank has now *enqueued* its `W` record.
4. side stream waits every peer's `W`, copies staging region q -> output slice q, records `D`.

`cudaStreamWaitEvent` waits for the most recent *enqueued* record, so the two host
exchanges are what make the event protocol race-free: every wait is enqueued after the record
it targets and before the next one. Host cost: two store round trips per call (tens of
microseconds each on one host), so small messages are cheaper on NCCL.

The same code runs over host shared memory for CPU tensors (copies are then plain memcpy
by the CPU, events are not needed): that is how the protocol is tested on CPU gloo worlds.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from gem_comms._handle import CommHandle

DEFAULT_TIMEOUT_S = 300.0
_MIN_REGION_BYTES = 1 << 20
_generation: dict[str, int] = {}
_groups: dict[tuple[str, str], PeerGroup] = {}


def _group_name(group: dist.ProcessGroup | None) -> str:
    if group is None and not dist.is_initialized():
        return "local"
    pg = group if group is not None else dist.group.WORLD
    assert pg is not None
    return str(pg.group_name)


def world_of(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world_size) of `group`; (0, 1) when no process group is initialized."""
    if group is None and not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def get_peer_group(group: dist.ProcessGroup | None, device: torch.device, timeout: float) -> PeerGroup:
    key = (_group_name(group), device.type)
    pg = _groups.get(key)
    if pg is None:
        pg = PeerGroup(group, device, timeout)
        _groups[key] = pg
    elif pg.device != device:
        raise ValueError(
            f"copy_engine uses one device per process and group: this group was set up on "
            f"{pg.device}, got tensors on {device}"
        )
    pg.timeout = timeout  # per call: the host exchanges of this collective wait this long
    return pg


def release(group: dist.ProcessGroup | None) -> None:
    """Drops this rank's copy-engine state for `group` (all devices); the next call rebuilds it.

    Call it on every rank of the group (e.g. after a TimeoutError left the group inconsistent):
    the rebuilt state uses fresh store keys, so stale keys from the failed call do not matter.
    """
    name = _group_name(group)
    for key in [k for k in _groups if k[0] == name]:
        _groups.pop(key).close()
    _generation[name] = _generation.get(name, 0) + 1


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What this rank sends and receives, in bytes, for one collective."""

    op: str
    dtype: str
    row_bytes: int
    send_rows: list[int]  # rows this rank sends to each rank
    recv_rows: list[int]  # rows this rank receives from each rank
    send_names: tuple[str, str]  # (argument that sets send_rows, argument that sets recv_rows)
    send_whole_input: bool = False  # all-gather: every rank gets the same (whole) input


def _offsets(rows: list[int], row_bytes: int) -> list[int]:
    out, acc = [], 0
    for r in rows:
        out.append(acc)
        acc += r * row_bytes
    return out


class PeerGroup:
    """Per (process group, device type) state: store channel, staging buffers, IPC events."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, timeout: float) -> None:
        self.group = group
        self.device = device
        self.rank, self.world = world_of(group)
        self.timeout = timeout
        self.is_cuda = device.type == "cuda"
        self._seq = 0
        self._old_keys: list[str] = []
        self.store: Store | None = None
        if self.world > 1:
            name = _group_name(group)
            prefix = f"gem_comms/{name}/{_generation.get(name, 0)}/{device.type}"
            self.store = PrefixStore(prefix, dist.distributed_c10d._get_default_store())
        self.region = 0  # bytes per source region of each staging buffer
        self.local: torch.Tensor | None = None
        self.peers: list[torch.Tensor | None] = []
        self.side: torch.cuda.Stream | None = None
        self._w: torch.cuda.Event | None = None  # this rank's "my pushes are written" event
        self._d: torch.cuda.Event | None = None  # this rank's "my staging is read" event
        self._peer_w: list[torch.cuda.Event | None] = []
        self._peer_d: list[torch.cuda.Event | None] = []
        if self.is_cuda:
            with torch.cuda.device(device):
                self.side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        info = {"host": socket.gethostname(), "pid": os.getpid(), "dev": device.index, "access": self._access()}
        infos = self.exchange(info)
        self.hosts = [i["host"] for i in infos]
        self.one_host = len(set(self.hosts)) == 1
        devs = [i["dev"] for i in infos]
        self.peer_access = all(
            devs[a] == devs[b] or (devs[b] is not None and bool(infos[a]["access"][devs[b]]))
            for a in range(self.world)
            for b in range(self.world)
        ) if self.is_cuda else True

    def _access(self) -> list[bool]:
        if not self.is_cuda:
            return []
        me = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return [d == me or torch.cuda.can_device_access_peer(me, d) for d in range(torch.cuda.device_count())]

    # ---- host-side channel ------------------------------------------------------------------
    def exchange(self, obj: Any) -> list[Any]:
        """All-gather of a small picklable object through the store (a host barrier)."""
        if self.world == 1 or self.store is None:
            return [obj]
        seq = self._seq
        self._seq += 1
        keys = [f"{seq}/{q}" for q in range(self.world)]
        self.store.set(keys[self.rank], pickle.dumps(obj))  # type: ignore[arg-type]
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout))
        except RuntimeError as e:
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                missing = [q for q in range(self.world) if not self.store.check([keys[q]])]
                raise TimeoutError(
                    f"gem_comms copy_engine: rank {self.rank} waited timeout={self.timeout} s at "
                    f"step {seq} for ranks {missing} (they did not join this collective)"
                ) from e
            raise
        vals = [pickle.loads(v) for v in self.store.multi_get(keys)]
        # Every peer has posted step seq, so all are done reading step seq-1: drop our old key.
        for k in self._old_keys:
            self.store.delete_key(k)
        self._old_keys = [keys[self.rank]]
        return vals

    # ---- buffers -----------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        """Reallocates and re-exchanges staging buffers; `need` is identical on all ranks."""
        region = max(_MIN_REGION_BYTES, 1 << (need - 1).bit_length())
        if self.side is not None:
            self.side.synchronize()  # nothing in flight touches the old buffers any more
        self.local, self.peers = None, []
        if self.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            with torch.cuda.device(self.device):
                local = torch.empty(self.world * region, dtype=torch.uint8, device=self.device)
                if self._w is None:
                    self._w = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
                    self._d = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
                assert self._d is not None
                shared: Any = (
                    reduce_tensor(local)[1],  # type: ignore[no-untyped-call]
                    self._w.ipc_handle(),  # type: ignore[no-untyped-call]
                    self._d.ipc_handle(),  # type: ignore[no-untyped-call]
                )
        else:
            local = torch.empty(self.world * region, dtype=torch.uint8)
            shared = local.untyped_storage()._share_filename_cpu_()
        infos = self.exchange(shared)
        peers: list[torch.Tensor | None] = []
        peer_w: list[torch.cuda.Event | None] = []
        peer_d: list[torch.cuda.Event | None] = []
        for q, info in enumerate(infos):
            if q == self.rank:
                peers.append(local)
                peer_w.append(None)
                peer_d.append(None)
            elif self.is_cuda:
                from torch.multiprocessing.reductions import rebuild_cuda_tensor

                args, w_handle, d_handle = info
                peers.append(rebuild_cuda_tensor(*args))  # type: ignore[no-untyped-call]
                if not self._peer_w:  # events are exchanged once; buffers on every growth
                    peer_w.append(torch.cuda.Event.from_ipc_handle(self.device, w_handle))  # type: ignore[no-untyped-call]
                    peer_d.append(torch.cuda.Event.from_ipc_handle(self.device, d_handle))  # type: ignore[no-untyped-call]
            else:
                storage = torch.UntypedStorage._new_shared_filename_cpu(*info)
                peers.append(torch.empty(0, dtype=torch.uint8).set_(storage))
                peer_w.append(None)
                peer_d.append(None)
        self.local, self.peers, self.region = local, peers, region
        if not self._peer_w:
            self._peer_w, self._peer_d = peer_w, peer_d

    def close(self) -> None:
        # The last step's key stays in the store (one small key per rank and generation):
        # a peer may not have read it yet, and deleting it could strand that peer.
        if self.side is not None:
            self.side.synchronize()
        self.local, self.peers = None, []
        self._old_keys = []

    # ---- the collective ----------------------------------------------------------------------
    def _agree(self, plan: Plan) -> int:
        """Exchanges plans; raises ValueError on every rank on mismatch. Returns max chunk bytes."""
        plans: list[Plan] = self.exchange(plan)
        send_arg, recv_arg = plan.send_names
        for q, other in enumerate(plans):
            if (other.op, other.dtype, other.row_bytes) != (plan.op, plan.dtype, plan.row_bytes):
                raise ValueError(
                    f"gem_comms {plan.op}: ranks disagree on the call: rank {q} issued "
                    f"{other.op} dtype={other.dtype} row_bytes={other.row_bytes}, rank {self.rank} "
                    f"issued {plan.op} dtype={plan.dtype} row_bytes={plan.row_bytes}"
                )
        for src, a in enumerate(plans):
            for dst, b in enumerate(plans):
                if a.send_rows[dst] != b.recv_rows[src]:
                    raise ValueError(
                        f"gem_comms {plan.op}: rank {src} sends {a.send_rows[dst]} rows to rank {dst} "
                        f"({send_arg}) but rank {dst} expects {b.recv_rows[src]} rows from rank {src} "
                        f"({recv_arg}); no data was transferred"
                    )
        return max((max(p.send_rows, default=0) * p.row_bytes for p in plans), default=0)

    @contextmanager
    def on_side(self) -> Iterator[None]:
        """Makes the side stream current (CUDA); a no-op on CPU."""
        if self.side is None:
            yield
        else:
            with torch.cuda.stream(self.side):
                yield

    def run(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        plan: Plan,
        epilogue: Callable[[], None] | None = None,
        keep: tuple[torch.Tensor, ...] = (),
    ) -> CommHandle:
        """Moves the bytes of `plan` from `input` into `output`; returns the (async) handle."""
        need = self._agree(plan) if self.world > 1 else 0
        if need > self.region:
            self._grow(need)
        src = input.reshape(-1).view(torch.uint8)
        dst = output.reshape(-1).view(torch.uint8)
        rb = plan.row_bytes
        s_off = [0] * self.world if plan.send_whole_input else _offsets(plan.send_rows, rb)
        r_off = _offsets(plan.recv_rows, rb)
        me = self.rank
        side = self.side
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with self.on_side():
            if side is not None:
                for q in range(self.world):
                    ev = self._peer_d[q] if self._peer_d else None
                    if ev is not None:
                        side.wait_event(ev)
            for p in range(self.world):
                n = plan.send_rows[p] * rb
                if n == 0:
                    continue
                chunk = src[s_off[p] : s_off[p] + n]
                if p == me:
                    dst[r_off[me] : r_off[me] + n].copy_(chunk, non_blocking=True)
                else:
                    peer = self.peers[p]
                    assert peer is not None
                    peer[me * self.region : me * self.region + n].copy_(chunk, non_blocking=True)
            if side is not None and self._w is not None:
                self._w.record(side)
        if self.world > 1:
            self.exchange(None)  # barrier: every peer's W record (or CPU write) is enqueued
        with self.on_side():
            for q in range(self.world):
                n = plan.recv_rows[q] * rb
                if q == me:
                    continue
                if side is not None:
                    ev = self._peer_w[q] if self._peer_w else None
                    if ev is not None:
                        side.wait_event(ev)
                if n:
                    assert self.local is not None
                    dst[r_off[q] : r_off[q] + n].copy_(
                        self.local[q * self.region : q * self.region + n], non_blocking=True
                    )
            if side is not None and self._d is not None:
                self._d.record(side)
            if epilogue is not None:
                epilogue()
            if side is None:
                return CommHandle("copy_engine")
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(side)
        for t in (output, input, *keep):
            t.record_stream(side)
        return CommHandle("copy_engine", event=done, device=self.device, keep=(output, input, *keep))
