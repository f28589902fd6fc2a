"""Blocks compiled ahead of time and kept on disk: a warm start without dynamo's tracing.

`torch.compile` caches inductor's code and AOTAutograd's graphs on disk, but every process
still re-runs dynamo: it traces each block kind's bytecode with fake tensors and symbolic
sizes (about 4 s of a warm start's 12 s for the h200 preset on an H200; 3.3 s of 6.7 s for
the tiny preset on a CPU) before a cache can even be asked. torch's ahead-of-time API
(`torch.compile(...).aot_compile`, `torch.compiler.load_compiled_function`) serialises what
dynamo produced, guards included, with the compiled forward and backward. `AotBlocks` uses
it per block kind:

- at a block's call, the variants of its kind (one per guard set: the first layer, whose
  `pooled` input is None, the later ones, an evaluation under `no_grad`, ...) are tried in
  order by their guards, and the first that passes runs;
- none passes: the kind's files not loaded yet are loaded one at a time, oldest first, until
  one passes (so a process loads the variants its calls need, when they first need them:
  a start does not pay ~1.2 s per file on the H200 for variants a later batch or the
  evaluation will use);
- still none: the call is compiled ahead of time with these inputs (dynamic sizes, whole
  graph, the same compiler flags as `compile_blocks`), saved as one file, and run;
- a loaded file is dropped and replaced when
  the source lines dynamo traced have changed since it was written (a stale graph must
  never run), when torch reports it incompatible (another torch, Python or GPU), or when it
  cannot be read (truncated, corrupt);
- a kind whose ahead-of-time compile fails (the API is experimental) runs through an
  ordinary `torch.compile` instead, with a warning and `stats.fallbacks` (eagerly while a
  background job of another kind runs: torch's graph tracing patches `nn.Module` through one
  process-wide patcher, and two threads tracing at once break each other).

With `background=True` a call that would load or compile runs its block eagerly instead, and
the loading (then, if no file fits, the compile) runs in a background thread (one kind at a
time, in the order calls needed them); once it is done, the next call of that kind takes the
variant. The first step then comes in eager time rather than after a minute of compiling from
an empty folder, or after the ~1.4 s a file of loading from a full one; the steps before the
switch run eager code (the same maths, other rounding), and which step switches depends on
how fast the compile went, so two such runs are not bit for bit the same. While a background
compile runs, the compiler flags (`settings`) are set in the calling thread (torch 2.11 keeps
them process-wide, so a thread cannot set them for itself alone; torch 2.13 per thread, and the
job runs in a copy of the caller's context) and restored when the last one is done; so is
the GIL's switch interval, lowered to `SWITCH_INTERVAL_S` (every torch op releases the GIL,
and at Python's 5 ms each eager op waited up to 5 ms to take it back from the compile).
`hold()` keeps jobs queued from then on from starting until `release()` (or `wait()`): the
trainer holds them through its first step, which is host-bound and would share the GIL.

Files live under `directory/<torch version>-<python>-<device>[-<tag>]/`, one per variant,
written atomically. The compiled call is a block's `forward` alone, so a block with module hooks is
refused rather than silently run without them. It is built and tested for one process;
`parallelize` refuses it with HSDP (FSDP works through hooks on the blocks). The API is
experimental in torch (2.11-2.13); any failure to load falls back to compiling, never to
running stale code.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import hashlib
import importlib
import inspect
import os
import re
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class AotStats:
    """What the blocks' ahead-of-time store did in this process."""

    loaded: int = 0  # variants read from files
    compiled: int = 0  # variants compiled here (and saved, unless save_errors says otherwise)
    stale: int = 0  # files dropped: their traced source changed
    unreadable: int = 0  # files dropped: torch could not load them (corrupt, another torch/GPU)
    save_errors: int = 0
    fallbacks: int = 0  # kinds whose ahead-of-time compile failed: they run through torch.compile
    eager_calls: int = 0  # background=True: block calls run eagerly while their kind compiled
    load_s: float = 0.0
    compile_s: float = 0.0
    notes: list[str] = field(default_factory=list)  # why a file was dropped or not saved, a fallback's error
    # Why each compile was needed: the first failing guard of every variant it had (e.g.
    # "GLOBAL_STATE changed: grad_mode", a size guard), so a run shows which inputs make new
    # variants without TORCH_LOGS=recompiles. At most REJECTED_KEPT entries.
    rejected: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"loaded": self.loaded, "compiled": self.compiled, "stale": self.stale,
                "unreadable": self.unreadable, "save_errors": self.save_errors, "fallbacks": self.fallbacks,
                "eager_calls": self.eager_calls,
                "load_s": round(self.load_s, 3), "compile_s": round(self.compile_s, 3),
                "rejected": list(self.rejected), "notes": self.notes[:REJECTED_KEPT]}


REJECTED_KEPT = 16

# The GIL's switch interval while background compiles run (Python's default: 5 ms). Every
# torch op releases the GIL, and taking it back from a busy thread waits up to one interval:
# with a compile running beside it, an eager op cost ~6 ms at the default (2-core CPU box: 48
# small ops/s, against ~3,500 at 50 us, while the busy thread's own pace was unchanged;
# an eager h200 step took 3.5 s instead of 0.38 s on an H100).
SWITCH_INTERVAL_S = 5e-5


def thread_local_fx_patches() -> None:
    """Makes torch.fx's tracer patches of `nn.Module.__call__` / `__getattr__` act in the
    tracing thread only (idempotent, process-wide).

    Why: `torch.fx.Tracer.trace` (under AOTAutograd's and inductor's graph tracing too)
    replaces `nn.Module.__call__` and `__getattr__` on the class for the length of a trace. A
    background compile traces in its thread while the calling thread runs eager blocks; a
    module call there during a trace went to the tracer, which raised "NameError: module is
    not installed as a submodule" (a cold h200 start on an H100, 2026-12-07: the run stopped
    at its first steps). With this, a patch made by one thread dispatches other threads'
    calls to what it replaced. Other patches of a trace (math and `torch.fx.wrap` functions,
    tensor methods) pass non-proxy arguments straight through and are left alone."""
    patcher: Any = getattr(getattr(torch.fx, "_symbolic_trace", None), "_Patcher", None)
    method = getattr(patcher, "patch_method", None)
    if patcher is None or method is None or getattr(method, "_gem_thread_local", False):
        return
    original = method

    def patch_method(self: Any, cls: type, name: str, new_fn: Callable[..., Any], deduplicate: bool = True) -> None:
        if cls is nn.Module:
            new_fn = _this_thread_only(new_fn, getattr(cls, name), threading.get_ident())
        original(self, cls, name, new_fn, deduplicate)

    patch_method._gem_thread_local = True  # type: ignore[attr-defined]
    patcher.patch_method = patch_method


def _this_thread_only(fn: Callable[..., Any], other: Callable[..., Any], owner: int) -> Callable[..., Any]:
    """`fn` in thread `owner`, `other` (what `fn` replaces) in every other thread."""
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == owner:
            return fn(*args, **kwargs)
        return other(*args, **kwargs)

    dispatch.__name__ = getattr(fn, "__name__", "dispatch")
    return dispatch


def _kind(block: nn.Module) -> str:
    """A file-name-safe name of the block's kind: its class, and the wrapped module's class
    for an activation-checkpointing wrapper."""
    inner = getattr(block, "_checkpoint_wrapped_module", None)
    names = [f"{type(block).__module__}.{type(block).__qualname__}"]
    if isinstance(inner, nn.Module):
        names.append(f"{type(inner).__module__}.{type(inner).__qualname__}")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "+".join(names))


def _system_tag() -> str:
    dev = "cpu"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        dev = f"sm{major}{minor}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{dev}")


def sources_current(fn: Any) -> bool:
    """Whether every source range dynamo traced into `fn` (an AOT-compiled function) still
    reads as it did when it was compiled (sha256 of the lines, as torch records them)."""
    try:
        sources = fn.source_info().inlined_sources
    except Exception:
        return False
    for s in sources:
        try:
            module = sys.modules.get(s.module) or importlib.import_module(s.module)
            lines = inspect.getsourcelines(module)[0][s.firstlineno - 1:s.lastlineno - 1]
        except Exception:
            return False
        if hashlib.sha256("".join(lines).encode()).hexdigest() != s.checksum:
            return False
    return True


# The stores that have started a background job: one exit hook for all of them, holding
# none alive (a store a process dropped needs no wait).
_STORES: weakref.WeakSet[AotBlocks] = weakref.WeakSet()


def _at_exit_all() -> None:
    for store in list(_STORES):
        store._at_exit()


atexit.register(_at_exit_all)


class AotBlocks:
    """Installs ahead-of-time compiled calls on blocks; see the module docstring.

    Args:
        directory: where the compiled variants are kept (created if missing).
        backend: the `torch.compile` backend ("inductor").
        settings: compiler flags as (config module, name, value) triples, set while a
            variant is compiled (gem_parallel's `_compile_settings`).
        tag: names a sub-folder, so models of different shapes sharing `directory` neither
            load nor try each other's variants (`parallelize` passes a hash of the model's
            structure and precision).
        background: compile in a background thread and run the blocks eagerly meanwhile
            (see the module docstring); False: a call that needs a compile waits for it.
    """

    def __init__(self, directory: str, backend: str = "inductor",
                 settings: Sequence[tuple[Any, str, Any]] = (), tag: str = "",
                 background: bool = False) -> None:
        if not isinstance(directory, str) or not directory:
            raise TypeError(f"directory={directory!r} must be a non-empty path")
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ValueError(f"directory={directory!r} exists and is not a directory")
        if not isinstance(background, bool):
            raise TypeError(f"background={background!r} must be a bool")
        if not hasattr(torch.compiler, "load_compiled_function"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compiler.load_compiled_function "
                               "(ahead-of-time compile); compile the blocks without a directory")
        sub = _system_tag() + (f"-{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}" if tag else "")
        self.directory = os.path.join(directory, sub)
        os.makedirs(self.directory, exist_ok=True)
        self.backend = backend
        self.settings = list(settings)
        self.stats = AotStats()
        self._variants: dict[str, list[Any]] = {}  # kind -> variants loaded or compiled here
        self._pending: dict[str, list[str]] = {}  # kind -> its files not loaded yet, oldest first
        self._fallback: dict[str, Callable[..., Any]] = {}
        self.background = background
        self._jobs: dict[str, _Job] = {}  # kind -> its compile queued or running in the background
        self._queue: list[_Job] = []
        self._lock = threading.Lock()  # guards _queue and _worker
        self._worker: threading.Thread | None = None  # while jobs are queued or running
        self._holding = False  # hold(): queued jobs wait for release()
        self._held: list[tuple[Any, str, Any]] | None = None  # the flags' values before the jobs set them
        self._interval = 0.0  # the GIL's switch interval before the jobs set it (with _held)

    def install(self, units: Sequence[tuple[nn.ModuleList, int]]) -> None:
        """Routes each `parent[index]` block's calls through the store (the slot
        `nn.Module.compile` fills). The compiled call is the block's `forward` alone, so a
        block with module hooks is refused, at install and at every call: they would not
        run. (Replacing `forward` on the instance instead would keep hooks, but dynamo then
        guards on that attribute, and the guard state cannot be saved.)"""
        for parent, i in units:
            block = parent[i]
            _no_hooks(block)
            block._compiled_call_impl = self._caller(block)

    def _caller(self, block: nn.Module) -> Callable[..., Any]:
        kind = _kind(block)

        def call(*args: Any, **kwargs: Any) -> Any:
            _no_hooks(block)
            return self.call(kind, block, args, kwargs)

        return call

    def call(self, kind: str, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._jobs:
            self._harvest()
        fallback = self._fallback.get(kind)
        if fallback is not None:
            if self._jobs:  # its torch.compile traces here: never beside a background job's trace
                self.stats.eager_calls += 1
                return block.forward(*args, **kwargs)
            return fallback(block, *args, **kwargs)
        variants = self._variants.setdefault(kind, [])
        for v in variants:
            if v.guard_check(block, *args, **kwargs):
                return v.fn(block, *args, **kwargs)
        if kind not in self._pending:
            self._pending[kind] = self._files_oldest_first(kind)
        if kind not in self._jobs:  # (background: a job under way runs the block eagerly meanwhile)
            if not self.background:
                try:
                    self._obtain(kind, block, args, kwargs, variants)
                except Exception as e:  # an experimental API: never let it stop a run
                    return self._fall_back(kind, block, e)(block, *args, **kwargs)
                return variants[-1].fn(block, *args, **kwargs)
            self._submit(kind, block, args, kwargs)
        self.stats.eager_calls += 1
        return block.forward(*args, **kwargs)

    def _obtain(self, kind: str, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                into: list[Any], flags: bool = True) -> None:
        """Appends to `into` the kind's files not loaded yet, loaded one at a time, oldest
        first, until one's guards pass these inputs; when none does, a variant compiled for
        them. The one that fits is appended last. (Loading stops at the first fit: a process
        loads the variants its calls need, when they first need them; an earlier run compiled
        them in the order its calls met them, so the first step loads only its own, and a
        start need not pay ~1.2 s a file on the H200 for variants a later batch or the
        evaluation will use.) A background job runs this in its thread, with its own `into`."""
        pending = self._pending[kind]
        while pending:
            v = self._load_one(pending.pop(0))
            if v is None:
                continue
            into.append(v)
            if v.guard_check(block, *args, **kwargs):
                return
        known = self._variants.get(kind, []) + ([] if into is self._variants.get(kind) else into)
        for i, v in enumerate(known):
            if len(self.stats.rejected) < REJECTED_KEPT:
                self.stats.rejected.append(f"compile {self.stats.compiled + 1} ({kind}): variant {i + 1} of "
                                           f"{len(known)} failed {_why_not(v, block, args, kwargs)}")
        into.append(self._compile(kind, block, args, kwargs, flags=flags))

    def _fall_back(self, kind: str, block: nn.Module, e: BaseException) -> Callable[..., Any]:
        self._fallback[kind] = fallback = self._plain(block)
        self.stats.fallbacks += 1
        self.stats.notes.append(f"{kind}: ahead-of-time compile failed ({type(e).__name__}: {str(e)[:200]})")
        warnings.warn(f"gem_parallel.AotBlocks: the ahead-of-time compile of {kind} failed "
                      f"({type(e).__name__}: {str(e)[:200]}); its blocks run through torch.compile "
                      "as without a folder", RuntimeWarning, stacklevel=3)
        return fallback

    # The background compiles (background=True). Jobs are made and harvested by the calling
    # thread only; one daemon thread runs them in order (a process exiting mid-compile loses
    # that compile, never a file: saves are atomic).
    def pending_compiles(self) -> list[str]:
        """The kinds whose background job (a load, then a compile if no file fits) is queued or
        running (finished ones are taken first, as a call would)."""
        if self._jobs:
            self._harvest()
        return sorted(self._jobs)

    def hold(self) -> None:
        """Background jobs queued from now on wait to start until `release()`: the calls still
        run their blocks eagerly meanwhile. For a caller whose first step should not share
        the GIL with a load or a compile (the trainer holds them until its first step is done:
        loading a file is Python work, ~1.4 s a file on an H100, and the first eager step is
        host-bound)."""
        with self._lock:
            self._holding = True

    def release(self) -> None:
        """Starts the jobs queued while held (no-op when not held)."""
        with self._lock:
            self._holding = False
            self._start_worker()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the background compiles (at most `timeout` seconds) and takes their
        variants; True when none is left. Releases held jobs first."""
        self.release()
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in list(self._jobs.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not job.done.wait(left):
                break
        self._harvest()
        return not self._jobs

    def _submit(self, kind: str, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._held is None:  # set the flags for the whole process while jobs run
            flags = [*self.settings, (torch._dynamo.config, "enable_aot_compile", True)]
            self._held = [(mod, name, getattr(mod, name)) for mod, name, _ in flags]
            for mod, name, value in flags:
                setattr(mod, name, value)
            self._interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL_S))
        memo: dict[int, torch.Tensor] = {}
        a, kw = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: _detached(t, memo), (args, kwargs))
        # The job runs in a copy of this thread's context: torch 2.13 keeps config overrides
        # per thread (in context variables), and a new thread would start from the defaults.
        thread_local_fx_patches()  # the job traces while this thread runs eager blocks
        job = _Job(kind, block, a, kw, _CallState.capture(), contextvars.copy_context())
        self._jobs[kind] = job
        _STORES.add(self)
        with self._lock:
            self._queue.append(job)
            self._start_worker()

    def _start_worker(self) -> None:
        """Starts a worker for the queued jobs unless one runs or they are held (with `_lock`
        held; a worker ends once the queue is empty)."""
        if self._worker is None and self._queue and not self._holding:
            self._worker = threading.Thread(target=self._work, name="gem-aot-compile", daemon=True)
            self._worker.start()

    def _at_exit(self) -> None:
        """At interpreter exit: drops the queued jobs (saying so) and waits for the one running. A daemon
        thread stopped inside the compiler's C++ code at finalisation aborts the process
        ("terminate called without an active exception", exit 134 after a good run); a job
        left to finish also keeps its variant for the next run."""
        with self._lock:
            dropped, self._queue = self._queue, []
        for job in dropped:  # done, as a failed job: none is left pending for ever
            job.finish(RuntimeError("dropped at interpreter exit before it started"))
        if dropped:
            print(f"gem_parallel: dropping the queued background load or compile of "
                  f"{', '.join(j.kind for j in dropped)} at exit: the next run makes it again "
                  "(call wait() before exiting to keep it)", file=sys.stderr, flush=True)
        running = [j for j in self._jobs.values() if j.started.is_set() and not j.done.is_set()]
        for job in running:
            print(f"gem_parallel: waiting for the background load or compile of {job.kind} to finish "
                  f"before exiting (what it makes is kept in {self.directory})", file=sys.stderr, flush=True)
            job.done.wait()
            if job.error is not None:
                print(f"gem_parallel: the background load or compile of {job.kind} stopped at the exit "
                      f"({type(job.error).__name__}: {str(job.error)[:200]}); nothing of it is kept "
                      "(call wait() before exiting to keep it)", file=sys.stderr, flush=True)

    def _work(self) -> None:
        """The worker: runs the queued jobs in order, and ends when none is left (so no thread
        outlives its work, or keeps the store and its model alive after it)."""
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None
                    return
                job = self._queue.pop(0)
                job.started.set()
            error: BaseException | None = None
            try:
                job.context.run(self._run_job, job)
            except BaseException as e:  # reported by the calling thread at its next call
                error = e
            finally:
                job.finish(error)

    def _run_job(self, job: _Job) -> None:
        with job.state.applied():
            self._obtain(job.kind, job.block, job.args, job.kwargs, job.variants, flags=False)

    def _harvest(self) -> None:
        """Takes the finished background compiles: each variant joins its kind's, a failure
        sends the kind to the plain torch.compile fallback (as a failed compile does in the
        foreground); the flags are restored once no job is left."""
        for kind, job in list(self._jobs.items()):
            if not job.done.is_set():
                continue
            del self._jobs[kind]
            self._variants.setdefault(kind, []).extend(job.variants)  # (those loaded before a failed compile too)
            if job.error is not None:
                self._fall_back(kind, job.block, job.error)
        if not self._jobs and self._held is not None:
            for mod, name, value in self._held:
                setattr(mod, name, value)
            self._held = None
            sys.setswitchinterval(self._interval)

    def _plain(self, block: nn.Module) -> Callable[..., Any]:
        """The kind's forward through an ordinary `torch.compile` (dynamo each process), with
        the same flags, set at every call as `compile_blocks` does."""
        compiled = torch.compile(type(block).forward, backend=self.backend, fullgraph=True, dynamic=True)
        return with_flags(compiled, self.settings)

    def files(self, kind: str | None = None) -> list[str]:
        """The variant files (of one kind, or all), sorted."""
        names = sorted(os.listdir(self.directory))  # "<kind>.<12 hex>.bin" (see _compile)
        return [os.path.join(self.directory, n) for n in names
                if n.endswith(".bin") and (kind is None or n[:-len(".bin")].rpartition(".")[0] == kind)]

    def _files_oldest_first(self, kind: str) -> list[str]:
        """The kind's files in the order they were written (modification time, then name)."""
        def written(path: str) -> tuple[int, str]:
            try:
                return os.stat(path).st_mtime_ns, path
            except OSError:  # removed meanwhile: last; its load then fails and is counted
                return 1 << 62, path

        return sorted(self.files(kind), key=written)

    def _load_one(self, path: str) -> Any:
        """The variant in `path`, or None (the file is dropped: unreadable or stale)."""
        t = time.perf_counter()
        try:
            try:
                with open(path, "rb") as f, torch._dynamo.config.patch(enable_aot_compile=True):
                    fn = torch.compiler.load_compiled_function(f)
            except Exception as e:  # corrupt, truncated, another torch / Python / GPU
                self.stats.unreadable += 1
                self.stats.notes.append(f"{os.path.basename(path)}: {type(e).__name__}: {str(e)[:120]}")
                _remove(path)
                return None
            if not sources_current(fn):
                self.stats.stale += 1
                _remove(path)
                return None
            self.stats.loaded += 1
            return fn
        finally:
            self.stats.load_s += time.perf_counter() - t

    def _compile(self, kind: str, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 flags: bool = True) -> Any:
        """Compiles, saves and returns one variant (`flags`: set the compiler flags around it;
        a background job runs with them already set process-wide)."""
        t = time.perf_counter()
        compile_forward = with_flags(_aot_compile_forward, self.settings) if flags else _aot_compile_forward
        try:
            traced = _shadow(block)
        except Exception as e:  # a block holding what cannot be copied (a lock, a stream)
            traced = block  # (its file may then not load if the parameters hold gradients)
            self.stats.notes.append(f"{kind}: compiled from the block itself: its copy failed "
                                    f"({type(e).__name__}: {str(e)[:120]})")
        fn = compile_forward(self.backend, traced, args, kwargs)
        self.stats.compiled += 1
        path = os.path.join(self.directory, f"{kind}.{uuid.uuid4().hex[:12]}.bin")
        try:
            fn.save_compiled_function(path)  # (atomic: a temporary file, then a rename)
        except Exception as e:  # the variant still runs in this process
            self.stats.save_errors += 1
            self.stats.notes.append(f"{kind}: not saved: {type(e).__name__}: {str(e)[:120]}")
        self.stats.compile_s += time.perf_counter() - t
        return fn


def _detached(t: torch.Tensor, memo: dict[int, torch.Tensor]) -> torch.Tensor:
    """A background job's copy of an input: the same storage and metadata, without the autograd
    graph behind it (which would keep a whole step's activations alive while it compiles).
    What dynamo guards on is kept, so a variant's guards judge the copy as they would the
    input: one copy per tensor (`memo`: inputs that are one tensor stay one), and a view stays
    a view of (the copy of) its base (a variant traced from a view guards on its `_base`; a
    plain detached copy has none, and the guard fails)."""
    if id(t) in memo:
        return memo[id(t)]
    d = None
    if t._base is not None:
        view = _detached(t._base, memo).as_strided(t.size(), t.stride(), t.storage_offset())
        if view.requires_grad == t.requires_grad:
            d = view
    if d is None:
        d = t.detach().requires_grad_(t.requires_grad)
    memo[id(t)] = d
    return d


def _shadow(block: nn.Module) -> nn.Module:
    """The block a background job compiles: a copy whose parameters share the block's storage
    but have no `.grad`. A variant's file records the `.grad` of each tensor its guards read,
    and torch 2.11-2.13 write a gradient that is not itself guarded as a placeholder the load
    then refuses ("assigned grad expected to be a Tensor or None but got grad of type
    _Missing"): a compile between a step's backward and its `zero_grad` (where a background
    job mostly runs; a foreground compile too, when a call first needs a variant after a
    backward) made files no later process could load. The variant then runs on the block
    itself. Buffers are shared as they are; other attributes are copied."""
    memo: dict[int, Any] = {}
    for p in block.parameters():
        memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
    for b in block.buffers():
        memo[id(b)] = b
    return copy.deepcopy(block, memo)


@dataclass
class _CallState:
    """The calling thread's state that dynamo guards and a new thread would not inherit:
    grad mode, autocast per device, the current CUDA device."""

    grad: bool
    autocast: list[tuple[str, torch.dtype, bool]]  # (device type, dtype, cache enabled), the enabled ones
    cuda_device: int | None

    @classmethod
    def capture(cls) -> _CallState:
        autocast = [(dev, torch.get_autocast_dtype(dev), torch.is_autocast_cache_enabled())
                    for dev in ("cuda", "cpu") if torch.is_autocast_enabled(dev)]
        initialized = bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
        cuda = torch.cuda.current_device() if torch.cuda.is_available() and initialized else None
        return cls(torch.is_grad_enabled(), autocast, cuda)

    def applied(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.cuda_device is not None:
            torch.cuda.set_device(self.cuda_device)
        stack.enter_context(torch.set_grad_enabled(self.grad))
        for dev, dtype, cache in self.autocast:
            stack.enter_context(torch.autocast(dev, dtype=dtype, cache_enabled=cache))
        return stack


@dataclass
class _Job:
    kind: str
    block: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: _CallState
    context: contextvars.Context
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    variants: list[Any] = field(default_factory=list)  # loaded, then maybe compiled: the fitting one last
    error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        """Ends the job (run, failed, or dropped at exit): its inputs are let go (they hold a
        step's tensors) and a waiter sees `done` with `error` already set."""
        self.error = error
        self.args, self.kwargs = (), {}
        self.done.set()


def _why_not(variant: Any, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The guard of a variant that these inputs fail, as dynamo words it ("GLOBAL_STATE changed:
    grad_mode", "tensor 'L['x']' dtype mismatch ..."). It reads the experimental API's guard
    manager (`_artifacts`, torch 2.11-2.13); anything else gives "unknown"."""
    try:
        f_locals = variant.prepare_f_locals(block, *args, **kwargs)
        manager = variant._artifacts.guard_manager
        info = manager.check_verbose(f_locals)
        parts = [str(p) for p in getattr(info, "verbose_code_parts", None) or []]
        if len(parts) > 1:
            parts = _failing_parts(manager, f_locals, parts)
        return ("; ".join(" ".join(p.split()) for p in parts) or "no guard named")[:300]
    except Exception as e:
        return f"unknown ({type(e).__name__})"


def _failing_parts(manager: Any, f_locals: dict[str, Any], parts: list[str]) -> list[str]:
    """The parts of a failed guard that these inputs make False. Dynamo installs all the
    symbolic-size guards of a variant as one guard with many parts (`x.size()[0] >= 2`,
    `offsets.size()[0] == 1 + x.size()[0]`, ...), and `check_verbose` returns them all;
    each part is a Python expression over `L` (the call's locals), evaluated here as dynamo's
    own recompile message does. All of `parts` where none evaluates to False (or a part
    cannot be evaluated)."""
    try:
        scope = {"L": f_locals, "G": manager.global_scope["G"], **(manager.closure_vars or {})}
        env = dict(manager.global_scope)  # (a copy: eval adds __builtins__ to its globals)
        failing = [p for p in parts if eval(p, env, scope) is False]  # noqa: S307
    except Exception:
        return parts
    return failing or parts


def with_flags(fn: Callable[..., Any], flags: Sequence[tuple[Any, str, Any]]) -> Callable[..., Any]:
    """`fn` run with each (config module, name, value) of `flags` set, then restored. Plain
    attribute swaps, not `config.patch` contexts: a block's call runs it every step, and on a
    2-core CPU box three patch contexts took ~135 us per call, the swaps ~15 us."""
    flags = list(flags)

    def call(*args: Any, **kwargs: Any) -> Any:
        old = [getattr(mod, name) for mod, name, _ in flags]
        for mod, name, value in flags:
            setattr(mod, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            for (mod, name, _), value in zip(flags, old):
                setattr(mod, name, value)

    return call


def _aot_compile_forward(backend: str, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # `torch.compile(fn).aot_compile` exists only while dynamo's `enable_aot_compile` is set:
    # on by default in torch 2.13, off in 2.11 (where its absence sent every block to the
    # plain-compile fallback on the H200).
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(block.forward, backend=backend, fullgraph=True, dynamic=True)
        return compiled.aot_compile((args, kwargs))  # type: ignore[attr-defined]


def _no_hooks(block: nn.Module) -> None:
    hooks = [name for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
             if getattr(block, name, None)]
    if hooks:
        raise ValueError(f"block {type(block).__qualname__} has module hooks ({', '.join(hooks)}): an "
                         "ahead-of-time compiled call runs its forward alone and would skip them; remove "
                         "them or compile it with gem_parallel.compile_blocks")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
