"""`parallelize`: every transformation of a built single-device model, in one documented order.

torchtitan's order (the only one that composes):

1. precision conversion — MXFP8 (`gem_precision.convert_to_mxfp8`) swaps eligible
   `nn.Linear`s before anything wraps them (wrappers would hide the modules to swap);
2. activation checkpointing, 3. `torch.compile` per block, 4. torchrec sharding of the
   tables (the caller's `shard_tables`, so this package imports torchrec only when asked),
   5. HSDP (FSDP2 on the dense mesh, its all-gathers through gem_comms when `comms` says so).

With `meshes=None` (one process, no sharding) steps 4-5 are skipped and steps 2-3 apply to the
blocks directly. The model package never imports precision or parallel code: the trainer
builds the model plainly and hands it here.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import torch
import torch._functorch.config
import torch.fx.experimental._config as fx_config
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from gem_parallel._aot import AotBlocks, with_flags
from gem_parallel._dense import BF16_MIXED, apply_ac_compile, apply_hsdp, default_blocks
from gem_parallel._dims import Meshes
from gem_parallel._state import TrainState, replica_sync

MXFP8_PREFIX = "mxfp8_"
FP8_BLOCK_PREFIX = "fp8_block"


@dataclass
class Parallelized:
    """What `parallelize` returns: the model to train and what was done to it.

    Attributes:
        model: the transformed model (an FSDPModule when HSDP was applied).
        mxfp8_converted: qualified names of the linears converted to MXFP8 (empty: none).
        ignored_params: parameters left to others (torchrec-sharded tables: their fused
            optimizer trains them; the dense optimizer and FSDP must skip them).

    `train_state(optimizers)` gives what a checkpointer saves and loads; `replica_sync()`
    what the loop runs after each step with 2-D sparse tables.
    """

    model: nn.Module
    mxfp8_converted: list[str] = field(default_factory=list)
    ignored_params: set[nn.Parameter] = field(default_factory=set)
    compiled_blocks: int = 0
    aot: AotBlocks | None = None  # the blocks' ahead-of-time store (`compile_aot`), if any

    def train_state(self, optimizers: Sequence[torch.optim.Optimizer]) -> TrainState:
        """The model and `optimizers` as one DCP `Stateful` for a checkpointer
        (`gem_parallel._state.TrainState`): FQN-keyed and reshardable through torch's
        `get_state_dict`, or built module by module around torchrec-sharded tables."""
        return TrainState(self.model, optimizers)

    def replica_sync(self) -> Callable[[], None] | None:
        """With 2-D sparse tables (`shard_embeddings_2d`): the call that averages each table
        over its replica groups, to run after every optimizer step; otherwise None."""
        return replica_sync(self.model)

    @staticmethod
    def compile_counts() -> dict[str, int]:
        """torch.compile's process-wide counters: `graphs` compiled so far (one per block
        kind at the first step, then one per recompile: report the difference per 100
        steps; 0 once warm) and `graph_breaks` (0 with fullgraph)."""
        c = torch._dynamo.utils.counters
        return {"graphs": int(c["stats"]["unique_graphs"]), "graph_breaks": int(sum(c["graph_break"].values()))}


def compile_blocks(units: Sequence[tuple[nn.ModuleList, int]], backend: str, *,
                   precision: str | None = None) -> None:
    """Step 3: `torch.compile` of each (ModuleList, index) block, whole-graph, dynamic shapes.

    `fullgraph=True`: a graph break through the kernels' custom ops (or anywhere in a block)
    is an error at the first step, not a silent slowdown. `dynamic=True` from the first
    compile, so batches of any token count, batch size and max_len share one graph per block
    kind (sizes 0 and 1 still specialise). Duck sizing is off while the blocks run: it would
    give dimensions of equal value in the first batch one symbol (e.g. B+1 == the number of
    feature tokens), a Linear then pins both, and the next batch recompiles. Blocks of one
    class with the same submodules share the graph. A block that is one of torch.nn's own
    containers (`nn.Sequential`, ...) is compiled without `fullgraph`: dynamo skips frames
    in torch.nn and compiles the user code they call. The flags of `_compile_settings` are
    applied whenever a block is traced.

    Args:
        units: `(parent, index)` pairs; `parent[index]` (an `nn.Module`) is compiled in place.
        backend: a `torch.compile` backend name ("inductor", "aot_eager", ...).
        precision: the recipe the blocks were converted to (`parallelize`'s `precision`;
            None: none); it selects the compiler flags (`_compile_settings`).
    """
    if not isinstance(backend, str) or not backend:
        raise TypeError(f"backend={backend!r} must be a torch.compile backend name (a non-empty str)")
    for k, unit in enumerate(units):
        ok = (isinstance(unit, (tuple, list)) and len(unit) == 2 and isinstance(unit[0], nn.ModuleList)
              and isinstance(unit[1], int) and -len(unit[0]) <= unit[1] < len(unit[0]))
        if not ok:
            raise ValueError(f"units[{k}]={unit!r} must be a (nn.ModuleList, index) pair with the "
                             "index inside the list")
    # Every block runs the same code object, and under FSDP each block keeps its own graph:
    # dynamo's default limit of 8 entries per code object would send a model of more than
    # 8 blocks (or of 4 with a few specialisations each) back to eager at its next compile.
    limit = 4 * len(units) + 8
    if torch._dynamo.config.recompile_limit < limit:
        torch._dynamo.config.recompile_limit = limit
    flags = _compile_settings(precision)  # read once for all the blocks (with_flags copies it)
    for parent, i in units:
        block = parent[i]
        builtin = type(block).__module__.startswith("torch.nn.modules")
        block.compile(backend=backend, fullgraph=not builtin, dynamic=True)
        block._compiled_call_impl = _with_compile_settings(block._compiled_call_impl, flags)


def _low_precision(precision: str | None) -> TypeGuard[str]:
    """Whether `precision` is a `gem_precision.convert` recipe (MXFP8 or fp8_block)."""
    return precision is not None and precision.startswith((MXFP8_PREFIX, FP8_BLOCK_PREFIX))


def _compile_settings(precision: str | None = None) -> list[tuple[Any, str, Any]]:
    """The compiler flags under which the blocks are traced (all read when dynamo compiles),
    as (config module, name, value) triples:

    - duck sizing off (see `compile_blocks`);
    - `specialize_float`: with `dynamic=True` every float attribute (a LayerNorm's `eps`)
      would become a symbolic input; AOTAutograd then finds it used as a constant,
      specializes it and restarts dynamo's whole analysis, so each block kind was traced
      twice at every start, cold or warm. The blocks' floats are constants; a float that did
      vary would show as a recompile in the trainer's `recompiles_per_100_steps`;
    - AOTAutograd's cache also for graphs holding a custom `torch.autograd.Function` (the
      model's `_jagged.unique_rows`): without it that graph bypasses the cache and a warm
      start re-traces its joint forward+backward graph. The function's forward and backward
      are traced into the graph, so they are part of the cache key;
    - inductor's mix-order reduction in its non-strict mode (`INDUCTOR_ON`): the strict
      mode fuses a reduction pair only past size thresholds and guards the sizes it checked.
      On the H200 (torch 2.11) that guarded the sample count into 256..1279
      (`scheduler.py` `can_fuse`), so the h200 preset's batches of fewer than 256 samples
      (about one in ten) needed a second compiled variant of each layer kind, about a minute
      of compiling in a cold run's first steps (trainer/BENCHMARKS.md, thirty-first
      session). torch's own note on the flag: it avoids recompiles. Not for blocks converted
      to a low precision (`precision` "mxfp8_*" / "fp8_block*"): it was measured with bf16
      only, and the FP8 layers once failed inside a mix-order reduction (below), so they keep
      torch's strict mode;
    - the inductor features named in GEM_INDUCTOR_OFF off (`inductor_off`; none unless set;
      naming an `INDUCTOR_ON` feature gives it torch's default, False).
      gem-parallel 0.3.3 and 0.3.4 turned two off for every fp8_block model
      (`FP8_BLOCK_INDUCTOR_OFF`): with gem-precision 0.3.2 on the H200 (torch 2.11) the h200
      preset's fp8_block layers failed in the coalescing tiling analysis
      (`tiling_utils.get_pw_red_splits` asserts that a fused node's size hint equals
      pointwise x reduction numel) and then in a mix-order reduction's workspace `.view(...)`
      ("shape '[360, 1024]' is invalid for input of size 288"). With gem-precision 0.3.4 (no
      guard on the token count mod 128) the trainer's fp8_block_wgrad_bf16 layers compile and
      train with both on, and the step is 5 % faster than with them off, as fast as bf16's
      (trainer/BENCHMARKS.md, 2026-12-04). If a compile fails in either place again, set
      GEM_INDUCTOR_OFF=coalesce_tiling_analysis,mix_order_reduction.
    """
    flags: list[tuple[Any, str, Any]] = [(fx_config, "use_duck_shape", False),
                                         (torch._dynamo.config, "specialize_float", True)]
    if hasattr(torch._functorch.config, "autograd_cache_allow_custom_autograd_functions"):
        flags.append((torch._functorch.config, "autograd_cache_allow_custom_autograd_functions", True))
    import torch._inductor.config as inductor_config

    off = inductor_off()  # names checked there
    on = () if _low_precision(precision) else INDUCTOR_ON
    flags += [(inductor_config.triton, name, True) for name in on
              if name not in off and hasattr(inductor_config.triton, name)]
    flags += [(inductor_config.triton, name, False) for name in off]
    return flags


def settings_tag(flags: Sequence[tuple[Any, str, Any]]) -> str:
    """The compiler flags as text (`module.name=value`, sorted), for the ahead-of-time
    store's folder name: variants compiled under other flags are never loaded."""
    def where(m: Any) -> str:  # a config module, or a sub-config (`inductor_config.triton`)
        own = vars(m)
        if "_prefix" in own:
            return f"{getattr(own.get('_config'), '__name__', '?')}.{own['_prefix']}".rstrip(".")
        return str(getattr(m, "__name__", type(m).__name__))

    return ",".join(sorted(f"{where(m)}.{n}={v!r}" for m, n, v in flags))


# The inductor features that failed fp8_block layers under dynamic token counts with
# gem-precision 0.3.2 (torch 2.11, H200); the fallback to name in GEM_INDUCTOR_OFF.
FP8_BLOCK_INDUCTOR_OFF = ("coalesce_tiling_analysis", "mix_order_reduction")
# The `torch._inductor.config.triton` features turned on while the blocks compile (where the
# running torch has them); GEM_INDUCTOR_OFF can name them to keep torch's default.
INDUCTOR_ON = ("mix_order_reduction_non_strict_mode",)
INDUCTOR_OFF_ENV = "GEM_INDUCTOR_OFF"


def inductor_off() -> tuple[str, ...]:
    """The `torch._inductor.config.triton` features turned off while the blocks compile: the
    comma-separated names in the environment variable GEM_INDUCTOR_OFF (unset, "" or "none":
    none; torch's settings). The fallback if an inductor feature fails a model's compile,
    and an A/B switch (what a feature is worth to the step)."""
    env = os.environ.get(INDUCTOR_OFF_ENV)
    if env is None:
        return ()
    import torch._inductor.config as inductor_config

    names = tuple(n.strip() for n in env.split(",") if n.strip() and n.strip() != "none")
    for n in names:
        if not isinstance(getattr(inductor_config.triton, n, None), bool):
            raise ValueError(f"{INDUCTOR_OFF_ENV}={env!r}: {n!r} must name a bool of torch._inductor.config.triton "
                             f"(e.g. {','.join(FP8_BLOCK_INDUCTOR_OFF)}), or be '' / 'none'")
    return names


def _with_compile_settings(fn: Callable[..., Any] | None,
                           flags: Sequence[tuple[Any, str, Any]]) -> Callable[..., Any]:
    """`fn` (a block's compiled call) run with `flags` (`_compile_settings`) set and then
    restored (`_aot.with_flags`: plain attribute swaps, ~15 us per call on a 2-core CPU box;
    the single patch context before gem-parallel 0.3.2 took ~21 us)."""
    if fn is None:
        raise RuntimeError("nn.Module.compile set no compiled call")
    return functools.wraps(fn)(with_flags(fn, flags))


def parallelize(
    model: nn.Module,
    meshes: Meshes | None = None,
    *,
    precision: str | None = None,
    mxfp8_min_features: int = 1024,
    keep_bf16: Sequence[str] = ("heads*",),
    fp8_min_speedup: float = 0.0,
    ac: bool = False,
    compile: bool | str = False,
    shard_tables: Callable[[nn.Module], set[nn.Parameter]] | None = None,
    mp_policy: MixedPrecisionPolicy | None = BF16_MIXED,
    comms: str = "nccl",
    compile_aot: str | None = None,
    compile_background: bool = False,
) -> Parallelized:
    """Applies precision → AC → compile → table sharding → HSDP to `model` (in place).

    Args:
        model: a single-device model (blocks in `nn.ModuleList`s).
        meshes: the job's meshes (`ParallelDims.build_meshes`); None = one process, no HSDP.
        precision: None / "fp32" / "bf16" (no conversion: bf16 is autocast at run time), or
            a `gem_precision.convert` recipe: "mxfp8_*" (MXFP8) or "fp8_block*" (Hopper).
        mxfp8_min_features: linears with fewer in/out features stay bf16.
        keep_bf16: fnmatch patterns of module names never converted (the task heads).
        fp8_min_speedup: "fp8_block*" only: convert only linears whose predicted speed-up
            is at least this (`gem_precision.convert`'s min_speedup; 0: by size alone).
        ac: activation checkpointing per block. compile: `torch.compile` per block (a
            backend name or True for inductor; see `compile_blocks`).
        shard_tables: called with the model after steps 1-3; shards its embedding tables
            (e.g. `gem_parallel.shard_embeddings`) and returns the parameters it took over.
        mp_policy: FSDP2 mixed precision (None: parameters keep their dtype).
        comms: HSDP all-gather transport, see `apply_hsdp`.
        compile_aot: a directory: the blocks are compiled ahead of time and kept there
            (`gem_parallel.AotBlocks`), so a later process loads them instead of tracing
            them again. Needs `compile`; refused with HSDP (FSDP works through hooks on
            the blocks, which an ahead-of-time call skips).
        compile_background: with `compile_aot`, a block whose variant is not loaded yet
            runs eagerly while a background thread loads it from the folder, or compiles it
            when none there fits (the first step comes in eager time; which step switches to
            the compiled blocks depends on the thread's speed, so such runs are not bit for
            bit repeatable). False: the call waits for the load or the compile.

    Returns:
        `Parallelized` (the model, the converted linears, the parameters FSDP skipped).
    """
    out = Parallelized(model)
    if _low_precision(precision):
        import gem_precision

        out.mxfp8_converted = gem_precision.convert(
            model, precision, min_features=mxfp8_min_features, keep_bf16=tuple(keep_bf16),
            min_speedup=fp8_min_speedup)
    elif precision not in (None, "fp32", "bf16"):
        raise ValueError(f"precision={precision!r} must be None, 'fp32', 'bf16' or an 'mxfp8_*' / 'fp8_block*' recipe")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile={compile!r} must be a bool or a backend name")
    if meshes is None and shard_tables is not None:
        raise ValueError("shard_tables needs meshes (a process group, even a world of one)")
    if compile_background and compile_aot is None:
        raise ValueError("compile_background=True needs compile_aot (a directory): it compiles the "
                         "blocks' ahead-of-time variants in the background")
    if compile_aot is not None:
        if not compile:
            raise ValueError(f"compile_aot={compile_aot!r} needs compile (a backend name or True)")
        if meshes is not None and meshes.dense.size() > 1:
            raise ValueError(f"compile_aot={compile_aot!r} needs one process without HSDP (FSDP works "
                             f"through hooks on the blocks, which an ahead-of-time call skips); the dense "
                             f"mesh has {meshes.dense.size()} ranks")
    units = default_blocks(model)
    apply_ac_compile(units, ac, False)  # 2. (the wrappers replace the blocks in their lists)
    if compile:  # 3.
        backend = "inductor" if compile is True else compile
        if compile_aot is not None:
            # One sub-folder per model structure and precision (the repr names every
            # module class and size): other models' variants are never loaded or tried.
            # The compiler flags too (gem-parallel 0.3.10): a variant compiled under other
            # flags holds other code, and its guards do not cover the flags.
            settings = _compile_settings(precision)
            shape = hashlib.sha256(f"{model!r}|{precision}|{settings_tag(settings)}".encode()).hexdigest()[:12]
            out.aot = AotBlocks(compile_aot, backend, settings, tag=shape, background=compile_background)
            out.aot.install(units)
        else:
            compile_blocks(units, backend, precision=precision)
        out.compiled_blocks = len(units)
    if meshes is None:
        return out
    if shard_tables is not None:
        out.ignored_params = set(shard_tables(model))
    if meshes.dense.size() > 1:
        out.model = apply_hsdp(model, meshes, mp_policy=mp_policy, ac=False, compile=False,
                               ignored_params=out.ignored_params or None, comms=comms)
    return out
