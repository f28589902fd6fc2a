"""Copy-engine collectives against NCCL on several GPUs of one host: results, bandwidth, and
what each costs a matmul running beside it.

    torchrun --nproc-per-node 2 -m gem_comms.bench.multi_gpu [--quick] [--watchdog S]

One GPU per rank. Stages, each announced per rank on stdout ("rank r: stage X") before it
starts, so a hang names its stage:
  probe     the driver primitives the protocol stands on, one at a time, each with a deadline:
            IPC mapping, a peer-to-peer pull, a flag written into a peer's memory, a stream
            waiting on its own memory for a peer's write ("push", the default) and on a peer's
            memory for the peer's own write ("poll"). The rows after it use a mode that passed;
  all_gather  FSDP sizes (bf16, MiB per rank): copy_engine result == NCCL's, bus bandwidth of
            each (busbw = (world-1)/world x output bytes / time, nccl-tests' rule);
  interference  an 8192^3 bf16 matmul stream alone and beside back-to-back all-gathers
            (the same count on every rank);
  all_to_all  uneven splits (the embedding exchange): result == NCCL's, bandwidth;
  reduce_scatter  copy_engine (copies + one SM sum) close to NCCL's;
  lanes     side streams a transfer is split over, at the largest size;
  host      host time per 4 KiB call, steady state.
Every host wait has a deadline and the ranks agree through the c10d store (not through NCCL,
whose kernels could queue behind a stuck copy-engine stream); the first copy-engine failure
stops the run with its reason. A watchdog (`faulthandler`) prints every thread's stack on
each rank and exits if the whole run outlives `--watchdog` seconds; SIGTERM (e.g. from
`timeout`) prints the stacks too. Rank 0 prints each row as it is measured, a final JSON
line, and rewrites `$OUT/comms_multi_gpu.json` after every stage. Exit 1 if a copy_engine
result differs from NCCL's or a stage failed.

`--device cpu` runs the same stages (no probe, no matmul) in a gloo world with the host
shared-memory copy engine: the CPU test of this bench's own plumbing.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import signal
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import gem_comms as gc
from gem_comms import _cuda, _peer

# FSDP all-gather sizes of the GEM `h200` preset (d_model 1024, ffn_mult 4, 4 layers; comms is
# a leaf, so they are written here): one block ~ 12 d^2 (attention 4 d^2 + FFN 8 d^2) plus the
# interaction / cross arch ~ 4 M parameters ~ 16.8 M bf16 parameters ~ 32 MiB gathered, i.e.
# ~16 MiB per rank on 2 GPUs; the root unit (heads, dense embeddings) a few MiB. 64 and 256 MiB
# per rank are the bandwidth target sizes (>= 64 MiB per rank).
SIZES_MIB = (1.0, 4.0, 16.0, 64.0, 256.0)
QUICK_SIZES_MIB = (1.0, 16.0, 64.0)
CPU_SIZES_MIB = (0.0625, 0.5)


def _line(text: str) -> None:
    """One line to stdout in one write. Every rank shares the pipe, and torchrun's workers run
    unbuffered, where `print` writes the text and its newline separately: another rank's line
    can land between them (a CI run found no line starting with the summary JSON; a local run
    showed a stage line glued to a table row). A single write of a line under PIPE_BUF (4 KiB)
    is never split."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class StageFailed(RuntimeError):
    """A stage could not finish (an error, a mismatch between ranks, or a deadline)."""


class Bench:
    """Per-rank state: device, deadlines, the store the ranks agree through, the results."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, device: torch.device) -> None:
        self.args, self.rank, self.world, self.device = args, rank, world, device
        self.cuda = device.type == "cuda"
        self.quick = bool(args.quick)
        self.wait_s = float(args.stage_timeout)
        self.store = dist.distributed_c10d._get_default_store()
        self._seq = 0
        self.res: dict[str, Any] = {"world": world, "device": str(device), "torch": torch.__version__,
                                    "quick": self.quick, "stages": {}, "ok": None}

    # ---- reporting ------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        _line(f"rank {self.rank}: {msg}")

    def row(self, msg: str) -> None:
        if self.rank == 0:
            _line(msg)

    def save(self) -> None:
        """Rank 0 rewrites $OUT/comms_multi_gpu.json (a hang later still leaves what was measured)."""
        out = os.environ.get("OUT")
        if self.rank != 0 or not out:
            return
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, "comms_multi_gpu.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1, default=str)
        os.replace(tmp, os.path.join(out, "comms_multi_gpu.json"))

    # ---- host-side agreement, never through NCCL -------------------------------------------------
    def agree(self, value: Any, what: str) -> list[Any]:
        """Every rank's `value` (a store round trip with a deadline); StageFailed names who is missing."""
        self._seq += 1
        keys = [f"gem_bench/{self._seq}/{q}" for q in range(self.world)]
        self.store.set(keys[self.rank], json.dumps(value))
        try:
            self.store.wait(keys, timedelta(seconds=self.wait_s))
        except RuntimeError as e:
            missing = [q for q in range(self.world) if not self.store.check([keys[q]])]
            raise StageFailed(f"{what}: ranks {missing} did not arrive within {self.wait_s} s ({e})") from e
        return [json.loads(v) for v in self.store.multi_get(keys)]

    def all_true(self, ok: bool, what: str) -> bool:
        return all(self.agree(bool(ok), what))

    # ---- device waits with a deadline -----------------------------------------------------------
    def sync(self, what: str, stream: Any = None) -> None:
        """Waits for `stream` (default: the current one) by polling an event; StageFailed at the deadline."""
        if not self.cuda:
            return
        e = torch.cuda.Event()  # type: ignore[no-untyped-call]
        e.record(stream)
        self.wait_event(e, what)

    def wait_event(self, e: Any, what: str, limit: float | None = None) -> None:
        limit = self.wait_s if limit is None else limit
        deadline = time.monotonic() + limit
        pause = 1e-5
        while not e.query():
            if time.monotonic() >= deadline:
                raise StageFailed(f"{what}: the GPU did not finish within {limit} s "
                                  "(a stream waits on a flag that never came)")
            time.sleep(pause)
            pause = min(pause * 2, 1e-2)

    def timeit(self, fn: Callable[[], object], iters: int, what: str, reps: int = 3) -> float:
        """Median seconds per call over `reps` windows of `iters` back-to-back calls."""
        fn()
        fn()
        times = []
        for _ in range(reps):
            self.sync(what)
            self.agree(0, what)  # start together
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                for _ in range(iters):
                    fn()
                end.record()
                self.wait_event(end, what)
                times.append(start.elapsed_time(end) / 1e3 / iters)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                times.append((time.perf_counter() - t0) / iters)
        return float(statistics.median(times))

    def ref(self, name: str, *a: Any, **kw: Any) -> None:
        """torch.distributed's own collective (NCCL on CUDA, gloo on CPU): the reference."""
        with warnings.catch_warnings():  # torch 2.13 renames the *_tensor collectives
            warnings.filterwarnings("ignore", category=FutureWarning)
            getattr(dist, name)(*a, **kw)

    def randn(self, *shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(*shape, device=self.device, dtype=dtype, generator=gen)


# ---- stage: the driver primitives, one at a time ------------------------------------------------
def stage_probe(b: Bench) -> dict[str, Any]:
    """Each primitive of the copy-engine protocol between ranks 0 and 1, with a deadline.

    Waits are probed with one waiter at a time (the other rank only writes): two ranks that
    both wait before they write could deadlock on a shared hardware queue, which would be a
    fault of the probe, not of the primitive."""
    lim = min(b.wait_s, 15.0)
    w = b.world
    out: dict[str, Any] = {}
    nbytes = 1 << 20
    with torch.cuda.device(b.device):
        s_main, s_wait, s_sig = (torch.cuda.Stream(b.device) for _ in range(3))  # type: ignore[no-untyped-call]
        buf, flags = _cuda.mem_alloc(nbytes), _cuda.mem_alloc(4 * 4 * w)
        _cuda.memset32_async(buf, b.rank + 1, nbytes // 4, int(s_main.cuda_stream))
        _cuda.memset32_async(flags, 0, 4 * w, int(s_main.cuda_stream))
        b.sync("probe: fill", s_main)
        b.say("probe: buffers allocated")
        handles = b.agree([_cuda.ipc_handle(buf).hex(), _cuda.ipc_handle(flags).hex()], "probe: handles")
        peer_buf: dict[int, int] = {}
        peer_flags: dict[int, int] = {}
        err = ""
        try:
            for q in range(w):
                if q != b.rank:
                    peer_buf[q] = _cuda.ipc_open(bytes.fromhex(handles[q][0]))
                    peer_flags[q] = _cuda.ipc_open(bytes.fromhex(handles[q][1]))
        except RuntimeError as e:
            err = f"{e}"[:300]
        errs = b.agree(err, "probe: ipc_open")
        out["ipc_open"] = True if not any(errs) else "; ".join(f"rank {q}: {m}" for q, m in enumerate(errs) if m)
        if out["ipc_open"] is not True:
            return out
        b.say("probe: peers mapped")
        nxt, prv = (b.rank + 1) % w, (b.rank - 1) % w

        def read_words(addr: int, n: int) -> list[int]:
            t = torch.empty(n, dtype=torch.int32, device=b.device)
            _cuda.copy(int(t.data_ptr()), addr, 4 * n, int(s_main.cuda_stream))
            b.sync("probe: read", s_main)
            return [int(v) for v in t.cpu()]

        # a peer-to-peer pull (what the collective does for every byte)
        t = torch.empty(nbytes // 4, dtype=torch.int32, device=b.device)
        _cuda.copy(int(t.data_ptr()), peer_buf[nxt], nbytes, int(s_main.cuda_stream))
        b.sync("probe: p2p pull", s_main)
        out["p2p_pull"] = b.all_true(bool((t == nxt + 1).all()), "probe: p2p_pull")
        b.say(f"probe: p2p_pull {out['p2p_pull']}")
        # a flag written into a peer's memory by the GPU front end
        _cuda.write_flag(peer_flags[nxt] + 4 * b.rank, 7, int(s_sig.cuda_stream))
        b.sync("probe: remote write", s_sig)
        b.agree(0, "probe: remote write issued")
        out["remote_write"] = b.all_true(read_words(flags, w)[prv] == 7, "probe: remote_write")
        b.say(f"probe: remote_write {out['remote_write']}")

        def wait_test(name: str, waiter: int, wait_addr: int, write_addr: int) -> bool:
            """`waiter`'s stream waits on `wait_addr`; once that is queued, rank 1 - waiter
            writes `write_addr` (the same word, seen from its side)."""
            done = None
            if b.rank == waiter:
                _cuda.wait_flag(wait_addr, 1, int(s_wait.cuda_stream))
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(s_wait)
            b.agree(0, f"probe: {name} wait queued")
            if b.rank == 1 - waiter:
                _cuda.write_flag(write_addr, 1, int(s_sig.cuda_stream))
            ok = True
            if done is not None:
                try:
                    b.wait_event(done, f"probe: {name}", limit=lim)
                except StageFailed:
                    ok = False
                    try:  # release our own stuck stream if the driver lets us
                        _cuda.memset32(wait_addr, 1, 1)
                    except RuntimeError:
                        pass
            return b.all_true(ok, f"probe: {name}")

        # "push" (the default): the waiter polls its own memory, the writer writes into it remotely;
        # "poll": the writer writes its own memory, the waiter polls it remotely.
        for name, region in (("push_wait", 1), ("poll_wait", 2)):
            ok = True
            for waiter in (0, 1):
                writer = 1 - waiter
                if name == "push_wait":
                    wait_addr = flags + 4 * (region * w + writer)
                    write_addr = peer_flags.get(waiter, 0) + 4 * (region * w + writer)
                else:
                    wait_addr = peer_flags.get(writer, 0) + 4 * (region * w + writer)
                    write_addr = flags + 4 * (region * w + writer)
                ok = wait_test(f"{name} (rank {waiter} waits)", waiter, wait_addr, write_addr) and ok
            out[name] = ok
            b.say(f"probe: {name} {ok}")
        b.sync("probe: end", s_sig)
        b.agree(0, "probe: done")  # nobody reads my memory any more
        if not (out["push_wait"] and out["poll_wait"]):
            return out  # a stream may still wait on these flags: leak them, never free under it
        for q in peer_buf:
            _cuda.ipc_close(peer_buf[q])
            _cuda.ipc_close(peer_flags[q])
        b.agree(0, "probe: closed")
        _cuda.mem_free(buf)
        _cuda.mem_free(flags)
    return out


# ---- stages: the collectives against torch.distributed's --------------------------------------
def _busbw(world: int, out_bytes: int, t: float) -> float:
    return (world - 1) / world * out_bytes / 1e9 / t if t > 0 else math.nan


def stage_all_gather(b: Bench) -> list[dict[str, Any]]:
    rows = []
    sizes = CPU_SIZES_MIB if not b.cuda else QUICK_SIZES_MIB if b.quick else SIZES_MIB
    for mib in sizes:
        b.say(f"all_gather {mib} MiB/rank")
        n = int(mib * (1 << 20)) // 2
        x = b.randn(n, dtype=torch.bfloat16, seed=1 + b.rank)
        ref = torch.empty(b.world * n, device=b.device, dtype=torch.bfloat16)
        out = torch.full_like(ref, -1)
        b.ref("all_gather_into_tensor", ref, x)
        gc.all_gather_into_tensor(out, x, backend="copy_engine", timeout=b.wait_s)
        b.sync("all_gather: first call")
        equal = b.all_true(torch.equal(out, ref), f"all_gather {mib}: equal")
        iters = (3 if b.quick else 10) if not b.cuda else max(3, min(20 if b.quick else 50, int(1024 // mib)))
        t_ref = b.timeit(lambda: b.ref("all_gather_into_tensor", ref, x), iters, f"all_gather {mib}: reference")
        t_ce = b.timeit(lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine"), iters,
                        f"all_gather {mib}: copy_engine")
        r = {"mib_per_rank": mib, "equal_to_ref": equal, "ce_ms": t_ce * 1e3, "ref_ms": t_ref * 1e3,
             "ce_busbw_gbs": _busbw(b.world, 2 * b.world * n, t_ce),
             "ref_busbw_gbs": _busbw(b.world, 2 * b.world * n, t_ref)}
        rows.append(r)
        b.row(f"| all_gather (busbw) | {mib:g} MiB/rank | {equal} | {r['ce_busbw_gbs']:.1f} | "
              f"{r['ref_busbw_gbs']:.1f} | {r['ce_busbw_gbs'] / r['ref_busbw_gbs']:.2f} |")
        if not equal:
            raise StageFailed(f"all_gather {mib} MiB: copy_engine result differs from the reference")
    return rows


def stage_all_to_all(b: Bench) -> dict[str, Any]:
    # uneven splits: rank p sends (1 + (p + 2q) % 3) x base rows of 128 bf16 (an embedding row)
    base = (256 if not b.cuda else 8 * 1024 if b.quick else 32 * 1024)
    w = b.world
    m = [[base * (1 + (p + 2 * q) % 3) for q in range(w)] for p in range(w)]
    ins, outs = m[b.rank], [m[q][b.rank] for q in range(w)]
    x = b.randn(sum(ins), 128, dtype=torch.bfloat16, seed=7 + b.rank)
    ref = torch.empty(sum(outs), 128, device=b.device, dtype=torch.bfloat16)
    out = torch.full_like(ref, -1)
    b.ref("all_to_all_single", ref, x, outs, ins)
    gc.all_to_all_single(out, x, outs, ins, backend="copy_engine", timeout=b.wait_s)
    b.sync("all_to_all: first call")
    equal = b.all_true(torch.equal(out, ref), "all_to_all: equal")
    iters = 3 if not b.cuda else 20
    t_ref = b.timeit(lambda: b.ref("all_to_all_single", ref, x, outs, ins), iters, "all_to_all: reference")
    t_ce = b.timeit(lambda: gc.all_to_all_single(out, x, outs, ins, backend="copy_engine"), iters,
                    "all_to_all: copy_engine")
    moved = (sum(ins) - ins[b.rank]) * 128 * 2 / 1e9  # bytes this rank sends to others
    r = {"mib_sent": sum(ins) * 256 / 2**20, "equal_to_ref": equal, "ce_gbs": moved / t_ce,
         "ref_gbs": moved / t_ref, "ce_ms": t_ce * 1e3, "ref_ms": t_ref * 1e3}
    b.row(f"| all_to_all uneven (sent) | {r['mib_sent']:.1f} MiB | {equal} | {r['ce_gbs']:.1f} | "
          f"{r['ref_gbs']:.1f} | {r['ce_gbs'] / r['ref_gbs']:.2f} |")
    if not equal:
        raise StageFailed("all_to_all: copy_engine result differs from the reference")
    return r


def stage_reduce_scatter(b: Bench) -> dict[str, Any]:
    n = (4 << 20) if b.cuda else 4096
    x = b.randn(b.world * n, dtype=torch.float32, seed=11 + b.rank)
    ref = torch.empty(n, device=b.device)
    out = torch.full((n,), -1.0, device=b.device)
    b.ref("reduce_scatter_tensor", ref, x)
    gc.reduce_scatter_tensor(out, x, backend="copy_engine", timeout=b.wait_s)
    b.sync("reduce_scatter: first call")
    close = b.all_true(torch.allclose(out, ref, rtol=1e-5, atol=1e-5), "reduce_scatter: close")
    b.row(f"reduce_scatter f32 {n * 4 / 2**20:g} MiB copy_engine close to the reference: {close}")
    if not close:
        raise StageFailed("reduce_scatter: copy_engine result is not close to the reference")
    return {"mib": n * 4 / 2**20, "close_to_ref": close}


def stage_lanes(b: Bench) -> list[dict[str, Any]]:
    mib = (0.5 if not b.cuda else 64.0 if b.quick else 256.0)
    n = int(mib * (1 << 20)) // 2
    x = b.randn(n, dtype=torch.bfloat16, seed=3 + b.rank)
    out = torch.empty(b.world * n, device=b.device, dtype=torch.bfloat16)
    rows = []
    keep = _peer._config
    for lanes in ((1, 4) if b.quick else (1, 2, 4, 8)):
        b.say(f"lanes {lanes}")
        gc.release_buffers()
        _peer.configure(lanes=lanes)
        t = b.timeit(lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine"), 3 if b.quick else 10,
                     f"lanes {lanes}")
        rows.append({"lanes": lanes, "mib_per_rank": mib, "ce_busbw_gbs": _busbw(b.world, 2 * b.world * n, t)})
    gc.release_buffers()
    _peer.configure(lanes=keep.lanes, lane_min_bytes=keep.lane_min_bytes, signal=keep.signal)
    b.row("lanes sweep (%g MiB/rank): " % mib + ", ".join(f"{r['lanes']}: {r['ce_busbw_gbs']:.1f} GB/s" for r in rows))
    return rows


def stage_host(b: Bench) -> dict[str, Any]:
    """Host time per 4 KiB call, steady state (no store round trip is left in it)."""
    x = torch.ones(1024, device=b.device)
    out = torch.empty(b.world * 1024, device=b.device)
    res: dict[str, Any] = {}
    calls = 50 if b.quick else 200
    calls_by_name: list[tuple[str, Callable[[], object]]] = [
        ("ce_us", lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine")),
        ("ref_us", lambda: b.ref("all_gather_into_tensor", out, x))]
    for name, fn in calls_by_name:
        fn()
        b.sync(f"host {name}")
        b.agree(0, f"host {name}")
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        res[name] = (time.perf_counter() - t0) / calls * 1e6
        b.sync(f"host {name} end")
    b.row(f"host us/call (4 KiB): copy_engine {res['ce_us']:.1f}, reference {res['ref_us']:.1f}")
    return res


def window_count(b: Bench, alone_s: float, one_s: float) -> int:
    """Collectives to issue beside the matmul window: one before it starts and enough to cover
    it (1.3x its time), **the same on every rank** (the largest any rank asks for).

    Each rank times its own matmul and its own collective, so a count computed locally differs
    between ranks; with copy engines the rank that issued more collectives then waits on GPU
    flags for calls its peer never made (how the stage hung on 2 H200, BENCHMARKS.md)."""
    mine = max(2, 1 + math.ceil(1.3 * alone_s / one_s)) if one_s > 0 else 2
    return int(max(b.agree(mine, "interference: count")))


def stage_interference(b: Bench) -> list[dict[str, Any]]:
    """Matmul TFLOP/s alone and while back-to-back all-gathers run beside it on another stream.

    Every rank issues the same collectives (`window_count`). On CPU (the plumbing test) the
    "streams" are the host: the collectives run before the matmuls, so its slowdown means
    nothing, but the per-rank counts and the copy-engine flags are the GPU run's."""
    size = 8192 if b.cuda else 256
    mm_iters, windows = (20 if b.quick else 60), (1 if b.quick else 3)
    a = torch.randn(size, size, device=b.device, dtype=torch.bfloat16)
    bm = torch.randn(size, size, device=b.device, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    n = ((64 if b.quick else 256) << 20) // 2 if b.cuda else (256 << 10) // 2
    x = torch.randn(n, device=b.device, dtype=torch.bfloat16)
    out = torch.empty(b.world * n, device=b.device, dtype=torch.bfloat16)
    flops = 2 * size**3 * mm_iters

    def window_cpu(comm: Callable[[], object] | None, count: int) -> tuple[float, float, bool]:
        b.agree(0, "interference: window")
        t0 = time.perf_counter()
        if comm is not None:
            for _ in range(count):
                comm()
        t_comm = time.perf_counter() - t0
        for _ in range(mm_iters):
            torch.mm(a, bm, out=c)
        _stall("interference_matmul", b.rank)
        return time.perf_counter() - t0 - t_comm, t_comm, True

    def window_cuda(comm: Callable[[], object] | None, count: int) -> tuple[float, float, bool]:
        """The matmuls start once the first collective is done (the rest are then queued
        behind it) and are timed from their own start: a copy-engine call costs ~0.1 ms of
        host time, so timing from a common start would charge the matmul with the host's
        time to queue the collectives, not with their interference."""
        b.sync("interference: before window")
        b.agree(0, "interference: window")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]  # type: ignore[no-untyped-call]
        e0, e_mm0, e_mm, e_comm = ev
        e0.record()
        mm_s.wait_event(e0)
        comm_s.wait_event(e0)
        if comm is not None:
            with torch.cuda.stream(comm_s):
                comm()
                first = torch.cuda.Event()  # type: ignore[no-untyped-call]
                first.record()
            mm_s.wait_event(first)
        with torch.cuda.stream(mm_s):
            e_mm0.record()
            for _ in range(mm_iters):
                torch.mm(a, bm, out=c)
            e_mm.record()
        if comm is not None:
            with torch.cuda.stream(comm_s):
                for _ in range(count - 1):
                    comm()
                e_comm.record()
        b.wait_event(e_mm, "interference: matmul")
        if comm is not None:
            b.wait_event(e_comm, f"interference: {count} collectives")
        # the next window's (or stage's) work on the default stream comes after both
        torch.cuda.current_stream().wait_stream(mm_s)
        torch.cuda.current_stream().wait_stream(comm_s)
        t_mm = e_mm0.elapsed_time(e_mm) / 1e3
        if comm is None:
            return t_mm, 0.0, True
        t_comm = e0.elapsed_time(e_comm) / 1e3
        return t_mm, t_comm, e0.elapsed_time(e_comm) >= e0.elapsed_time(e_mm)

    if b.cuda:
        mm_s, comm_s = torch.cuda.Stream(), torch.cuda.Stream()  # type: ignore[no-untyped-call]
    window = window_cuda if b.cuda else window_cpu
    window(None, 0)  # warm-up (cuBLAS set-up, clocks): --quick times a single window
    alone = statistics.median(window(None, 0)[0] for _ in range(windows))
    rows: list[dict[str, Any]] = [{"scenario": "matmul alone", "tflops": flops / alone / 1e12, "slowdown_pct": 0.0}]
    b.row(f"| matmul alone | {rows[0]['tflops']:.1f} | - | - | - |")
    for name, fn in (("beside copy_engine all-gather", lambda: gc.all_gather_into_tensor(out, x, backend="copy_engine")),
                     ("beside NCCL all-gather" if b.cuda else "beside gloo all-gather",
                      lambda: b.ref("all_gather_into_tensor", out, x))):
        b.say(f"interference {name}")
        t_one = b.timeit(fn, 5, f"interference {name}", reps=1)
        count = window_count(b, alone, t_one)
        runs = [window(fn, count) for _ in range(windows)]
        t_mm = statistics.median(r[0] for r in runs)
        t_comm = statistics.median(r[1] for r in runs)
        r = {"scenario": name, "tflops": flops / t_mm / 1e12, "slowdown_pct": 100 * (t_mm / alone - 1),
             "covered": all(r[2] for r in runs), "count": count,
             "comm_busbw_during_gbs": _busbw(b.world, 2 * b.world * n * count, t_comm)}
        rows.append(r)
        b.row(f"| {name} | {r['tflops']:.1f} | {r['slowdown_pct']:.1f} % | {r['covered']} | "
              f"{r['comm_busbw_during_gbs']:.1f} |")
    return rows


# ---- driver ---------------------------------------------------------------------------------------
def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="three sizes, fewer iterations (< 60 s on 2 H200)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same stages in a gloo world (host shared-memory copy engine)")
    ap.add_argument("--watchdog", type=float, default=None,
                    help="seconds before every rank prints its stacks and exits (default 90 quick, 300 full)")
    ap.add_argument("--stage-timeout", type=float, default=30.0,
                    help="deadline of any single host wait (a rank arriving, the GPU finishing)")
    ap.add_argument("--signal-mode", dest="signal", choices=("auto", *_peer.SIGNALS), default="auto",
                    help="copy-engine flag placement; auto: the one the probe found working")
    ap.add_argument("--skip", default="", help="comma-separated stages to leave out")
    return ap.parse_args(argv)


STAGES: tuple[tuple[str, Callable[[Bench], Any], bool], ...] = (
    # (name, function, needs CUDA)
    ("all_gather", stage_all_gather, False),
    ("interference", stage_interference, False),  # the figure still missing, so early
    ("all_to_all", stage_all_to_all, False),
    ("reduce_scatter", stage_reduce_scatter, False),
    ("lanes", stage_lanes, False),
    ("host", stage_host, False),
)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    cuda = args.device == "cuda"
    if "LOCAL_RANK" not in os.environ or (cuda and not torch.cuda.is_available()):
        print("multi_gpu: run under torchrun with one CUDA GPU per rank, e.g. "
              "`torchrun --nproc-per-node 2 -m gem_comms.bench.multi_gpu`; nothing to do here")
        return 0
    watchdog = args.watchdog if args.watchdog is not None else (90.0 if args.quick else 300.0)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # `timeout` shows stacks too
    rank_env = os.environ.get("RANK", "?")
    _line(f"rank {rank_env}: stage init (watchdog {watchdog:.0f} s)")
    if cuda:
        # Before the CUDA context exists: torch's stream pool maps its streams onto this many
        # hardware queues (default 8), and a matmul stream sharing a queue with a copy-engine
        # lane that waits on a flag waits with it, which would time the queue, not the SMs.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    b = Bench(args, rank, world, device)
    t0 = time.monotonic()
    skip = {s for s in args.skip.split(",") if s}
    if cuda:
        b.res.update(connections=os.environ["CUDA_DEVICE_MAX_CONNECTIONS"],
                     gpu=torch.cuda.get_device_name(), nccl=".".join(map(str, torch.cuda.nccl.version())))  # type: ignore[no-untyped-call]
    b.agree(0, "init")
    # started together on every rank (just met at the store): each prints its stacks and exits
    faulthandler.dump_traceback_later(watchdog, exit=True)
    b.say("stage init done")
    ok = True
    try:
        if cuda and world > 1 and "probe" not in skip:
            b.say("stage probe")
            probe = stage_probe(b)
            b.res["stages"]["probe"] = probe
            b.row("probe: " + ", ".join(f"{k} {v}" for k, v in probe.items()))
            b.save()
            modes = [m for m in _peer.SIGNALS if probe.get(f"{m}_wait") is True]
            if args.signal != "auto":
                modes = [args.signal]
            if not (probe.get("ipc_open") is True and probe.get("p2p_pull") is True and modes):
                raise StageFailed(f"probe: a primitive the copy-engine path needs failed: {probe}")
            _peer.configure(signal=modes[0])
        elif args.signal != "auto":
            _peer.configure(signal=args.signal)
        b.res["signal"] = _peer._config.signal
        b.res["auto_picks"] = {f"{mib} MiB/rank all-gather": gc.resolve_backend(  # collective on CUDA
        torch.empty(1, device=device), nbytes=mib << 20) for mib in (16, 64)}
        b.say(f"copy_engine signal mode: {_peer._config.signal}")
        b.row(f"# {b.res.get('gpu', 'cpu')} x{world}, torch {torch.__version__}, "
              f"reference {'NCCL ' + b.res.get('nccl', '') if cuda else 'gloo'}, copy_engine signal {_peer._config.signal}")
        header = ("| collective | size | equal | copy_engine GB/s | reference GB/s | ratio |\n"
                  "|---|---|---|---|---|---|")
        b.row(header)
        for name, fn, needs_cuda in STAGES:
            if name in skip or (needs_cuda and not cuda):
                continue
            b.say(f"stage {name}")
            _stall(name, rank)
            b.agree(0, f"{name}: start")  # a missing rank is named here, not inside a collective
            if name == "interference":
                b.row(f"| matmul {8192 if cuda else 256}^3 bf16 | TFLOP/s | slowdown | covered | comm busbw during |")
                b.row("|---|---|---|---|---|")
            if name == "all_to_all":
                b.row(header)
            b.res["stages"][name] = fn(b)
            b.say(f"stage {name} done")
            b.save()
    except Exception as e:  # reported with its stage; the collectives may be stuck, so no cleanup
        ok = False
        b.res["error"] = f"{type(e).__name__}: {e}"[:1000]
        b.say(f"FAILED: {b.res['error']}")
    b.res["ok"] = ok
    b.res["seconds"] = round(time.monotonic() - t0, 1)
    b.save()
    if rank == 0:
        _line(json.dumps(_summary(b.res)))
    if not ok:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # leave without touching streams that may wait on a flag forever
    b.say("stage release")
    gc.release_buffers()
    b.agree(0, "release")
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
    b.say("done")
    return 0


def _stall(stage: str, rank: int) -> None:
    """Test hook: GEM_COMMS_BENCH_STALL="stage:rank:seconds" makes one rank late for a stage
    (how the CPU test checks the stage deadlines and the watchdog); "interference_matmul"
    slows one rank's matmul windows on CPU, so the ranks measure different windows."""
    spec = os.environ.get("GEM_COMMS_BENCH_STALL", "")
    if spec.count(":") == 2:
        name, r, secs = spec.split(":")
        if name == stage and int(r) == rank:
            time.sleep(float(secs))


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    st = res["stages"]
    big = [r for r in st.get("all_gather", []) if r["mib_per_rank"] >= 64]
    mm = {r["scenario"]: r.get("slowdown_pct") for r in st.get("interference", [])}
    return {"bench": "comms_multi_gpu", "ok": res["ok"], "world": res["world"], "quick": res["quick"],
            "signal": res.get("signal"), "probe": st.get("probe"),
            "ag_ce_over_ref_ge64MiB": min((r["ce_busbw_gbs"] / r["ref_busbw_gbs"] for r in big), default=None),
            "ag_ce_busbw_gbs_max": max((r["ce_busbw_gbs"] for r in st.get("all_gather", [])), default=None),
            "mm_slowdown_ce_pct": mm.get("beside copy_engine all-gather"),
            "mm_slowdown_nccl_pct": mm.get("beside NCCL all-gather"),
            "error": res.get("error"), "seconds": res.get("seconds")}


if __name__ == "__main__":
    sys.exit(main())
