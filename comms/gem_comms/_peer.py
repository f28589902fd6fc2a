"""Copy-engine collectives: buffers mapped once, peers pull straight into the destination.

Why this file exists: NCCL's all-gather / all-to-all kernels occupy SMs for the whole
transfer, which slows the compute meant to overlap with it. Within one host the same bytes
can be moved by the GPUs' DMA copy engines: each rank owns a staging buffer and a small
flag array that every peer has mapped (CUDA IPC, opened once per group and kept), and a
collective is a few `cuMemcpyAsync` calls plus stream memory operations (`_cuda.py`).

Protocol of one collective on rank r, per *lane* j (one side stream each; a large chunk is
cut into `lanes` pieces so several copy engines work at once; small calls use one lane):

  A. wait until every peer q has finished reading r's staging piece j from the previous use
     (`free[j][q] >= s-1`, a flag in r's memory that q writes); copy piece j of what r sends
     into r's staging (local DMA); write `ready[j][r] = s` into every peer's flags (the
     write is fenced after the copy); copy r's own piece straight into r's output.
  B. for each peer q: wait `ready[j][q] >= s` (local flag), copy piece j of q's chunk for r
     from q's staging **directly into r's output** (peer-to-peer DMA), write `free[j][r] = s`
     into q's flags.

`s` counts the uses of lane j, identical on all ranks because all ranks issue the same
collectives in the same order. No host round trip happens in the steady state: the
cross-rank plan check runs once per distinct call signature (cached; all-to-all exchanges
its splits every call, since they change), and the staging grows collectively when a newly
agreed signature needs more. Cost per byte received: one P2P copy into the destination plus,
on the sender, one local copy of what it sends (n bytes for all-gather, not world x n).

Where a flag lives (`Config.signal`): "push" writes it into the reader's memory (remote write,
local wait), "poll" into the writer's own memory (local write, remote wait); the indices are
the mirror image of each other (`_where` / `_signal`). Every host-side wait of this file has a
deadline (`synchronize(deadline)`): a lane stuck on a flag that never comes turns into a
TimeoutError and a leaked (never freed) buffer, not a hung process.

The same protocol runs over host shared memory for CPU tensors (flags are shared int32
words, waits spin with a deadline, copies are memcpy): that is how it is tested in CPU gloo
worlds — the flag logic, the offsets and the lanes are the code the GPU runs.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from gem_comms import _cuda
from gem_comms._handle import CommHandle

DEFAULT_TIMEOUT_S = 300.0
_MIN_REGION_BYTES = 1 << 20
_CLOSE_WAIT_S = 10.0  # release_buffers(): how long to wait for this rank's queued copies
_SIGNATURE_CACHE = 4096  # distinct agreed signatures kept per channel (cleared identically)
_generation: dict[str, int] = {}
_groups: dict[tuple[str, str], PeerGroup] = {}
_channels: dict[str, Channel] = {}


@dataclass(frozen=True, kw_only=True)
class Config:
    """Copy-engine tuning, identical on every rank (checked when a group is set up).

    Attributes:
        lanes: side streams a large transfer is split over (copy engines in flight).
        lane_min_bytes: chunks smaller than this use one lane: each lane costs its own driver
            calls from Python, and below this size a call is bound by them, not by the link
            (BENCHMARKS.md: one lane already reaches ~97 % of four at 256 MiB).
        signal: where a flag lives. "push" (default): the writer writes into the reader's
            flags (a remote write), the reader's stream waits on its own memory. "poll": the
            writer writes its own flags, the reader's stream waits on the writer's memory (a
            remote wait). Same protocol, two ways of crossing the link; the multi_gpu bench
            probes both (env GEM_COMMS_SIGNAL sets the default).
        auto_min_bytes: `backend="auto"` moves an all-gather of fewer bytes per rank than
            this through NCCL: below it the copy-engine path is host-bound (a dozen driver
            calls from Python per lane) and NCCL is faster; at and above it copy engines
            match or beat NCCL's bus bandwidth (crossover measured in BENCHMARKS.md).
    """

    lanes: int = 4
    lane_min_bytes: int = 64 << 20
    signal: str = os.environ.get("GEM_COMMS_SIGNAL", "push")
    auto_min_bytes: int = 64 << 20


_config = Config()


SIGNALS = ("push", "poll")


def configure(*, lanes: int | None = None, lane_min_bytes: int | None = None,
              signal: str | None = None, auto_min_bytes: int | None = None) -> Config:
    """Sets the copy-engine tuning for groups set up afterwards (call `release` first)."""
    global _config
    new = Config(lanes=_config.lanes if lanes is None else lanes,
                 lane_min_bytes=_config.lane_min_bytes if lane_min_bytes is None else lane_min_bytes,
                 signal=_config.signal if signal is None else signal,
                 auto_min_bytes=_config.auto_min_bytes if auto_min_bytes is None else auto_min_bytes)
    if isinstance(new.lanes, bool) or not isinstance(new.lanes, int) or not 1 <= new.lanes <= 32:
        raise ValueError(f"lanes={new.lanes!r} must be an int in [1, 32]")
    if not isinstance(new.lane_min_bytes, int) or new.lane_min_bytes < 1:
        raise ValueError(f"lane_min_bytes={new.lane_min_bytes!r} must be a positive int")
    if isinstance(new.auto_min_bytes, bool) or not isinstance(new.auto_min_bytes, int) or new.auto_min_bytes < 0:
        raise ValueError(f"auto_min_bytes={new.auto_min_bytes!r} must be a non-negative int")
    if new.signal not in SIGNALS:
        raise ValueError(f"signal={new.signal!r} must be one of {SIGNALS}")
    _config = new
    return new


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


# ---- plans and their cross-rank check ----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Plan:
    """What this rank sends to and receives from each rank, in rows of `row_bytes`."""

    op: str
    dtype: str
    row_bytes: int
    send_rows: tuple[int, ...]
    recv_rows: tuple[int, ...]
    send_names: tuple[str, str]  # (argument that sets send_rows, argument that sets recv_rows)
    send_whole_input: bool = False  # all-gather: every rank gets the same (whole) input
    symmetric: bool = True  # every rank issues the same plan: agree once per signature

    def key(self) -> tuple[object, ...]:
        return (self.op, self.dtype, self.row_bytes, self.send_rows, self.recv_rows)


def check_plans(plans: list[Plan]) -> None:
    """Raises the same ValueError on every rank if the ranks' plans do not fit together."""
    p0 = plans[0]
    for q, other in enumerate(plans):
        if (other.op, other.dtype, other.row_bytes) != (p0.op, p0.dtype, p0.row_bytes):
            raise ValueError(
                f"gem_comms {p0.op}: ranks disagree on the call: rank 0 issued {p0.op} "
                f"dtype={p0.dtype} row_bytes={p0.row_bytes}, rank {q} issued {other.op} "
                f"dtype={other.dtype} row_bytes={other.row_bytes}; no data was transferred"
            )
    send_arg, recv_arg = p0.send_names
    for src, a in enumerate(plans):
        for dst, b in enumerate(plans):
            if a.send_rows[dst] != b.recv_rows[src]:
                raise ValueError(
                    f"gem_comms {p0.op}: rank {src} sends {a.send_rows[dst]} rows to rank {dst} "
                    f"({send_arg}) but rank {dst} expects {b.recv_rows[src]} rows from rank {src} "
                    f"({recv_arg}); no data was transferred"
                )


class Channel:
    """Host-side all-gather of small objects through the c10d store, plus the signature cache."""

    def __init__(self, group: dist.ProcessGroup | None, kind: str) -> None:
        self.rank, self.world = world_of(group)
        self.store: Store | None = None
        if self.world > 1:
            name = _group_name(group)
            prefix = f"gem_comms/{name}/{_generation.get(name, 0)}/{kind}"
            self.store = PrefixStore(prefix, dist.distributed_c10d._get_default_store())
        self.exchanges = 0  # host round trips so far (the steady state adds none)
        self._old_keys: list[str] = []
        self._agreed: set[tuple[object, ...]] = set()

    def exchange(self, obj: Any, timeout: float) -> list[Any]:
        """Every rank's `obj`, in rank order (a host barrier); TimeoutError names missing ranks."""
        if self.world == 1 or self.store is None:
            return [obj]
        seq = self.exchanges
        self.exchanges += 1
        keys = [f"{seq}/{q}" for q in range(self.world)]
        self.store.set(keys[self.rank], pickle.dumps(obj))  # type: ignore[arg-type]
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
        except RuntimeError as e:
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                missing = [q for q in range(self.world) if not self.store.check([keys[q]])]
                raise TimeoutError(
                    f"gem_comms: rank {self.rank} waited timeout={timeout} s at host exchange {seq} "
                    f"for ranks {missing} (they did not join this collective, or issued a different "
                    "one); call release_buffers() on every rank before reusing the group"
                ) from e
            raise
        vals = [pickle.loads(v) for v in self.store.multi_get(keys)]
        # Every peer has posted step seq, so all are done reading step seq-1: drop our old key.
        for k in self._old_keys:
            self.store.delete_key(k)
        self._old_keys = [keys[self.rank]]
        return vals

    def agree(self, plan: Plan, timeout: float) -> list[Plan]:
        """All ranks' plans, checked. Symmetric plans are exchanged once per signature."""
        if self.world == 1:
            return [plan]
        key = plan.key()
        if plan.symmetric and key in self._agreed:
            return [plan] * self.world
        plans: list[Plan] = self.exchange(plan, timeout)
        check_plans(plans)
        if plan.symmetric:
            if len(self._agreed) >= _SIGNATURE_CACHE:
                self._agreed.clear()  # same calls on every rank, so cleared identically
            self._agreed.add(key)
        return plans


def torch_channel(group: dist.ProcessGroup | None) -> Channel:
    """The signature channel of the NCCL / gloo paths for `group`."""
    name = _group_name(group)
    ch = _channels.get(name)
    if ch is None:
        ch = _channels[name] = Channel(group, "torch")
    return ch


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
    return pg


def release(group: dist.ProcessGroup | None) -> None:
    """Drops this rank's copy-engine state and signature cache for `group`; rebuilt on next use.

    Call it on every rank of the group with no collective in flight (e.g. after a
    TimeoutError): the rebuilt state uses fresh store keys and fresh flags.
    """
    name = _group_name(group)
    for key in [k for k in _groups if k[0] == name]:
        _groups.pop(key).close()
    _channels.pop(name, None)
    _generation[name] = _generation.get(name, 0) + 1


def _offsets(rows: tuple[int, ...], row_bytes: int) -> list[int]:
    out, acc = [], 0
    for r in rows:
        out.append(acc)
        acc += r * row_bytes
    return out


def _piece(n: int, j: int, lanes: int) -> tuple[int, int]:
    """Byte range of lane j's piece of an n-byte chunk (cuts 256-byte aligned)."""

    def cut(i: int) -> int:
        return n if i >= lanes else (n * i // lanes) // 256 * 256

    return cut(j), cut(j + 1)


# ---- the two transports: host shared memory (CPU tests) and CUDA (copy engines) ---------------
Buf = Any  # CPU: a uint8 tensor; CUDA: a device address (int)


class _HostOps:
    """CPU tensors: shared-memory staging, memcpy, spin-waits with a deadline."""

    is_cuda = False

    def __init__(self) -> None:
        self.lanes = 0

    def wrap(self, t: torch.Tensor) -> Buf:
        return t.reshape(-1).view(torch.uint8)

    def alloc(self, nbytes: int, deadline: float) -> tuple[Any, Buf]:
        t = torch.zeros(nbytes, dtype=torch.uint8)
        return t.untyped_storage()._share_filename_cpu_(), t

    def open(self, info: Any) -> Buf:
        storage = torch.UntypedStorage._new_shared_filename_cpu(*info)
        return torch.empty(0, dtype=torch.uint8).set_(storage)

    def close_peer(self, buf: Buf) -> None:
        pass

    def free(self, buf: Buf) -> None:
        pass

    def same(self, a: Buf, a_off: int, b: Buf, b_off: int) -> bool:
        return bool(a.data_ptr() + a_off == b.data_ptr() + b_off)

    def copy(self, dst: Buf, d_off: int, src: Buf, s_off: int, n: int, lane: int) -> None:
        if n:
            dst[d_off : d_off + n].copy_(src[s_off : s_off + n])

    def signal(self, flags: Buf, idx: int, value: int, lane: int) -> None:
        flags.view(torch.int32)[idx] = value

    def wait(self, flags: Buf, idx: int, value: int, lane: int, deadline: float) -> bool:
        words = flags.view(torch.int32)
        pause = 2e-6
        while int(words[idx]) < value:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return True

    def peek(self, flags: Buf, idx: int) -> int:
        return int(flags.view(torch.int32)[idx])

    def begin(self, lanes: int) -> None:
        pass

    def end(self, lanes: int, epilogue: Callable[[], None] | None, keep: tuple[torch.Tensor, ...],
            on_timeout: Callable[[], None]) -> CommHandle:
        if epilogue is not None:
            epilogue()
        return CommHandle("copy_engine")

    def synchronize(self, deadline: float) -> bool:
        return True


class _CudaOps:
    """CUDA tensors: one side stream per lane, driver-level DMA copies and flag operations."""

    is_cuda = True

    def __init__(self, device: torch.device, lanes: int) -> None:
        self.device = device
        with torch.cuda.device(device):
            self.streams = [torch.cuda.Stream(device) for _ in range(lanes)]  # type: ignore[no-untyped-call]
        self.handles = [int(s.cuda_stream) for s in self.streams]

    def wrap(self, t: torch.Tensor) -> Buf:
        return int(t.data_ptr())

    def alloc(self, nbytes: int, deadline: float) -> tuple[Any, Buf]:
        ptr = _cuda.mem_alloc(nbytes)
        # Zeros land before any peer can see the handle. On a lane stream, waited for with a
        # deadline: a device-wide synchronize would also wait for every other stream (NCCL,
        # compute, a lane stuck on a flag) and could hang where this has no reason to.
        _cuda.memset32_async(ptr, 0, max(nbytes, 4) // 4, self.handles[0])
        if not self.synchronize(deadline, lanes=1):
            raise TimeoutError("gem_comms copy_engine: zero-filling a new buffer did not finish "
                               "(lane 0 is stuck on an earlier collective)")
        return _cuda.ipc_handle(ptr), ptr

    def open(self, info: Any) -> Buf:
        return _cuda.ipc_open(info)

    def close_peer(self, buf: Buf) -> None:
        _cuda.ipc_close(buf)

    def free(self, buf: Buf) -> None:
        _cuda.mem_free(buf)

    def same(self, a: Buf, a_off: int, b: Buf, b_off: int) -> bool:
        return bool(a + a_off == b + b_off)

    def copy(self, dst: Buf, d_off: int, src: Buf, s_off: int, n: int, lane: int) -> None:
        _cuda.copy(dst + d_off, src + s_off, n, self.handles[lane])

    def signal(self, flags: Buf, idx: int, value: int, lane: int) -> None:
        _cuda.write_flag(flags + 4 * idx, value, self.handles[lane])

    def wait(self, flags: Buf, idx: int, value: int, lane: int, deadline: float) -> bool:
        _cuda.wait_flag(flags + 4 * idx, value, self.handles[lane])  # the GPU waits, not the host
        return True

    def peek(self, flags: Buf, idx: int) -> int:
        raise NotImplementedError  # never needed: CUDA waits cannot time out on the host

    def begin(self, lanes: int) -> None:
        start = torch.cuda.Event()  # type: ignore[no-untyped-call]
        start.record(torch.cuda.current_stream(self.device))
        for s in self.streams[:lanes]:
            s.wait_event(start)  # inputs produced, outputs free (one event for every lane)

    def end(self, lanes: int, epilogue: Callable[[], None] | None, keep: tuple[torch.Tensor, ...],
            on_timeout: Callable[[], None]) -> CommHandle:
        s0 = self.streams[0]
        with torch.cuda.stream(s0):
            for s in self.streams[1:lanes]:
                s0.wait_stream(s)
            if epilogue is not None:
                epilogue()  # e.g. the reduce-scatter sum: an SM kernel, after the copies
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(s0)
        for t in keep:
            # The allocator keeps the blocks until the copies are done: lane 0 waited for every
            # other lane above, so its later work follows all of them.
            t.record_stream(s0)
        return CommHandle("copy_engine", event=done, device=self.device, keep=keep, on_timeout=on_timeout)

    def synchronize(self, deadline: float, lanes: int | None = None) -> bool:
        """Waits (polling, until `deadline`) for the work queued on the lane streams; False if
        it did not finish (a lane waits on a flag no peer will write: never block on that)."""
        events = []
        for s in self.streams[:lanes]:
            e = torch.cuda.Event()  # type: ignore[no-untyped-call]
            e.record(s)
            events.append(e)
        pause = 1e-5
        while not all(e.query() for e in events):  # type: ignore[no-untyped-call]
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-2)
        return True


class PeerGroup:
    """Per (process group, device type) state: channel, mapped staging and flags, lane counters."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, timeout: float) -> None:
        self.device = device
        self.rank, self.world = world_of(group)
        self.cfg = _config
        if self.cfg.signal not in SIGNALS:
            raise ValueError(f"gem_comms copy_engine: signal={self.cfg.signal!r} (GEM_COMMS_SIGNAL) "
                             f"must be one of {SIGNALS}")
        self.channel = Channel(group, device.type)
        self.ops: _HostOps | _CudaOps = _CudaOps(device, self.cfg.lanes) if device.type == "cuda" else _HostOps()
        self.is_cuda = device.type == "cuda"
        info = {"host": socket.gethostname(), "pid": os.getpid(), "dev": device.index,
                "access": self._access(), "cfg": self.cfg}
        infos = self.channel.exchange(info, timeout)
        cfgs = [i["cfg"] for i in infos]
        if any(c != cfgs[0] for c in cfgs):
            raise ValueError(f"gem_comms copy_engine: ranks were configured differently: {cfgs}")
        self.hosts = [i["host"] for i in infos]
        self.one_host = len(set(self.hosts)) == 1
        devs = [i["dev"] for i in infos]
        self.peer_access = all(
            devs[a] == devs[b] or (devs[b] is not None and bool(infos[a]["access"][devs[b]]))
            for a in range(self.world)
            for b in range(self.world)
        ) if self.is_cuda else True
        self.lane_bytes = 0  # staging bytes per lane (identical on all ranks)
        self.local: Buf = None  # this rank's staging
        self.peers: list[Buf] = []  # every rank's staging, mapped here (own at index rank)
        self.flags: Buf = None  # this rank's flags: ready[lane][q], then free[lane][q]
        self.peer_flags: list[Buf] = []
        self._seq = [0] * self.cfg.lanes
        self._layouts: dict[tuple[object, ...], list[_Layout]] = {}
        self.timed_out = False

    def _access(self) -> list[bool]:
        if not self.is_cuda:
            return []
        me = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return [d == me or torch.cuda.can_device_access_peer(me, d) for d in range(torch.cuda.device_count())]

    def _ctx(self) -> Any:
        return torch.cuda.device(self.device) if self.is_cuda else _Null()

    # ---- buffers (collective; the sizes are identical on every rank) --------------------------
    def _setup_flags(self, timeout: float) -> None:
        words = 2 * self.cfg.lanes * self.world
        info, self.flags = self.ops.alloc(4 * words, time.monotonic() + timeout)
        infos = self.channel.exchange(info, timeout)
        self.peer_flags = [self.flags if q == self.rank else self.ops.open(i) for q, i in enumerate(infos)]

    def _grow(self, need: int, timeout: float) -> None:
        """Staging of `lanes` regions of >= `need` bytes (a power of two >= 1 MiB) per rank."""
        lane_bytes = max(_MIN_REGION_BYTES, 1 << (need - 1).bit_length())
        deadline = time.monotonic() + timeout
        # My stagings and my pulls from peers' old staging are done (bounded: never hang here).
        if not self.ops.synchronize(deadline):
            self.timed_out = True
            raise TimeoutError(
                f"gem_comms copy_engine: rank {self.rank}'s earlier collectives did not finish within "
                f"timeout={timeout} s (a peer did not join them); call release_buffers() on every rank")
        info, local = self.ops.alloc(self.cfg.lanes * lane_bytes, deadline)
        infos = self.channel.exchange(info, timeout)
        for q, buf in enumerate(self.peers):
            if q != self.rank and buf is not None:
                self.ops.close_peer(buf)
        self.peers = [local if q == self.rank else self.ops.open(i) for q, i in enumerate(infos)]
        self.channel.exchange(None, timeout)  # every peer has closed my old staging
        if self.local is not None:
            self.ops.free(self.local)
        self.local, self.lane_bytes = local, lane_bytes

    def close(self) -> None:
        """Frees this rank's buffers and unmaps the peers' (collective: `release` runs it on
        every rank). Each rank first waits for its own queued copies, then the ranks meet
        (store, deadline): only then has every peer finished pulling from my staging and
        writing my flags, so nothing is unmapped or freed under a peer's copy. A rank that
        timed out, a lane that will not finish, or a peer that does not come: everyone leaks
        the buffers (a stream or a peer may still use them) instead of hanging or freeing."""
        with self._ctx():
            done = not self.timed_out and self.ops.synchronize(time.monotonic() + _CLOSE_WAIT_S)
            agreed = [done]
            if self.world > 1 and self.flags is not None:  # buffers are set up collectively
                try:
                    agreed = self.channel.exchange(done, _CLOSE_WAIT_S)
                except (TimeoutError, RuntimeError):
                    agreed = [False]
            if all(agreed):
                for q, buf in enumerate(self.peers):
                    if q != self.rank and buf is not None:
                        self.ops.close_peer(buf)
                for q, buf in enumerate(self.peer_flags):
                    if q != self.rank:
                        self.ops.close_peer(buf)
                for buf in (self.local, self.flags):
                    if buf is not None:
                        self.ops.free(buf)
            else:
                self.timed_out = True
        self.local, self.peers, self.flags, self.peer_flags = None, [], None, []

    # ---- the collective ------------------------------------------------------------------------
    def _ready(self, lane: int, q: int) -> int:
        return lane * self.world + q

    def _free(self, lane: int, q: int) -> int:
        return (self.cfg.lanes + lane) * self.world + q

    def _where(self, kind: Callable[[int, int], int], lane: int, q: int) -> tuple[Buf, int]:
        """The flag peer q writes for me: in my flags at q's slot ("push"), or in q's flags at
        my slot ("poll")."""
        if self.cfg.signal == "push":
            return self.flags, kind(lane, q)
        return self.peer_flags[q], kind(lane, self.rank)

    def _signal(self, kind: Callable[[int, int], int], lane: int, q: int, value: int) -> None:
        """Sets the flag I write for peer q (the mirror of `_where`), after the lane's work."""
        if self.cfg.signal == "push":
            self.ops.signal(self.peer_flags[q], kind(lane, self.rank), value, lane)
        else:
            self.ops.signal(self.flags, kind(lane, q), value, lane)

    def _wait_all(self, kind: Callable[[int, int], int], lane: int, peers: list[int], value: int,
                  deadline: float, timeout: float, what: str) -> None:
        for q in peers:
            if not self.ops.wait(*self._where(kind, lane, q), value, lane, deadline):
                missing = [p for p in peers if self.ops.peek(*self._where(kind, lane, p)) < value]
                self.timed_out = True
                raise TimeoutError(
                    f"gem_comms copy_engine: rank {self.rank} waited timeout={timeout} s for ranks "
                    f"{missing} ({what}; they did not join this collective); call "
                    "release_buffers() on every rank before reusing the group"
                )

    def run(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        plan: Plan,
        timeout: float,
        epilogue: Callable[[], None] | None = None,
        keep: tuple[torch.Tensor, ...] = (),
    ) -> CommHandle:
        """Moves the bytes of `plan` from `input` into `output`; returns the (async) handle."""
        if self.timed_out:
            raise RuntimeError("gem_comms copy_engine: this group timed out earlier; call "
                               "release_buffers() on every rank first")
        with self._ctx():
            return self._run(output, input, plan, timeout, epilogue, keep)

    def _run(self, output: torch.Tensor, input: torch.Tensor, plan: Plan, timeout: float,
             epilogue: Callable[[], None] | None, keep: tuple[torch.Tensor, ...]) -> CommHandle:
        plans = self.channel.agree(plan, timeout)
        me, world, rb, ops = self.rank, self.world, plan.row_bytes, self.ops
        peers = [(me + k) % world for k in range(1, world)]  # rotated: spread the pulls
        max_chunk = max(max(p.send_rows) * rb for p in plans)
        lanes = self.cfg.lanes if peers and max_chunk >= self.cfg.lane_min_bytes else 1
        # Where every sender keeps each piece: lane j owns staging bytes [j*lane_bytes, ...),
        # so a lane only ever overwrites what its own `free` flags protect.
        lkey = (lanes, *(p.key() for p in plans))
        layouts = self._layouts.get(lkey)
        if layouts is None:  # pure function of the plans: computed once per signature
            if len(self._layouts) >= _SIGNATURE_CACHE:
                self._layouts.clear()
            layouts = self._layouts[lkey] = [_lane_layout(p, q, lanes) for q, p in enumerate(plans)]
        if peers:
            if self.flags is None:
                self._setup_flags(timeout)
            need = max(max(lay.lane_bytes) for lay in layouts)
            if need > self.lane_bytes or self.local is None:  # identical on every rank
                self._grow(max(need, 1), timeout)
        mine = layouts[me]
        src, dst = ops.wrap(input), ops.wrap(output)
        r_off = _offsets(plan.recv_rows, rb)
        deadline = time.monotonic() + timeout
        ops.begin(lanes)
        for j in range(lanes):
            self._seq[j] += 1
            s = self._seq[j]
            base = j * self.lane_bytes
            # A: stage what I send (once for all-gather), tell the peers, copy my own piece.
            if peers:
                self._wait_all(self._free, j, peers, s - 1, deadline, timeout,
                               "reading my staging from the previous call")
                for q in peers[:1] if plan.send_whole_input else peers:
                    a, b, at = mine.pieces[j][q]
                    ops.copy(self.local, base + at, src, mine.src_off[q] + a, b - a, j)
                for q in peers:
                    self._signal(self._ready, j, q, s)
            a, b, _ = mine.pieces[j][me]
            if b > a and not ops.same(dst, r_off[me] + a, src, mine.src_off[me] + a):
                ops.copy(dst, r_off[me] + a, src, mine.src_off[me] + a, b - a, j)
            # B: pull each peer's piece straight into the output, then release its staging.
            for q in peers:
                self._wait_all(self._ready, j, [q], s, deadline, timeout, "staging their data")
                a, b, at = layouts[q].pieces[j][me]
                ops.copy(dst, r_off[q] + a, self.peers[q], base + at, b - a, j)
                self._signal(self._free, j, q, s)
        return ops.end(lanes, epilogue, (output, input, *keep), self._mark_timed_out)

    def _mark_timed_out(self) -> None:
        self.timed_out = True


@dataclass(frozen=True)
class _Layout:
    src_off: list[int]  # byte offset in the sender's input of its chunk for each rank
    pieces: list[list[tuple[int, int, int]]]  # [lane][dst] -> (start, end) in the chunk, staging offset
    lane_bytes: list[int]  # staging bytes each lane needs


def _lane_layout(plan: Plan, sender: int, lanes: int) -> _Layout:
    """Sender `sender`'s pieces per lane and where they sit in its lane's staging (all-gather
    stages its one input once; its own chunk is never staged)."""
    world, rb = len(plan.send_rows), plan.row_bytes
    src_off = [0] * world if plan.send_whole_input else _offsets(plan.send_rows, rb)
    pieces, lane_bytes = [], []
    for j in range(lanes):
        row, acc = [], 0
        for q in range(world):
            a, b = _piece(plan.send_rows[q] * rb, j, lanes)
            row.append((a, b, 0 if plan.send_whole_input else acc))
            if q != sender and not plan.send_whole_input:
                acc += b - a
        if plan.send_whole_input:
            a, b = _piece(plan.send_rows[0] * rb, j, lanes)
            acc = b - a if world > 1 else 0
        pieces.append(row)
        lane_bytes.append(acc)
    return _Layout(src_off, pieces, lane_bytes)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None
