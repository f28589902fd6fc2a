"""Checkpointer: async, atomic, verified, resharding checkpoints over DCP.

Why this file exists: DCP writes a correct *format* but leaves durability, visibility and
bookkeeping to the caller. A checkpoint that is half written, silently truncated or
overwritten while being read costs days of training. So a save here is a small protocol:

1. `save()` (training thread): resolve Stateful objects to state dicts, copy every tensor
   into reusable host buffers (pinned when the source is on CUDA). This is the only stall.
2. Writer thread: `dcp.save` into `step_<N>.tmp/` with fsync per file, using a dedicated
   gloo group so its collectives never interleave with the training thread's.
3. Every rank checksums the files it wrote; the results and success flags are all-gathered.
4. Rank 0, only if every rank succeeded: fsync, rename `step_<N>.tmp` -> `step_<N>`, fsync
   the parent, then write `step_<N>/COMMIT.json` (manifest: sizes + crc32 of every file,
   world size, step) atomically. Only a folder with a valid marker is a checkpoint.
5. Retention, then removal of stale `.tmp` / unmarked folders.

A failure anywhere is kept and raised by the next `save()`/`wait()`; nothing is committed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.futures import Future
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from gem_checkpoint import _fs
from gem_checkpoint._fs import CheckpointCorruptError, CheckpointError
from gem_checkpoint._process_writer import ProcessWriter
from gem_checkpoint._state import Stager, check_state, is_stateful, to_plain

try:  # what torchrec's sharded tables put in a state dict
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
except ImportError:  # pragma: no cover
    ShardedTensor = None  # type: ignore[assignment,misc]

log = logging.getLogger("gem_checkpoint")

FAULT_ENV = "GEM_CKPT_FAULT"
"""Fault injection for tests: "<stage>" raises ENOSPC there, "<stage>:kill" SIGKILLs the
process there. Stages: "write" (after this rank's data files, before DCP's metadata),
"commit" (rank 0, all ranks done, before the rename), "rename" (after the rename, before
the marker), "marker" (after the marker, before retention)."""

FaultHook = Callable[[str], None]

WRITE_SWITCH_INTERVAL_S = 0.0005
"""Python's thread switch interval while a checkpoint write runs (`sys.setswitchinterval`;
Python's default is 0.005 s). See `_while_writing`."""

_WRITING_LOCK = threading.Lock()
_WRITERS = 0
_SAVED: dict[str, Any] = {}


def _process_settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None], Any]]:
    """name -> (get, set, value while writing) of each process-wide setting a write changes."""
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], None], Any]] = {
        "switch_interval": (sys.getswitchinterval, sys.setswitchinterval, WRITE_SWITCH_INTERVAL_S),
    }
    get = getattr(torch.serialization, "get_crc32_options", None)
    put = getattr(torch.serialization, "set_crc32_options", None)
    if get is not None and put is not None:  # torch >= 2.6
        out["zip_crc32"] = (get, put, False)
    return out


@contextlib.contextmanager
def _while_writing() -> Iterator[None]:
    """Process-wide settings for the span of a checkpoint write; the caller's come back when
    the last overlapping write ends.

    - torch.save's per-record zip crc32 off (`torch.serialization.set_crc32_options`). DCP
      writes every tensor with torch.save, whose zip writer checksums each record: on the CPU
      box that ran at 0.33 GB/s against 3.7 GB/s without it (a 1.2 GB tensor into /dev/shm).
      The manifest's crc32 of every whole file (`_fs.digests`, checked by `load(verify=True)`)
      covers the same bytes, and torch.load reads files without the record checksums.
    - Python's thread switch interval at `WRITE_SWITCH_INTERVAL_S`. The writer thread takes the
      GIL many times per tensor (pickling, stream calls); beside a training thread that runs
      Python between its kernel launches each take waits up to the interval (5 ms by default).
      On the CPU box (`tools/bench_ckpt_gil.py`, 400 tensors, 0.42 GB, a pure-Python neighbour
      thread) the write took 19.8 s at 5 ms, 3.8 s at 0.5 ms, 2.2 s with no neighbour. On the
      H200 the h200 preset's 3.3 GB writes took >12 s beside training against 6-7 s alone,
      and 0.5 ms did not shorten them there (checkpoint/BENCHMARKS.md, 2026-12-01).
    A torch.save or thread elsewhere in the process meanwhile sees the same settings (a zip
    without record checksums still loads; threads switch more often).
    """
    global _WRITERS
    settings = _process_settings()
    with _WRITING_LOCK:
        if _WRITERS == 0:
            for name, (get, put, value) in settings.items():
                _SAVED[name] = get()
                put(value)
        _WRITERS += 1
    try:
        yield
    finally:
        with _WRITING_LOCK:
            _WRITERS -= 1
            if _WRITERS == 0:
                for name, (_, put, _) in settings.items():
                    if name in _SAVED:
                        put(_SAVED.pop(name))


class CheckpointWriteError(CheckpointError):
    """A background save failed; nothing was committed for that step."""


class CheckpointBusyError(CheckpointError):
    """save() was called while the previous save is still writing and on_busy="raise"."""


def _env_fault(stage: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    for item in filter(None, spec.split(",")):
        name, _, action = item.partition(":")
        if name != stage:
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action.startswith("sleep="):  # a slow disk: the write takes this many seconds longer
            time.sleep(float(action[len("sleep="):]))
            continue
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAULT_ENV}={spec} at {stage!r})")


class _Writer(FileSystemWriter):
    """FileSystemWriter that records which files this rank wrote and runs the fault hook."""

    def __init__(self, path: Path, hook: FaultHook) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._hook = hook
        self.written: list[str] = []

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut = super().write_data(plan, planner)
        results = fut.wait()
        self.written = sorted({r.storage_data.relative_path for r in results})
        self._hook("write")
        return fut


class Checkpointer:
    """Saves and restores the whole training state in a directory of DCP checkpoints.

    Args:
        directory: where `step_<N>/` folders live (shared by all ranks).
        keep_last: keep the newest `keep_last` committed steps (>= 1).
        keep_every: also keep every step divisible by this (None: none). The newest
            committed step is never deleted.
        async_save: write in a background thread (save() blocks only for host staging).
        on_busy: "wait" (block until the previous write ends) or "raise"
            (CheckpointBusyError) when save() is called while one is writing. Use "wait"
            with several ranks: "raise" is decided per rank.
        fallback_to_good: `load(step=None)` skips corrupt checkpoints (with a warning)
            and loads the newest good one instead of raising.
        verify: check every file's size and crc32 against the manifest before loading.
        process_group: group for checkpoint collectives; default a new gloo group over
            all ranks when torch.distributed is initialised (construct on every rank).
        fault_hook: called with a stage name during a save; raising fails that save
            (see FAULT_ENV for the stages). With writer="process" its "write" stage runs in
            the parent once the child has written every file (`GEM_CKPT_FAULT` runs in the
            child, where DCP writes).
        writer: "thread" (DCP writes from a thread of this process) or "process" (from a
            long-lived child process with its own GIL, the host copies in shared memory; one
            process only, async_save only; see `_process_writer`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep_last: int = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        on_busy: Literal["wait", "raise"] = "wait",
        fallback_to_good: bool = False,
        verify: bool = True,
        process_group: dist.ProcessGroup | None = None,
        fault_hook: FaultHook | None = None,
        writer: Literal["thread", "process"] = "thread",
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be an int >= 1")
        if keep_every is not None and (isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 1):
            raise ValueError(f"keep_every={keep_every!r} must be None or an int >= 1")
        if on_busy not in ("wait", "raise"):
            raise ValueError(f"on_busy={on_busy!r} must be 'wait' or 'raise'")
        if writer not in ("thread", "process"):
            raise ValueError(f"writer={writer!r} must be 'thread' or 'process'")
        if writer == "process" and not async_save:
            raise ValueError("writer='process' needs async_save=True (a synchronous save writes in the caller)")
        self.root = Path(directory)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.async_save = async_save
        self.on_busy = on_busy
        self.fallback_to_good = fallback_to_good
        self.verify = verify
        self._fault_hook = fault_hook
        self._pg: dist.ProcessGroup | None = None
        self.rank, self.world_size = 0, 1
        if dist.is_available() and dist.is_initialized():
            self._pg = process_group if process_group is not None else dist.new_group(backend="gloo")
            self.rank = dist.get_rank(self._pg)
            self.world_size = dist.get_world_size(self._pg)
        if writer == "process" and self.world_size > 1:
            raise ValueError(f"writer='process' works in a single process; this group has {self.world_size} ranks")
        self.writer = writer
        self._stager = Stager(shared=writer == "process")
        self._process: ProcessWriter | None = ProcessWriter() if writer == "process" else None
        self._thread: threading.Thread | None = None
        self._inflight: int | None = None
        self._error: tuple[int, BaseException, str] | None = None
        self.last_stall_s = 0.0
        """Seconds the last save() blocked the caller (incl. waiting for the previous write)."""
        self.last_write_s = 0.0
        """Seconds the last completed write took (dcp.save + checksums + commit)."""
        self.last_bytes = 0
        """Bytes in the last committed checkpoint (all ranks)."""
        self.write_started = 0.0
        """time.perf_counter() when the latest background write began (with `pending`: how
        long the running write has taken so far)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            removed = _fs.clean_stale(self.root, keep=set())
            if removed:
                log.warning("removed stale uncommitted checkpoint folders in %s: %s", self.root, removed)
        self._barrier()

    # ----------------------------------------------------------------- public API
    def save(self, step: int, state: MutableMapping[str, Any]) -> None:
        """Checkpoints `state` as step `step`.

        Blocks while the previous save is still writing (on_busy="wait") and while the
        tensors are copied to host memory; the write and commit run in the background
        when async_save. Raises CheckpointWriteError for a previous failed background
        save (that save is lost; call save() again to retry). Collective: call on all ranks.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r} must be an int >= 0")
        check_state(state)
        if self.writer == "process" and self._process is None:  # close()d
            raise CheckpointError(f"save(step={step}) after close(): the writer process of {self.root} is stopped")
        t0 = time.perf_counter()
        self._finish_previous(step)
        plain = to_plain(state)
        if not self.async_save:
            self._write(step, plain)
            self.last_stall_s = time.perf_counter() - t0
            self._raise_error()
            return
        staged = self._stager.stage(plain)
        self._inflight = step
        self.write_started = time.perf_counter()
        self._thread = threading.Thread(
            target=self._write, args=(step, staged), name=f"gem-ckpt-{step}", daemon=False
        )
        self._thread.start()
        self.last_stall_s = time.perf_counter() - t0

    def prepare(self, state: MutableMapping[str, Any]) -> int:
        """Allocates the host buffers a save of `state` stages into, now; returns their bytes.

        Optional: without it the first async save() allocates them, and pinned memory for a
        CUDA state of several GB takes seconds (on the H200 preset the first save stalled
        3.4 s, later ones 0.3 s). Call it at start-up, after building the state, when a
        one-off start-up cost is cheaper than a stall in the middle of training. Calling it
        while a save is writing is an error (the buffers are in use)."""
        check_state(state)
        if self.pending is not None:
            raise CheckpointBusyError(f"prepare() while step {self._inflight} is being written")
        if not self.async_save:
            return 0
        return self._stager.allocate(to_plain(state))

    def close(self) -> None:
        """Waits for the running write, then stops the writer process (writer="process"; a
        no-op otherwise). Raises like wait(); loading still works after it, saving does not."""
        try:
            self.wait()
        finally:
            if self._process is not None:
                self._process.close()
                self._process = None

    def wait(self) -> None:
        """Blocks until the in-flight save ends; raises CheckpointWriteError if it failed."""
        self._join()
        self._raise_error()

    @property
    def pending(self) -> int | None:
        """The step being written in the background, or None."""
        if self._thread is not None and self._thread.is_alive():
            return self._inflight
        return None

    def latest(self) -> int | None:
        """The newest committed step (marker present, file sizes match), or None."""
        steps = _fs.committed_steps(self.root)
        return steps[-1] if steps else None

    def steps(self) -> list[int]:
        """All committed steps, ascending."""
        return _fs.committed_steps(self.root)

    def info(self, step: int | None = None) -> dict[str, Any]:
        """What the commit marker of `step` (default: the newest committed) records: `step`,
        `world_size` (the processes that wrote it), `torch` (their version), `time` (Unix
        seconds of the commit) and `total_bytes`. Local (no collective); reads one small
        file. Raises FileNotFoundError when there is no such committed step, TypeError when
        `step` is not an int."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"step={step!r} must be an int or None")
        steps = self.steps()
        want = steps[-1] if step is None and steps else step
        marker = _fs.read_marker(_fs.step_dir(self.root, want)) if want is not None and want in steps else None
        if marker is None:
            raise FileNotFoundError(f"step={step} has no committed checkpoint in {self.root} (committed: {steps})")
        return {k: marker[k] for k in ("step", "world_size", "torch", "time", "total_bytes") if k in marker}

    def load(self, state: MutableMapping[str, Any], step: int | None = None) -> int:
        """Restores `state` in place from `step` (default: the newest committed) and returns it.

        Stateful values get load_state_dict(), tensors (plain or DTensor, any sharding)
        are copied into, other values are replaced in `state`. Raises FileNotFoundError
        when there is no such committed step, CheckpointCorruptError naming the file when
        verification fails (unless fallback_to_good and step is None). Collective.
        """
        check_state(state)
        self._join()  # a pending error stays for the next save()/wait()
        # Every rank must pick the same step: rank 0's view of the directory decides.
        committed: list[int] = self._all_gather(_fs.committed_steps(self.root))[0]
        if step is not None:
            if step not in committed:
                raise FileNotFoundError(f"step={step} has no committed checkpoint in {self.root} (committed: {committed})")
            candidates = [step]
        else:
            candidates = committed[::-1]
        if not candidates:
            raise FileNotFoundError(f"no committed checkpoint in {self.root}")
        last: CheckpointCorruptError | None = None
        for s in candidates:
            try:
                if self.verify:
                    self._verify(s)
            except CheckpointCorruptError as e:
                if not (self.fallback_to_good and step is None):
                    raise
                log.warning("skipping corrupt checkpoint step %d: %s", s, e)
                warnings.warn(f"gem_checkpoint: skipping corrupt checkpoint step {s}: {e}", stacklevel=2)
                last = e
                continue
            self._load_step(s, state)
            return s
        assert last is not None
        raise CheckpointCorruptError(last.path, f"no good checkpoint left in {self.root}; newest error: {last}")

    # ----------------------------------------------------------------- internals
    def _hook(self, stage: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(stage)
        _env_fault(stage)

    def _barrier(self) -> None:
        if self._pg is not None:
            dist.barrier(group=self._pg)

    def _all_gather(self, obj: object) -> list[Any]:
        if self._pg is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._inflight = None

    def _finish_previous(self, step: int) -> None:
        if self._thread is not None and self._thread.is_alive() and self.on_busy == "raise":
            raise CheckpointBusyError(
                f"save(step={step}) while step {self._inflight} is still being written (on_busy='raise')"
            )
        self._join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            step, err, detail = self._error
            self._error = None
            raise CheckpointWriteError(f"saving step {step} to {self.root} failed, nothing was committed: {detail}") from err

    def _write(self, step: int, state_dict: dict[str, Any]) -> None:
        """Runs on every rank (writer thread or inline); records any failure in self._error."""
        t0 = time.perf_counter()
        tmp = _fs.tmp_dir(self.root, step)
        local_err: BaseException | None = None
        files: dict[str, dict[str, int]] = {}
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            if self._process is not None:
                files = self._process.write(tmp, state_dict)
                if self._fault_hook is not None:
                    self._fault_hook("write")
            else:
                writer = _Writer(tmp, self._hook)
                with warnings.catch_warnings(), _while_writing():
                    warnings.simplefilter("ignore")  # DCP's "assuming single process" notice
                    dcp_save(state_dict, storage_writer=writer, process_group=self._pg)
                files = _fs.digests(tmp, writer.written)
        except BaseException as e:  # noqa: BLE001 - reported via save()/wait()
            local_err = _unwrap(e, self.rank)
        error: BaseException | None = local_err
        detail = "" if local_err is None else describe_write_error(local_err, tmp, self.root)
        try:
            results = self._all_gather((local_err is None, files if local_err is None else detail))
            bad = [(r, msg) for r, (ok, msg) in enumerate(results) if not ok]
            if error is None and bad:
                error = CheckpointWriteError(f"rank {bad[0][0]} failed: {bad[0][1]}")
                detail = str(error)
            commit_err: str | None = None
            if self.rank == 0:
                if error is None:
                    merged: dict[str, dict[str, int]] = {}
                    for _, rank_files in results:
                        merged.update(rank_files)
                    try:
                        self._commit(step, tmp, merged)
                    except BaseException as e:  # noqa: BLE001
                        error = e
                        detail = commit_err = describe_write_error(e, tmp, self.root)
                if error is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if _fs.read_marker(_fs.step_dir(self.root, step)) is None:
                        shutil.rmtree(_fs.step_dir(self.root, step), ignore_errors=True)
            status = self._all_gather(commit_err)
            if error is None and status[0] is not None:
                error = CheckpointWriteError(f"rank 0 failed to commit: {status[0]}")
                detail = str(error)
        except BaseException as e:  # noqa: BLE001 - e.g. the group itself broke
            if error is None:
                error, detail = e, describe_write_error(e, tmp, self.root)
        if error is not None:
            self._error = (step, error, detail)
            log.error("checkpoint step %d failed: %s", step, detail)
        self.last_write_s = time.perf_counter() - t0

    def _commit(self, step: int, tmp: Path, files: dict[str, dict[str, int]]) -> None:
        """Rank 0 only, after every rank's files are written and fsynced."""
        self._hook("commit")
        files.update(_fs.digests(tmp, [".metadata"]))
        for name in files:
            _fs.fsync_file(tmp / name)
        _fs.fsync_dir(tmp)
        final = _fs.step_dir(self.root, step)
        if final.exists():  # re-saving a step (e.g. after a fallback): replace it
            _fs.remove_step(self.root, step)
        os.rename(tmp, final)
        _fs.fsync_dir(self.root)
        self._hook("rename")
        manifest = {
            "format": _fs.FORMAT,
            "step": step,
            "world_size": self.world_size,
            "files": files,
            "total_bytes": sum(f["size"] for f in files.values()),
            "time": time.time(),
            "torch": torch.__version__,
        }
        _fs.write_marker(final, manifest)
        self.last_bytes = int(manifest["total_bytes"])  # type: ignore[call-overload]
        self._hook("marker")
        self._retain(step)
        _fs.clean_stale(self.root, keep=set())

    def _retain(self, just_saved: int) -> None:
        steps = _fs.committed_steps(self.root)
        if not steps:
            return
        keep = set(steps[-self.keep_last :]) | {steps[-1], just_saved}
        if self.keep_every is not None:
            keep |= {s for s in steps if s % self.keep_every == 0}
        for s in steps:
            if s not in keep:
                _fs.remove_step(self.root, s)

    def _verify(self, step: int) -> None:
        folder = _fs.step_dir(self.root, step)
        manifest = _fs.read_marker(folder)
        if manifest is None:
            raise CheckpointCorruptError(folder / _fs.MARKER, "missing or unreadable commit marker")
        names = sorted(manifest["files"])
        err: str | None = None
        bad_path = ""
        try:
            _fs.verify(folder, manifest, names[self.rank :: self.world_size])
        except CheckpointCorruptError as e:
            err, bad_path = str(e), str(e.path)
        for result in self._all_gather((bad_path, err)):
            if result[1] is not None:
                raise CheckpointCorruptError(Path(result[0]), result[1].split(": ", 1)[-1])

    def _load_step(self, step: int, state: MutableMapping[str, Any]) -> None:
        folder = _fs.step_dir(self.root, step)
        template = to_plain(state)
        metadata = FileSystemReader(folder).read_metadata()
        _add_missing(template, state, metadata)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                dcp_load(template, storage_reader=FileSystemReader(folder), process_group=self._pg,
                         planner=_LoadPlanner())
            except CheckpointException as e:
                causes = "; ".join(f"rank {r}: {_cause(v)}" for r, v in sorted(e.failures.items()))
                raise CheckpointError(f"loading step {step} from {folder} failed: {causes}") from e
        for key, value in state.items():
            if is_stateful(value):
                loaded = template[key]
                if isinstance(value, torch.optim.Optimizer):
                    loaded = _int_keys(loaded)
                value.load_state_dict(loaded)
            elif not isinstance(value, torch.Tensor):
                state[key] = template[key]


class _LoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, keeping ShardedTensors this rank holds no shard of.

    torchrec's table-wise tables put a ShardedTensor for every table into every rank's state
    dict, with a local shard only on the owner. DCP's `_flatten_sharded_tensors` drops the
    shard-less ones from the planner's view, so the checkpoint has keys this rank "lacks";
    DCP reads that as a pre-2.4 checkpoint and re-flattens the whole state dict the old way,
    where a tensor-free dict (the loader's state) becomes one key ("loader") the checkpoint
    does not have: "Missing key in checkpoint state_dict: loader" on every rank. Keeping the
    empty ShardedTensors (they read nothing: no local chunks) avoids the false fallback.
    """

    def set_up_planner(self, state_dict: Any, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if ShardedTensor is None or not (self.flatten_sharded_tensors and self.flatten_state_dict):
            return
        flat, mappings = flatten_state_dict(self.original_state_dict)
        for fqn, value in flat.items():
            if isinstance(value, ShardedTensor) and not value.local_shards() and fqn not in self.state_dict:
                self.state_dict[fqn] = value
                self.mappings[fqn] = mappings[fqn]


def _add_missing(template: dict[str, Any], state: MutableMapping[str, Any], metadata: Metadata) -> None:
    """Adds checkpoint entries under the requested top-level keys that the template lacks.

    A fresh optimizer has no per-parameter state yet, so its state_dict() has no slots
    for exp_avg & co.; without this they would be silently dropped on resume. Likewise an
    empty dict in `state` is filled with what was saved under its key. Keys of the
    checkpoint outside `state` are not loaded (load a subset by passing fewer keys).
    """
    flat, _ = flatten_state_dict(template)
    paths = metadata.planner_data or {}
    for fqn, md in metadata.state_dict_metadata.items():
        path = paths.get(fqn)
        if fqn in flat or not path or path[0] not in state or isinstance(state[str(path[0])], torch.Tensor):
            continue
        value: Any = torch.empty(md.size, dtype=md.properties.dtype) if isinstance(md, TensorStorageMetadata) else None
        set_element(template, path, value)


def _int_keys(optim_sd: dict[str, Any]) -> dict[str, Any]:
    # DCP stores dict keys as strings; torch.optim keys per-parameter state by int index.
    st = optim_sd.get("state")
    if isinstance(st, dict):
        optim_sd = dict(optim_sd, state={(int(k) if isinstance(k, str) and k.isdigit() else k): v for k, v in st.items()})
    return optim_sd


def _cause(failure: object) -> str:
    # DCP wraps each rank's exception as (exception, traceback).
    exc = failure[0] if isinstance(failure, tuple) and failure else failure
    return repr(exc)


_OS_ERRORS = {
    errno.ENOSPC: "the disk is full (ENOSPC)",
    errno.EDQUOT: "the disk quota is exceeded (EDQUOT)",
    errno.EFBIG: "a file outgrew the size limit (EFBIG: RLIMIT_FSIZE or the file system's maximum)",
    errno.EROFS: "the file system is read-only (EROFS)",
    errno.EACCES: "permission denied (EACCES)",
}


def _os_error_in(err: BaseException) -> OSError | None:
    """The first OSError with an errno in err's cause/context chain (torch's zip writer wraps a
    failed write() in RuntimeError('unexpected pos ...') and keeps the OSError as context)."""
    todo: list[BaseException | None] = [err]
    seen: set[int] = set()
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        todo += [e.__cause__, e.__context__]
    return None


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    x, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1024:
            break
    return f"{x:.1f} {unit}"


def describe_write_error(err: BaseException, folder: Path, root: Path) -> str:
    """One sentence for a failed save: what the OS said, where, and the free space left.

    Without this, a full disk surfaces as torch's "unexpected pos 704 vs 598".
    """
    os_err = _os_error_in(err)
    if os_err is None and "unexpected pos" not in str(err):
        return repr(err)
    try:
        du = shutil.disk_usage(root)
        space = f"{_size(du.free)} free of {_size(du.total)} on the file system of {root}"
    except OSError:
        space = f"free space of {root} unknown"
    where = os_err.filename if os_err is not None and os_err.filename else folder
    if os_err is None:  # a short write without the OSError kept: most often a full disk
        what = f"a write came up short ({err}; the disk may be full)"
    else:
        assert os_err.errno is not None
        name = errno.errorcode.get(os_err.errno, str(os_err.errno))
        what = _OS_ERRORS.get(os_err.errno, f"{name}: {os_err.strerror}")
    return (f"{what} while writing {where} ({space}); earlier checkpoints are untouched — free space or lower "
            f"keep_last/keep_every and save again [{type(err).__name__}: {err}]")


def _unwrap(err: BaseException, rank: int) -> BaseException:
    """DCP wraps every rank's failure in one CheckpointException; keep the real cause."""
    if isinstance(err, CheckpointException) and err.failures:
        src = rank if rank in err.failures else min(err.failures)
        failure = err.failures[src]
        exc = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(exc, BaseException):
            if src == rank:
                return exc
            other = CheckpointWriteError(f"rank {src} failed: {exc!r}")
            other.__cause__ = exc
            return other
    return err
