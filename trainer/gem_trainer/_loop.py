"""The training loop: compose data, model, precision, parallel and checkpoint modules.

Order of construction follows torchtitan: config → process group → data → model (single
device code) → precision conversion → parallelisation (gem_parallel, from outside) →
optimizer → checkpointer → resume. The loop itself only moves batches, steps and books.

Reliability rules (DESIGN.md §4 trainer):
- SIGTERM/SIGINT: finish the current step, save a checkpoint, exit 0.
- A non-finite loss skips the optimizer step (the gradients are dropped) and is counted;
  `max_bad_steps` in a row stop the run after saving the last good state. The skip is
  decided on the device and the host learns of it one step late, so a steady-state step
  never waits on the GPU (issue #16 item 3; `_settle_now` says which steps are read at once).
- Checkpoints are async (gem_checkpoint); resume restores model, optimizer, loader
  position, RNG and step, so a resumed run repeats the uninterrupted run's losses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gem_data
import gem_kernels
import gem_model
from gem_checkpoint import Checkpointer, RNGState
from gem_trainer._gc import GcWatch
from gem_trainer._metrics import WARMUP_STEPS, MetricLog, Timers, mfu, slow_steps
from gem_trainer._optim import Optimizers, RowWiseAdagrad, dense_adamw, embedding_tables
from gem_trainer._stats import task_metrics
from gem_trainer.config import TrainConfig, keep_bf16_patterns, precision_recipe, resolve_ckpt_writer


class _StopFlag:
    """Set by SIGTERM/SIGINT; the loop checks it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def data_config(cfg: TrainConfig) -> gem_data.DataConfig:
    """The data preset that goes with a trainer preset."""
    if cfg.preset == "tiny":
        return gem_data.presets.tiny(seed=cfg.seed)
    return gem_data.presets.gem(seed=cfg.seed, seq_len_cap=8192)


def model_config(cfg: TrainConfig, dcfg: gem_data.DataConfig) -> gem_model.GEMConfig:
    """The model preset, with the feature sizes copied from the data config."""
    sizes: dict[str, Any] = gem_model.presets.feature_sizes(dcfg)
    make = gem_model.presets.tiny if cfg.preset == "tiny" else gem_model.presets.h200
    return make(**sizes)


def _dist_env() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world


def _setup_dist(world: int) -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend)
    return device


def _parallelize(model: Any, cfg: TrainConfig, world: int,
                 device: torch.device) -> tuple[Any, Optimizers]:
    """Applies parallelism from outside the model (gem_parallel) and builds the optimizer.
    Returns gem_parallel's `Parallelized` (the model, the blocks' ahead-of-time store, the
    checkpointable train state, the 2-D replica sync) and the optimizer.

    - sparse_sharding != "none": the torchrec tables are sharded by gem_parallel's planner
      and trained by torchrec's fused exact SGD (`sparse_lr`), in one process too (a world
      of one), so 1 and N processes compute alike.
    - sparse_mp < world: 2-D sparse parallelism (gem_parallel's DMPCollection): the tables
      are sharded over groups of sparse_mp ranks and the groups are replicas; the caller
      runs `Parallelized.replica_sync()` after every step to average the replicas.
    - world > 1: HSDP over everything else (shard inside the host, replicate across hosts).
    """
    sharded = cfg.sparse_sharding != "none"
    ebc: Any = getattr(model.sparse, "ebc", None)
    if sharded and ebc is None:
        raise ValueError(f"sparse_sharding={cfg.sparse_sharding!r} needs torchrec tables "
                         "(torchrec is not importable here); use sparse_sharding='none'")
    import gem_parallel

    precision = precision_recipe(cfg)
    fp8_min_speedup = cfg.fp8_min_speedup if cfg.precision.startswith("fp8_block") else 0.0
    apply_table_grads(model, cfg, world)  # (sparse: one process, unsharded tables)
    compile_aot = cfg.compile_aot or None  # ("" after "auto" resolved it off)
    background = cfg.compile_background and compile_aot is not None
    if world == 1 and not sharded:
        done = gem_parallel.parallelize(model, None, precision=precision, compile=cfg.compile,
                                        keep_bf16=keep_bf16_patterns(cfg), fp8_min_speedup=fp8_min_speedup,
                                        compile_aot=compile_aot, compile_background=background)
        return done, build_optimizer(done.model, cfg)
    if world == 1 and not dist.is_initialized():
        # One process with torchrec tables: a world of one, so the code path (and the
        # fused table optimizer) is the same as in the sharded multi-process run.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    dims = gem_parallel.ParallelDims.from_env(sparse_mp=cfg.sparse_mp or world).validate()
    meshes = dims.build_meshes(device.type)

    def shard_tables(m: torch.nn.Module) -> set[torch.nn.Parameter]:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        two_d = dims.sparse_model_parallel < dims.world_size
        shard = gem_parallel.shard_embeddings_2d if two_d else gem_parallel.shard_embeddings
        sparse: Any = m.sparse
        sparse.ebc = shard(
            ebc, dims, meshes, per_device_memory_bytes=_table_budget(device),
            sharding_types=[cfg.sparse_sharding],
            fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": cfg.sparse_lr},
            device=device)
        return set(sparse.ebc.parameters())

    policy = gem_parallel.BF16_MIXED if device.type == "cuda" and cfg.precision != "fp32" else None
    done = gem_parallel.parallelize(model, meshes, precision=precision, compile=cfg.compile,
                                    shard_tables=shard_tables if sharded else None,
                                    mp_policy=policy, comms=cfg.comms, keep_bf16=keep_bf16_patterns(cfg),
                                    fp8_min_speedup=fp8_min_speedup, compile_aot=compile_aot,
                                    compile_background=background)
    return done, build_optimizer(done.model, cfg, exclude=done.ignored_params)


def apply_table_grads(model: torch.nn.Module, cfg: TrainConfig, world: int) -> None:
    """Switches the model's embedding lookups to sparse gradients where `cfg.table_grads` is
    "sparse" (`gem_model.sparse_table_grads`); the tables' `RowWiseAdagrad` takes either kind.
    Refused with several processes: the tables are HSDP parameters there, and FSDP reduces
    dense gradients (config.validate already refused sharded tables)."""
    if cfg.table_grads != "sparse":
        return
    if world > 1:
        raise ValueError(f"table_grads='sparse' needs a single process (this run has {world}): with "
                         "several, the tables are HSDP parameters and FSDP reduces dense gradients")
    gem_model.sparse_table_grads(model)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig,
                    exclude: set[torch.nn.Parameter] | None = None) -> Optimizers:
    """AdamW (`lr`, warm-up + cosine schedule) for the dense parameters and row-wise Adagrad
    (`sparse_lr`) for the embedding tables; parameters in `exclude` (tables sharded by
    torchrec, trained by its fused optimizer) are left out. Why: gem_trainer._optim."""
    skip = {id(p) for p in exclude or ()}
    tables = [p for p in embedding_tables(model) if id(p) not in skip]
    skip |= {id(p) for p in tables}
    dense = dense_adamw([p for p in model.parameters() if id(p) not in skip], lr=cfg.lr)
    table_opt = RowWiseAdagrad(tables, lr=cfg.sparse_lr) if tables else None
    return Optimizers(dense, table_opt, total_steps=cfg.steps, warmup=cfg.warmup_steps,
                      final_frac=cfg.lr_final_frac)


def _compile_counts(aot: Any = None) -> dict[str, int]:
    """Graphs so far: dynamo's process-wide counters, or with `compile_aot` the blocks'
    variants (loaded + compiled: dynamo's counters do not see a loaded variant)."""
    import gem_parallel

    counts = gem_parallel.Parallelized.compile_counts()
    if aot is not None:
        counts["graphs"] = aot.stats.loaded + aot.stats.compiled
    return counts


def _compiling(aot: Any, bk: Any) -> bool:
    """Whether the blocks are still compiling in the background (`--compile-background`): a
    compile pending, or a block run eagerly since the last step booked."""
    if aot is None or not aot.background:
        return False
    calls, bk.eager_seen = bk.eager_seen, aot.stats.eager_calls
    return bool(aot.pending_compiles()) or aot.stats.eager_calls != calls


def _compile_summary(cfg: TrainConfig, timers: Timers, aot: Any = None) -> dict[str, Any]:
    """With --compile: graphs compiled and graph breaks (process-wide dynamo counters), and
    graphs compiled (or, with --compile-aot, loaded) after the warm-up steps and before the
    evaluation, per 100 steps (recompiles; 0 when the dynamic shapes cover every batch);
    with --compile-aot also what the blocks' store did (`compile_aot`: variants loaded,
    compiled, dropped as stale or unreadable, seconds, and the folder they are kept in)."""
    if not cfg.compile:
        return {}
    extra: dict[str, Any] = {"compile_aot": {**aot.stats.summary(), "dir": aot.directory}} if aot is not None else {}
    if aot is not None and aot.background:  # the first step after the warm-up (None: not reached)
        extra["compiled_from_step"] = timers.extra.get("compiled_from_step")
        extra["compile_aot"]["pending"] = aot.pending_compiles()  # still compiling at the end (e.g. the evaluation's)
    counts = _compile_counts(aot)
    late = timers.steps_done - timers.warmup
    warm = timers.extra.get("warm_graphs")  # the graph count at the end of the warm-up steps
    trained = timers.extra.get("train_graphs", counts["graphs"])  # ... and at the end of training
    per100 = 100.0 * (trained - warm) / late if warm is not None and late > 0 else None
    return {**extra, "compile_graphs": counts["graphs"], "compile_graph_breaks": counts["graph_breaks"],
            "recompiles_per_100_steps": per100}


def _ckpt_summary(ckpt: Checkpointer | None, timers: Timers, steps: int) -> dict[str, Any]:
    """What checkpoints cost this run: saves inside the loop, the median stall of one, the
    state size and the storage's write rate (last write), and the stalls' share of the
    loop's wall time (`ckpt_stall_frac`; the end of the run, its last save if the loop did not
    make it and the flush of the last write, is `ckpt_final_wait_s`), and
    the cadence the saves kept: `ckpt_steps_between_saves`, the steps this run took per save
    inside the loop (`--ckpt-every` when no save waited for a write and the run ends on a
    multiple of it; more when writes are slower than the interval)."""
    if ckpt is None:
        return {}
    saves = timers.ckpt_saves
    ran = steps - timers.start_step
    loop_s = timers.compute + timers.optimizer + timers.data_wait + timers.ckpt_stall
    return {
        "ckpt_writer": ckpt.writer,
        "ckpt_saves": len(saves),
        "ckpt_steps_between_saves": ran / len(saves) if saves else None,
        "ckpt_stall_per_save_s": statistics.median(saves) if saves else None,
        "ckpt_stall_frac": timers.ckpt_stall / loop_s if loop_s > 0 else 0.0,
        "ckpt_prepare_s": timers.extra.get("ckpt_prepare_s", 0.0),
        "ckpt_state_gb": timers.extra.get("ckpt_state_bytes", 0) / 1e9,
        "ckpt_write_gb_per_s": ckpt.last_bytes / 1e9 / ckpt.last_write_s if ckpt.last_write_s else None,
    }


def _sparse_summary(cfg: TrainConfig, world: int, synced: bool) -> dict[str, Any] | None:
    """How the tables were placed: sharding type, model-parallel group size, replicas."""
    if cfg.sparse_sharding == "none":
        return None
    mp = cfg.sparse_mp or world
    return {"sharding": cfg.sparse_sharding, "mp": mp, "replicas": world // mp, "replica_sync": synced}


def _table_budget(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * 0.5)
    return 8 << 30


def autocast_device(cfg: TrainConfig, device: torch.device) -> str | None:
    """Where the step runs under bf16 autocast: CUDA for every precision but fp32; a CPU for
    the low-precision recipes only. Their converted linears return bf16, as on the GPU, and
    the plain layers they feed (a token mix after an FP8 `wo`) must take bf16 too. Plain
    bf16 on a CPU runs in fp32 (`effective_precision`)."""
    if device.type == "cuda":
        return "cuda" if cfg.precision != "fp32" else None
    return device.type if precision_recipe(cfg) else None


def autocast(device_type: str | None) -> Any:
    """bf16 autocast on `device_type` (`autocast_device`), or a no-op context for None."""
    return torch.autocast(device_type, dtype=torch.bfloat16) if device_type else contextlib.nullcontext()


def _seed_all(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class _Window:
    """Blocks [start, start + n) of a block source: the held-out split of the synthetic task
    (the same planted function, samples the training stream never reaches)."""

    def __init__(self, source: Any, start: int, n: int) -> None:
        self.source, self.start, self.num_blocks = source, start, n

    def lengths(self, b: int) -> Any:
        return self.source.lengths(self.start + b)

    def read(self, b: int) -> Any:
        return self.source.read(self.start + b)


_BLOCK = 16  # samples per synthetic block = the base batch the balancer shuffles


def make_loader(cfg: TrainConfig, dcfg: gem_data.DataConfig, rank: int, world: int,
                 device: torch.device, *, eval_split: bool = False) -> Any:
    if cfg.data.startswith("parquet:"):
        path = cfg.data[len("parquet:"):]
        if not os.path.isdir(path):
            raise ValueError(f"data={cfg.data!r}: {path!r} is not a directory")
        # Parquet: a row group is the base batch; evaluation reads the same shards.
        source: Any = gem_data.ParquetSource(path, expect=dcfg)
        per_batch = 1
    else:
        block = min(_BLOCK, cfg.batch_size)
        source = gem_data.SyntheticSource(dcfg, block_size=block)
        per_batch = max(1, cfg.batch_size // block)
        if eval_split:
            source = _Window(source, 1 << 30, max(1, cfg.eval_batches) * per_batch * world)
    tokens = cfg.batch_tokens if cfg.batch_tokens > 0 and not eval_split else None
    return gem_data.JaggedLoader(
        source, blocks_per_batch=per_batch, tokens_per_batch=tokens, rank=rank,
        world_size=world, device=device, seed=cfg.seed, num_epochs=1 if eval_split else None,
        num_workers=2, prefetch=4)


@dataclasses.dataclass
class _Pending:
    """A queued step on its way to the host: `host` (pinned [3]: mean loss over ranks, stop
    signal, checkpoint busy) is filled behind the step's optimizer, which `opt_events[1]`
    follows; the host-side figures are booked once the values are read."""

    host: torch.Tensor | None = None
    opt_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    start_event: torch.cuda.Event | None = None  # recorded when the batch is in hand (device step time)
    t0: float = 0.0  # step start; t1: batch in hand; t2: optimizer queued from; t3: end
    t1: float = 0.0
    t2: float = 0.0
    t3: float = 0.0
    gc0: float = 0.0  # the collector's pauses so far (GcWatch.pause_s) at t0 and at t3
    gc3: float = 0.0
    samples: int = 0
    tokens: int = 0
    flops: float = 0.0
    vals: list[float] | None = None  # read already (the sharded path's synchronous check)

    def values(self) -> list[float]:
        if self.vals is None:
            if self.opt_events is not None:
                # Done, or nearly, when the next step's forward/backward has been queued.
                # An event wait is not a sync torch.cuda.set_sync_debug_mode reports.
                self.opt_events[1].synchronize()
            if self.host is None:
                raise ValueError("a _Pending needs `host` or `vals`")
            self.vals = self.host.tolist()
        return self.vals

    def gpu_s(self) -> float | None:
        """The step's device time, batch in hand to optimizer done; call after `values()`
        (both events are complete then, so this waits for nothing)."""
        if self.start_event is None or self.opt_events is None:
            return None
        return float(self.start_event.elapsed_time(self.opt_events[1])) / 1e3


@dataclasses.dataclass
class _Books:
    """The loop's host-side bookkeeping, updated as each step's values are read."""

    step: int  # optimizer steps taken (non-finite ones excluded)
    bad_in_row: int = 0
    last_loss: float = math.nan
    stop_signum: int = 0  # a stop signal seen on any rank (kept until the run stops)
    reason: str | None = None  # why the run stops now: "nan" or "signal N"
    save_due: bool = False  # checkpoint back-pressure: a due save waits for the last write
    warned_slow_ckpt: bool = False
    saved_step: int | None = None  # the step the loop's last save() wrote (or is writing)
    opt_gpu_s: float = 0.0  # optimizer time measured on the GPU, moved out of compute
    opt_timing: list[tuple[torch.cuda.Event, torch.cuda.Event]] = dataclasses.field(default_factory=list)

    def read_opt_timing(self) -> None:
        """Adds the GPU time of the optimizer steps that have finished (query: no wait)."""
        while self.opt_timing and self.opt_timing[0][1].query():  # type: ignore[no-untyped-call]
            start, end = self.opt_timing.pop(0)
            self.opt_gpu_s += start.elapsed_time(end) / 1e3


def _settle_now(cfg: TrainConfig, books: _Books, timers: Timers, ckpt: bool,
                writing: bool = False) -> bool:
    """Must the step just queued be read at its end (a wait on the GPU), rather than during
    the next step? Yes when its outcome decides what happens before the next batch is drawn
    (a checkpoint and a stop save the loader's position and the RNG, so they come right
    after the step they follow): in the warm-up steps (checkpoint buffers are prepared after
    the first, compiled graphs are counted after the last), at the last step, when a save is
    due or delayed, after a stop signal, and when one more non-finite loss would end the
    run. `books` holds the steps before this one; this one counts as step `books.step + 1`
    if its loss is finite.

    `writing`: a single-process run whose last checkpoint write is still running now. A save
    that is already due (delayed by that write) would be delayed again after this step, so
    the step need not be read at its end: the loop stays pipelined (host and device overlap)
    while it waits for the write. With
    several ranks every rank must read the same steps at their ends (the reduced values
    decide saves and stops alike), so they do not use it."""
    nxt = books.step + 1
    return (timers.steps_done < WARMUP_STEPS or nxt >= cfg.steps or bool(books.stop_signum)
            or books.bad_in_row + 1 >= cfg.max_bad_steps
            or (ckpt and ((books.save_due and not writing) or nxt % cfg.ckpt_every == 0)))


class _SyncDebug:
    """Test hook (issue #16 item 3): `GEM_SYNC_DEBUG_AFTER=N` runs every step after the first
    N completed ones under `torch.cuda.set_sync_debug_mode("error")` (CUDA only), so a host
    sync in a steady-state step raises; checkpoint saves (a deliberate copy to the host) are
    exempt. The summary's `sync_debug_steps` says how many steps ran under it."""

    def __init__(self, after: int | None) -> None:
        self.after, self.on, self.steps = after, False, 0

    @classmethod
    def from_env(cls, cuda: bool) -> _SyncDebug:
        raw = os.environ.get("GEM_SYNC_DEBUG_AFTER", "")
        if not raw:
            return cls(None)
        if not raw.isdigit():
            raise ValueError(f"GEM_SYNC_DEBUG_AFTER={raw!r} must be a step count (an int >= 0)")
        return cls(int(raw) if cuda else None)

    def maybe_start(self, steps_done: int) -> None:
        if self.after is not None and not self.on and steps_done >= self.after:
            torch.cuda.set_sync_debug_mode("error")
            self.on = True

    def count(self) -> None:
        self.steps += self.on

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        if not self.on:
            yield
            return
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("error")

    def stop(self) -> None:
        if self.on:
            torch.cuda.set_sync_debug_mode(0)
            self.on = False

    def summary(self) -> dict[str, int]:
        return {"sync_debug_steps": self.steps} if self.after is not None else {}


@dataclasses.dataclass
class _Run:
    """What `train()` builds before its first step (`_build`), in torchtitan's order."""

    cfg: TrainConfig  # with compile_aot resolved
    rank: int
    world: int
    device: torch.device
    det: bool  # torch's deterministic algorithms are on
    t_start: float  # perf_counter at train()'s start: the time to first step counts from here
    before_train: float  # the process's age then (its start and imports)
    marks: list[tuple[str, float]]  # the end of each start-up phase (summary `startup_s`)
    dcfg: gem_data.DataConfig
    model: Any
    aot: Any  # the blocks' ahead-of-time store, or None
    opt: Optimizers
    ckpt: Checkpointer | None
    ccache: dict[str, Any]  # the compile-cache file's summary keys
    sparse_sync: Callable[[], None] | None  # 2-D sparse tables: the replicas' average
    loader: Any
    state: dict[str, Any]  # what a checkpoint saves and a resume restores
    step: int  # the step the run starts from (a resume's)
    resumed_from: int | None
    precompile: Any = None  # gem_kernels.precompile.Precompile of `triton_precompile`, or None


def _build(cfg: TrainConfig, deterministic: bool | None) -> _Run:
    """Process group, start-up checks, checkpointer, model on its device, parallelisation
    and optimizer, the compile-cache file, the loader, and a resume's load."""
    from gem_trainer import _preflight
    from gem_trainer._metrics import process_age_s

    cfg.validate()
    t_start = time.perf_counter()
    before_train = process_age_s()  # the process's start and imports, before the time to first step
    rank, world = _dist_env()
    cfg = dataclasses.replace(cfg, compile_aot=_preflight.resolve_compile_aot(cfg, world, rank))
    device = _setup_dist(world)
    # First: the workers compile the kernels the first steps launch while the rest starts.
    precompile = _preflight.start_precompile(cfg, device, rank)
    # Start-up checks (unwritable directories, checkpoint-directory misuse) before the model
    # is built: refusals name the field, the CLI turns them into flags.
    _preflight.check_dirs(cfg)
    _preflight.check_export(cfg, world)
    _preflight.check_compile_aot(cfg, world)
    det = _preflight.determinism(device, deterministic)
    gem_kernels.use_gluon_jfa(cfg.jfa_gluon)  # GEM_JFA_GLUON, where set, wins
    if det and cfg.compile_background and cfg.compile_aot:
        # The step where compiled blocks take over would depend on the compile's speed.
        _preflight.say("compile_background is off under deterministic algorithms: the blocks compile "
                       "before the first step (two runs give the same bits)", rank)
        cfg = dataclasses.replace(cfg, compile_background=False)
    for note in _preflight.slow_run_notices(cfg, device):
        _preflight.say(note, rank)
    if cfg.ckpt_writer == "process" and world > 1:
        raise ValueError(f"ckpt_writer='process' works in a single process; this run has {world} ranks "
                         "(use ckpt_writer='thread' or 'auto')")
    writer = resolve_ckpt_writer(cfg.ckpt_writer, world, device)
    ckpt = (Checkpointer(cfg.ckpt_dir, keep_last=cfg.keep_last, writer=writer)  # type: ignore[arg-type]
            if cfg.ckpt_dir else None)
    _preflight.check_checkpoints(cfg, ckpt.latest() if ckpt is not None else None, rank)
    _seed_all(cfg.seed)
    # Where the time to first step goes (summary `startup_s`): the end of each start-up phase.
    marks: list[tuple[str, float]] = [("setup", time.perf_counter())]

    dcfg = data_config(cfg)
    mcfg = model_config(cfg, dcfg)
    # Built on its device: initialising the GB-sized tables on the host and copying them took
    # ~7 s of the H200 time to first step (normal_/uniform_ on CPU).
    with torch.device(device):
        model = gem_model.GEMModel(mcfg)
    marks.append(("build", time.perf_counter()))
    done, opt = _parallelize(model, cfg, world, device)
    model, aot = done.model, done.aot
    if aot is not None and aot.background and cfg.compile_background_after_first_step:
        aot.hold()  # released when the first step is booked (_Booking.settle)
    marks.append(("parallelize", time.perf_counter()))
    ccache: dict[str, Any] = {}
    if cfg.compile_cache:  # before the first step compiles anything
        from gem_trainer import _compile_cache

        ccache = _compile_cache.load(cfg.compile_cache)
        if ccache["compile_cache"].startswith("unreadable"):
            _preflight.say(f"compile_cache={cfg.compile_cache!r}: {ccache['compile_cache']}; compiling from "
                           "scratch, the file is rewritten after the warm-up", rank)
    notice = _preflight.compile_notice(cfg, device, ccache.get("compile_cache") == "loaded")
    if notice:
        _preflight.say(notice, rank)
    sparse_sync = done.replica_sync()
    loader = make_loader(cfg, dcfg, rank, world, device)

    rng = RNGState()
    state: dict[str, Any] = {"app": done.train_state(opt.optimizers),
                             "loader": loader, "rng": rng}
    step = 0
    resumed_from: int | None = None
    if cfg.resume and ckpt is not None and ckpt.latest() is not None:
        step = resumed_from = ckpt.load(state)
        _preflight.check_resumed_step(cfg, step)
        # (rank 0 reads the step's marker, as it decided the step: load() took its view)
        notice = _preflight.world_change_notice(cfg, step, ckpt.info(step).get("world_size"), world) \
            if rank == 0 else None
        if notice:
            _preflight.say(notice, rank)
    marks.append(("loader", time.perf_counter()))  # (+ the compile-cache file and a resume's load)
    return _Run(cfg=cfg, rank=rank, world=world, device=device, det=det, t_start=t_start,
                before_train=before_train, marks=marks, dcfg=dcfg, model=model, aot=aot, opt=opt,
                ckpt=ckpt, ccache=ccache, sparse_sync=sparse_sync, loader=loader, state=state,
                step=step, resumed_from=resumed_from, precompile=precompile)


class _Booking:
    """The loop's host side: books each step once its values are read (`settle`), logs it,
    saves checkpoints (or delays them while the last write runs: back-pressure), and keeps
    the run's timers, signal flag, progress display, collector watch and sync-debug hook.
    `close()` restores what it installed."""

    def __init__(self, run: _Run, step_hook: Callable[[int], None] | None) -> None:
        from gem_trainer._metrics import ProgressLine

        cfg = run.cfg
        self.run, self.step_hook = run, step_hook
        # First: it refuses a malformed GEM_SYNC_DEBUG_AFTER before anything is installed.
        self.sync_debug = _SyncDebug.from_env(run.device.type == "cuda")
        self.gcw = GcWatch()  # (started by the loop, just before its first batch)
        self.log = MetricLog(cfg.log_dir, run.rank)
        self.timers = Timers()
        self.stop = _StopFlag()
        self.stop.install()
        self.bar = _progress(cfg, run.rank, run.step)
        # No bar (stdout/stderr is a pipe or a file): a plain line every log_every steps instead.
        self.line = (ProgressLine(cfg.steps, run.step, cfg.log_every)
                     if self.bar is None and cfg.progress and run.rank == 0 else None)
        self.books = _Books(step=run.step)
        self.timers.start_step = run.step
        self.startup: dict[str, float] | None = None  # set when the first step completes
        self.eager_seen = 0  # the blocks' eager calls at the last step booked (_compiling)

    def close(self) -> None:
        self.sync_debug.stop()
        self.gcw.stop()
        self.stop.restore()
        if self.bar is not None:
            self.bar.close()

    def save_compile_cache(self) -> None:
        """Rank 0 writes the compile artifacts once, after the warm-up (or at the end of a
        shorter run), unless they came from the file: a loaded file is not rewritten."""
        cfg, ccache = self.run.cfg, self.run.ccache
        if cfg.compile_cache and self.run.rank == 0 and ccache.get("compile_cache") != "loaded" \
                and "compile_cache_saved_bytes" not in ccache:
            from gem_trainer import _compile_cache

            ccache.update(_compile_cache.save(cfg.compile_cache))

    def settle(self, p: _Pending, *, final: bool) -> None:
        """Books step `p` from its values; `final`: it is the last step queued (a save or a
        stop may follow). Not final, no save or stop can be due (see _settle_now)."""
        run, books, timers, gcw, sync_debug = self.run, self.books, self.timers, self.gcw, self.sync_debug
        cfg, ckpt = run.cfg, run.ckpt
        step_loss, stop_sum, busy_sum = p.values()
        # A step read at its end waited here for the GPU: that wait is the step's, so its
        # time ends now. (A step read during the next one waits inside the next one's window,
        # which then carries this step's tail: in steady state one GPU step per window.)
        t_end = max(p.t3, time.perf_counter()) if final else p.t3
        if stop_sum > 0:  # any rank's signal stops every rank (all read the reduced value)
            books.stop_signum = books.stop_signum or self.stop.signum or int(stop_sum)
        if not math.isfinite(step_loss):
            timers.bad_steps += 1
            books.bad_in_row += 1
            if books.bad_in_row >= cfg.max_bad_steps:
                books.reason = "nan"
            return
        books.bad_in_row = 0
        books.step += 1
        books.last_loss = step_loss
        step = books.step
        if p.opt_events is not None:
            books.opt_timing.append(p.opt_events)
        books.read_opt_timing()
        timers.data_wait += p.t1 - p.t0
        timers.compute += (p.t2 - p.t1) + (t_end - p.t3)  # queueing fwd/bwd + the wait above
        timers.optimizer += p.t3 - p.t2
        timers.samples += p.samples
        timers.tokens += p.tokens
        timers.steps_done += 1
        if self.step_hook is not None:
            self.step_hook(timers.steps_done)
        if timers.first_step is None:
            timers.first_step = t_end - run.t_start
            self.startup = _startup_phases(run.t_start, run.marks, p, t_end)
            if run.aot is not None and run.aot.background:
                run.aot.release()  # the background loads and compiles held for the first step
        timers.model_flops += 3.0 * p.flops
        timers.step_s.append(t_end - p.t0)
        timers.opt_host_s.append(p.t3 - p.t2)
        timers.gc_s.append((gcw.pause_s if final else p.gc3) - p.gc0)  # collector pauses in the window
        timers.gpu_s.append(p.gpu_s())
        if timers.steps_done == timers.warmup and _compiling(run.aot, self):
            timers.warmup += 1  # eager blocks still ran or a background compile is pending
        if cfg.compile and timers.steps_done == timers.warmup:
            if run.aot is not None and run.aot.background:
                timers.extra["compiled_from_step"] = timers.start_step + timers.steps_done + 1
            timers.extra["warm_graphs"] = _compile_counts(run.aot)["graphs"]
            self.save_compile_cache()
        if cfg.gc_freeze and timers.steps_done == timers.warmup:
            gcw.freeze()  # between step windows: booked as the run's, not a step's
        if timers.steps_done > timers.warmup:
            timers.steady_flops += 3.0 * p.flops
            timers.steady_s += t_end - p.t0
        stopping = final and books.stop_signum
        if step % cfg.log_every == 0 or step == cfg.steps or stopping:
            self.log.write(step, loss=step_loss, samples=timers.samples, tokens=timers.tokens)
        if self.line is not None:
            self.line.update(step, step_loss, p.tokens * run.world)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{step_loss:.4f}")
        if ckpt is not None and timers.steps_done == 1:
            # Allocate the (pinned) staging buffers now, in a warm-up step, not in the
            # first save: ~1 s per GB of state (3.4 s on the h200 preset). After the first
            # step, because the optimizer state exists only from then on.
            t4 = time.perf_counter()
            with sync_debug.paused():
                ckpt_bytes = ckpt.prepare(run.state)
            timers.extra["ckpt_prepare_s"] = time.perf_counter() - t4
            timers.extra["ckpt_state_bytes"] = ckpt_bytes
        if not final:
            if books.save_due:  # a delayed save waits on, this step read late (see _settle_now)
                timers.extra["ckpt_delayed_steps"] = timers.extra.get("ckpt_delayed_steps", 0) + 1
            return
        books.save_due = books.save_due or (ckpt is not None and step % cfg.ckpt_every == 0)
        if ckpt is not None and books.save_due and busy_sum > 0 and not stopping:
            # Back-pressure (issue #16): the previous write has not finished, so saving now
            # would stall training until it does. Delay the save to the first step after
            # the write ends, and say so once, with the figures.
            timers.extra["ckpt_delayed_steps"] = timers.extra.get("ckpt_delayed_steps", 0) + 1
            if not books.warned_slow_ckpt:
                books.warned_slow_ckpt = True
                done = (f"last completed write {ckpt.last_write_s:.1f} s for {ckpt.last_bytes / 1e9:.2f} GB"
                        if ckpt.last_write_s else "no write completed yet")
                print(f"gem: warning: checkpoint writes are slower than --ckpt-every={cfg.ckpt_every} "
                      f"steps: the write of step {ckpt.pending} "
                      f"({timers.extra.get('ckpt_state_bytes', 0) / 1e9:.2f} GB staged) is still running "
                      f"after {time.perf_counter() - ckpt.write_started:.1f} s ({done}); saves are "
                      "delayed until it ends", file=sys.stderr, flush=True)
        elif ckpt is not None and books.save_due:
            books.save_due = False
            t4 = time.perf_counter()
            with sync_debug.paused():
                ckpt.save(step, run.state)
            books.saved_step = step
            stall = time.perf_counter() - t4
            timers.ckpt_stall += stall
            timers.ckpt_saves.append(stall)
            if timers.steps_done > timers.warmup:
                timers.steady_s += stall  # end to end: checkpoint stalls count
        if stopping:
            books.reason = f"signal {books.stop_signum}"


def _steps(run: _Run, bk: _Booking) -> None:
    """Runs the steps until `cfg.steps`, a stop signal or too many non-finite losses.

    Dense tables (late_check): no host sync in a steady-state step (issue #16 item 3). The
    skip-or-step decision of a non-finite loss is taken on the device (Optimizers.step(skip)),
    and the step's [mean loss, stop signal, checkpoint busy] reach the host one step late:
    copied into pinned memory behind the step, read during the next step after its
    forward/backward is queued and before its optimizer (so its lr is the exact schedule
    step). Steps whose outcome decides what happens next (warm-up, the last step, a save, a
    stop, a run of bad steps about to end the run) are read at their end, as before.
    Sharded tables update inside backward (fused optimizers): there the check comes first."""
    cfg, model, opt, ckpt, world = run.cfg, run.model, run.opt, run.ckpt, run.world
    books, timers, stop = bk.books, bk.timers, bk.stop
    amp = autocast_device(cfg, run.device)
    it = iter(run.loader)
    late_check = cfg.sparse_sharding == "none"  # (2-D replica sync implies sharded tables)
    cuda = run.device.type == "cuda"
    pinned = [torch.empty(3, pin_memory=cuda) for _ in range(2)]  # double-buffered readback
    pending: _Pending | None = None
    queued = 0  # steps queued by this loop (selects the readback buffer)
    sync_debug, gcw = bk.sync_debug, bk.gcw.start()
    while books.reason is None and books.step + (pending is not None) < cfg.steps:
        sync_debug.maybe_start(timers.steps_done)
        t0 = time.perf_counter()
        gc0 = gcw.pause_s
        batch = next(it)
        t1 = time.perf_counter()
        start_event: torch.cuda.Event | None = None
        if late_check and cuda:
            start_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start_event.record()
        with autocast(amp):
            logits = model(batch)
        loss = loss_fn(logits, batch.labels)
        if late_check:
            loss.backward()  # type: ignore[no-untyped-call]
        # The mean loss over ranks decides skip-or-step on every rank alike, and a stop
        # signal seen by any rank stops every rank (rank-local decisions would
        # desynchronise the collectives). The third entry: is a checkpoint still being
        # written on this rank? Reduced with the rest, so every rank takes the same
        # save-or-delay decision. torch.full, not torch.tensor: no blocking host copy.
        busy = float(ckpt is not None and ckpt.pending is not None)
        lt = torch.stack([loss.detach().float().reshape(()),
                          torch.full((), float(stop.signum or 0), device=loss.device),
                          torch.full((), busy, device=loss.device)])
        if world > 1:
            dist.all_reduce(lt)
            lt[0] /= world
        host: torch.Tensor | None = None
        vals: list[float] | None = None
        if not late_check:
            # Sharded tables: the check comes before backward (one host sync per step).
            vals = lt.tolist()
            if not math.isfinite(vals[0]):
                opt.zero_grad(set_to_none=True)
                bk.settle(_Pending(vals=vals), final=True)
                continue
            loss.backward()  # type: ignore[no-untyped-call]
            if cuda:
                torch.cuda.synchronize()
            skip = None
        else:
            skip = ~torch.isfinite(lt[0])
            host = pinned[queued % 2]  # (the other buffer holds the pending step's values)
            queued += 1
            host.copy_(lt, non_blocking=cuda)
            if pending is not None:  # the previous step: done on the GPU by now, or nearly
                bk.settle(pending, final=False)
                pending = None
        t2 = time.perf_counter()
        opt_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if cuda:
            opt_events = (torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call]
                          torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
            opt_events[0].record()
        opt.set_step(books.step)
        opt.step(skip=skip)
        opt.zero_grad(set_to_none=True)
        if run.sparse_sync is not None:
            run.sparse_sync()  # average the 2-D replicas' tables (their fused step ran in backward)
        if opt_events is not None:
            opt_events[1].record()  # also marks the readback of `lt` done
        t3 = time.perf_counter()
        p = _Pending(host=host, opt_events=opt_events, start_event=start_event,
                     t0=t0, t1=t1, t2=t2, t3=t3, gc0=gc0, gc3=gcw.pause_s, samples=batch.num_samples, tokens=batch.num_tokens,
                     flops=_flops(model, batch), vals=vals)
        sync_debug.count()
        writing = world == 1 and ckpt is not None and ckpt.pending is not None
        if not late_check or _settle_now(cfg, books, timers, ckpt is not None, writing):
            bk.settle(p, final=True)
        else:
            pending = p
    if pending is not None:  # (not reached by the rules of _settle_now; kept for safety)
        bk.settle(pending, final=True)
        pending = None
    sync_debug.stop()
    if cuda:
        torch.cuda.synchronize()
        books.read_opt_timing()
    timers.compute -= books.opt_gpu_s
    timers.optimizer += books.opt_gpu_s


def _finish_checkpoints(run: _Run, bk: _Booking) -> None:
    """End-of-run time, not a training stall: the last step's save when the loop did not
    make it (it was delayed by a write, or the run ends off the interval; it waits for that
    write), then the flush of the last background write.

    Not when the loop's own save was of this step: that write may still be running, so
    latest() does not show it yet, and saving again wrote the whole state twice at the end of
    every run whose last step was a save (the H200's resumed run waited 14.9 s). The loop's
    saves are the same on every rank; a write's progress is not, so it must not decide a
    collective save. (A failed write raises in close.)"""
    ckpt, step = run.ckpt, bk.books.step
    if ckpt is None:
        return
    t4 = time.perf_counter()
    if step > 0 and step != bk.books.saved_step and ckpt.latest() != step:
        ckpt.save(step, run.state)
    ckpt.close()  # waits for the write; stops a writer process
    bk.timers.extra["ckpt_final_wait_s"] = time.perf_counter() - t4


def train(cfg: TrainConfig, *, deterministic: bool | None = None,
          step_hook: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Runs one training job and returns the summary dict (also printed as one JSON line).

    `deterministic`: torch's deterministic algorithms; None = on for CPU, off for CUDA
    (gem_trainer._preflight.determinism). The summary is strict JSON (no NaN/Infinity).
    `step_hook(n)`: called after the n-th completed step is booked (e.g. a profiler's
    `step()`, so a profile can skip the compile warm-up).

    The phases: `_build` (everything before the first step), `_steps` (the loop, booked by
    `_Booking.settle`), `_finish_checkpoints`, `evaluate`, `_summary`.
    """
    run = _build(cfg, deterministic)
    bk = _Booking(run, step_hook)
    try:
        try:
            _steps(run, bk)
            _finish_checkpoints(run, bk)
        finally:
            bk.close()
        timers = bk.timers
        timers.total = time.perf_counter() - run.t_start
        if run.cfg.compile:  # before the evaluation, whose no_grad variants are not recompiles
            timers.extra["train_graphs"] = _compile_counts(run.aot)["graphs"]
        bk.save_compile_cache()  # a run shorter than the warm-up
        tasks = evaluate(run.model, run.cfg, run.dcfg, run.rank, run.world, run.device,
                         autocast_device(run.cfg, run.device))
        summary = _summary(run, bk, tasks)
        _finish_background(run.aot, run.rank)
        return summary
    finally:
        bk.log.close()  # also when the loop, a checkpoint or the evaluation raised


def _finish_background(aot: Any, rank: int) -> None:
    """Waits for the blocks' background loads and compiles still running at the end (a run
    shorter than its compile): what they make is kept for the next run, and the process
    exits cleanly (the summary's `compile_aot.pending` names them)."""
    pending = aot.pending_compiles() if aot is not None and aot.background else []
    if not pending:
        return
    from gem_trainer import _preflight

    _preflight.say(f"waiting for the background load or compile of {', '.join(pending)} to finish: "
                   f"its blocks are kept in {aot.directory} for the next run", rank)
    aot.wait()


def _precompile_summary(pre: Any) -> dict[str, Any] | None:
    """`triton_precompile`'s workers at the end (gem_kernels.precompile.Precompile.wait: kernels in the
    manifest, preloaded, failed, seconds since they started); any still running are ended
    (a short run's), None when none started."""
    if pre is None:
        return None
    done: dict[str, Any] = pre.wait(timeout=5.0)
    pre.stop()
    return done


def _summary(run: _Run, bk: _Booking, tasks: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The run's summary (strict JSON), logged with the evaluation as the run's last records;
    with `export_teacher`, the trained model is saved as a teacher first."""
    from gem_trainer import _preflight
    from gem_trainer._metrics import strict

    cfg, timers, books, world = run.cfg, bk.timers, bk.books, run.world
    step, last_loss, reason = books.step, books.last_loss, books.reason or "steps"
    gcw, sync_debug = bk.gcw, bk.sync_debug
    ngpu = world if run.device.type == "cuda" else 0
    busy = timers.compute + timers.optimizer + timers.data_wait
    summary: dict[str, Any] = {
        "steps": step,
        "loss": last_loss,  # the last completed step's (null, with loss_note, if none completed)
        "stop_reason": reason,
        "bad_steps": timers.bad_steps,
        "tasks": tasks,
        "samples_per_s": timers.samples * world / busy if busy > 0 else 0.0,
        "tokens_per_s": timers.tokens * world / busy if busy > 0 else 0.0,
        "mfu": mfu(timers.model_flops * world, busy, ngpu),
        # The same over the steps after the warm-up (compilation excluded): the first
        # WARMUP_STEPS, or until the background compiles are done (`warmup_steps`).
        "mfu_steady": mfu(timers.steady_flops * world, timers.steady_s, ngpu),
        "step_s_median": statistics.median(timers.step_s) if timers.step_s else None,
        "warmup_steps": timers.warmup,
        "step_gpu_s_median": _gpu_median(timers.gpu_s[timers.warmup:]),
        # the steady steps over 1.5x the steady median (what a gap between mfu_steady and the
        # median step is made of)
        "slow_steps": slow_steps(timers, timers.warmup),
        "data_wait_frac": timers.data_wait / busy if busy > 0 else 0.0,
        "ckpt_stall_s": timers.ckpt_stall,
        "ckpt_final_wait_s": timers.extra.get("ckpt_final_wait_s", 0.0),
        **_ckpt_summary(run.ckpt, timers, step),
        **_compile_summary(cfg, timers, run.aot),
        **run.ccache,
        **sync_debug.summary(),
        **gcw.summary(timers.gc_s, timers.warmup, timers.start_step, cfg.gc_freeze),
        # steps on which a due save waited for the previous write (back-pressure, not a stall)
        "ckpt_delayed_steps": int(timers.extra.get("ckpt_delayed_steps", 0)),
        "compute_s": timers.compute,
        "optimizer_s": timers.optimizer,
        "data_wait_s": timers.data_wait,
        "time_to_first_step_s": timers.first_step,
        "startup_s": bk.startup,
        "triton_precompile": _precompile_summary(run.precompile),
        "before_train_s": run.before_train,
        "world_size": world,
        "sparse": _sparse_summary(cfg, world, run.sparse_sync is not None),
        "table_grads": cfg.table_grads,
        "device": str(run.device),
        **_preflight.run_info(cfg, run.device, run.det, run.resumed_from),
    }
    if cfg.export_teacher:
        # After evaluation, from the trained single-device model (compile is in place, so its
        # state dict is the plain GEMModel's; check_export refused world > 1 at start-up).
        import gem_transfer

        summary["teacher_export"] = str(gem_transfer.save_teacher(run.model, cfg.export_teacher))
    # Strict JSON: a missing value is null and says why (json.dumps(allow_nan=False) works).
    summary = strict(summary, {
        "loss": "no step completed" + (f" (resumed at step {step} = steps)" if run.resumed_from == cfg.steps
                                       else f" ({timers.bad_steps} non-finite)" if timers.bad_steps else ""),
        "before_train_s": "the process's start time is unreadable here (no /proc)",
        "auc_bayes": "no planted probabilities in this data (Bayes-optimal unknown)",
        "ne_bayes": "no planted probabilities in this data (Bayes-optimal unknown)",
    })
    # The loop already logged the last step's loss; the end-of-run records are the
    # evaluation (TensorBoard tags eval/<task>/<metric>) and the run's summary figures.
    if tasks:
        bk.log.write(step, eval=tasks)
    bk.log.write(step, summary={k: v for k, v in summary.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "loss"})
    return summary


def _startup_phases(t_start: float, marks: list[tuple[str, float]], first: _Pending,
                    t_end: float) -> dict[str, float]:
    """The time to first step in phases (seconds; they add up to `time_to_first_step_s`):
    setup (process group, start-up checks, the checkpointer), build (the model on its
    device), parallelize (precision, activation checkpointing, compile set-up, sharding),
    loader (the compile-cache file, the data loader, a resume's load), then the first
    completed step: first_batch (waiting for it: worker start-up), first_forward_backward
    (queueing them: dynamo tracing or loading `--compile-aot` files, inductor's and the
    kernels' compiles happen here), first_optimizer, first_wait (the device finishing the step), and
    before_first_step (the loop's own set-up, ~1 ms, and any steps that did not complete,
    e.g. a non-finite loss)."""
    out: dict[str, float] = {}
    prev = t_start
    for name, t in marks:
        out[name] = t - prev
        prev = t
    out["before_first_step"] = max(0.0, first.t0 - prev)
    out["first_batch"] = first.t1 - first.t0
    out["first_forward_backward"] = first.t2 - first.t1
    out["first_optimizer"] = first.t3 - first.t2
    out["first_wait"] = t_end - first.t3
    return {k: round(v, 4) for k, v in out.items()}


def evaluate(model: Any, cfg: TrainConfig, dcfg: gem_data.DataConfig, rank: int, world: int,
             device: torch.device, amp: str | None) -> dict[str, dict[str, float]]:
    """Per-task NE/AUC on held-out batches, next to the planted task's Bayes-optimal values."""
    if cfg.eval_batches == 0:
        return {}
    loader = make_loader(cfg, dcfg, rank, world, device, eval_split=True)
    probs, labels, truth = [], [], []
    it = iter(loader)
    with torch.no_grad():
        for _ in range(cfg.eval_batches):
            try:
                batch = next(it)
            except StopIteration:
                break
            with autocast(amp):
                logits = model(batch)
            probs.append(torch.sigmoid(logits.float()).cpu())
            labels.append(batch.labels.cpu())
            if batch.probs is not None:
                truth.append(batch.probs.cpu())
    if not probs:
        return {}
    p, y = torch.cat(probs), torch.cat(labels)
    if world > 1:
        p, y = _gather(p), _gather(y)
    t = (_gather(torch.cat(truth)) if world > 1 else torch.cat(truth)) if truth else None
    bayes = gem_data.bayes_metrics(t, y, dcfg.tasks) if t is not None else {}
    out = task_metrics(p, y, dcfg.tasks)
    for task, m in out.items():
        m["auc_bayes"] = bayes.get(task, {}).get("auc", math.nan)
        m["ne_bayes"] = bayes.get(task, {}).get("ne", math.nan)
    return out


def _gpu_median(values: list[float | None]) -> float | None:
    """The median device time of the steady steps that have one (None off CUDA)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _flops(model: Any, batch: Any) -> float:
    """Forward FLOPs of this batch from its host-side lengths (no GPU sync; issue #16),
    falling back to the device offsets when a source gives no host lengths."""
    if not hasattr(model, "flops"):
        return 0.0
    lengths = getattr(batch, "seq_lengths_host", None)
    if lengths is not None:
        return float(model.flops_for(lengths)["total"])
    return float(model.flops(batch)["total"])


def _gather(t: torch.Tensor) -> torch.Tensor:
    """All-gather of a host tensor. NCCL has no CPU backend (a CPU all_gather on an NCCL group
    fails with "No backend type associated with device type cpu"): go through the GPU."""
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else t.device
    src = t.to(dev)
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, src)
    return torch.cat(parts).to(t.device)


def _progress(cfg: TrainConfig, rank: int, step: int) -> Any:
    if not cfg.progress or rank != 0 or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=cfg.steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
