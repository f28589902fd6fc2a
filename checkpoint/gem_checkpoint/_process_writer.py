"""A writer *process* for single-process checkpoints: DCP's serialisation off the training GIL.

Why: the default writer is a thread of the training process. DCP serialises every tensor with
torch.save, which takes the GIL many times per tensor, and the training thread holds the GIL
both while it runs Python and while it blocks inside kernel launches once CUDA's launch queue
is full. On the H200 the h200 preset's 3.3 GB write took 6-7 s alone but more than 12 s beside
training, to disk and to RAM alike, whatever Python's switch interval (trainer/BENCHMARKS.md,
2026-12-01). A child process has its own interpreter and GIL.

How: the `Stager` puts the host copies in shared memory (and registers them with CUDA, so the
device-to-host copy stays a pinned DMA); only their handles cross the pipe. The child runs the
same `dcp.save` through the same `_Writer` (so `GEM_CKPT_FAULT` works there: the environment is
inherited) and the whole-file checksums, and sends back the file digests or the exception. The
commit (rename, marker, retention) stays in the parent's writer thread, which waits on the pipe
without the GIL. The child dies with its parent (Linux `PR_SET_PDEATHSIG`): a killed trainer
leaves a `.tmp` folder, never a writer that outlives it. It ignores SIGINT and SIGTERM, which
a terminal or a scheduler sends to the whole process group: the trainer's answer to them is a
last checkpoint, written by this child.

Single process only: with several ranks DCP's save plan is a collective over the ranks' own
process group, which the child does not have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch


class ProcessWriter:
    """One long-lived child that writes DCP checkpoints on request, one at a time."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process holding CUDA state and threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, os.getpid()), name="gem-ckpt-writer", daemon=True)
        with _main_hidden(), _stop_signals_ignored_in_child():
            self._proc.start()
        child.close()
        self._sent: dict[int, torch.Tensor] = {}  # id -> tensor the child holds a mapping of

    def write(self, tmp: Path, state_dict: dict[str, Any]) -> dict[str, dict[str, int]]:
        """dcp.save of `state_dict` into `tmp` and the digests of its files, in the child.
        Raises what the child raised (an OSError keeps its errno and file name)."""
        if not self._proc.is_alive():
            raise RuntimeError(f"the checkpoint writer process died (exit code {self._proc.exitcode})")
        plain, new = self._refs(state_dict)
        self._conn.send((str(tmp), plain, new))
        try:
            res = self._conn.recv()
        except EOFError:
            self._proc.join(5)
            raise RuntimeError(f"the checkpoint writer process died (exit code {self._proc.exitcode})") from None
        if isinstance(res, BaseException):
            raise res
        files: dict[str, dict[str, int]] = res
        return files

    def _refs(self, state_dict: dict[str, Any]) -> tuple[Any, dict[int, torch.Tensor]]:
        """The state dict with each tensor replaced by a `_Ref`, and the tensors the child has
        not mapped yet. The Stager hands back the same buffers every save, so after the first
        save only the structure crosses the pipe: sending a shared-memory tensor passes its file
        descriptor through multiprocessing's resource sharer, a round trip through a Python
        thread of this process per tensor, which waits for the GIL like the thread writer did."""
        new: dict[int, torch.Tensor] = {}
        used: dict[int, torch.Tensor] = {}

        def swap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            used[id(t)] = t
            if id(t) not in self._sent:
                new[id(t)] = t
            return _Ref(id(t))

        plain = _map_leaves(state_dict, swap)
        self._sent = used  # keeps each mapped tensor alive, so its id is not reused meanwhile
        return plain, new

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _stop_signals_ignored_in_child() -> Iterator[None]:
    """The child starts with SIGINT and SIGTERM ignored: an ignored disposition survives the
    exec of the spawned interpreter (a blocked mask does not), so a stop sent to the process
    group while the child still imports torch (seconds) cannot kill it before `_serve` runs.
    Meanwhile this thread blocks them, so one that arrives here is delivered to this process's
    own handler when it is restored, not lost. Python sets handlers only from the main thread:
    elsewhere (and for a handler Python did not install) nothing changes here."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [s for s in _STOP_SIGNALS if signal.getsignal(s) is not None]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    old = {s: signal.signal(s, signal.SIG_IGN) for s in sigs}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Starts the child without re-running the caller's main script or module in it.

    A "spawn" child first imports the parent's `__main__` (by path or by module name), so an
    unguarded script would run again there (and start another writer). The writer needs
    nothing from `__main__`: its name and path are hidden while the child's preparation data
    is taken, and put back right after."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    try:
        main.__dict__.pop("__file__", None)
        main.__dict__["__spec__"] = None
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A tensor the child already maps (or receives in the same message), by the parent's id."""

    key: int


def _map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with `fn` applied to every value that is not a dict, list or tuple."""
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_map_leaves(v, fn) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return fn(obj)


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _portable(err: BaseException) -> BaseException:
    """An exception that survives the pipe: OSErrors (the disk-full path) keep errno, message and
    file name; anything else becomes a RuntimeError with its repr."""
    from gem_checkpoint._checkpointer import _os_error_in, _unwrap

    err = _unwrap(err, 0)
    os_err = _os_error_in(err)
    if os_err is not None:
        return OSError(os_err.errno or errno.EIO, os_err.strerror or str(os_err), os_err.filename)
    return RuntimeError(repr(err))


def _serve(conn: Connection, parent: int) -> None:
    _die_with_parent(parent)
    # A stop aimed at the training job (Ctrl-C's SIGINT, a scheduler's or `timeout`'s SIGTERM)
    # is sent to the whole process group, this child too. The trainer answers it with a last
    # save, which needs this child alive: the parent alone ends it (close(), or its death).
    for sig in _STOP_SIGNALS:  # (already ignored since the start when started from the main thread)
        signal.signal(sig, signal.SIG_IGN)
    import warnings

    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from gem_checkpoint import _fs
    from gem_checkpoint._checkpointer import _env_fault, _while_writing, _Writer

    cache: dict[int, torch.Tensor] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        tmp, plain, new = msg
        state_dict: Any = None
        try:
            known, cache = {**cache, **new}, {}

            def resolve(leaf: Any) -> Any:
                if not isinstance(leaf, _Ref):
                    return leaf
                cache[leaf.key] = known[leaf.key]  # only what this save uses: the parent dropped the rest
                return cache[leaf.key]

            state_dict = _map_leaves(plain, resolve)
            writer = _Writer(Path(tmp), _env_fault)
            with warnings.catch_warnings(), _while_writing():
                warnings.simplefilter("ignore")
                dcp_save(state_dict, storage_writer=writer, no_dist=True)
            conn.send(_fs.digests(Path(tmp), writer.written))
        except BaseException as e:  # noqa: BLE001 - sent to the parent, which reports it
            conn.send(_portable(e))
        del msg, state_dict, new, known
