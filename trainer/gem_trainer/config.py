"""Trainer configuration: one frozen dataclass, presets as functions, a few overrides.

Device, process groups and meshes are never config fields (STYLE.md point 5): the
launcher derives them from the environment (torchrun's RANK/WORLD_SIZE, CUDA presence).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything one training run needs.

    Attributes:
        preset: name of the model/data preset ("tiny", "h200", "multi").
        steps: optimizer steps to run (total, including resumed ones).
        batch_size: samples per rank per step (before token-budget trimming).
        batch_tokens: token budget per rank per step; 0 = no budget (fixed batch_size).
        data: "synthetic" or "parquet:DIR".
        lr: peak AdamW learning rate of the dense parameters (warm-up, then cosine decay).
        warmup_steps: linear warm-up of the dense learning rate.
        lr_final_frac: the dense learning rate decays (cosine) to this fraction of `lr`
            at the last step.
        seed: seeds the data, the model init and every RNG.
        ckpt_dir: where checkpoints go; "" disables checkpointing.
        ckpt_every: save every K steps (and at the end, and on SIGTERM).
        keep_last: checkpoints to keep.
        ckpt_writer: "auto" (the default: "process" for a single-process run on a GPU,
            "thread" otherwise), "thread" (DCP writes from a thread of the training process)
            or "process" (from a child process with its own GIL; one process only).
        resume: continue from the newest good checkpoint in ckpt_dir.
        precision: "bf16" (GPU autocast) / "fp32", or a low-precision recipe ("fp8_block*": Hopper's
            blockwise FP8, 1.02-1.09x bf16 per linear at d_model 1024 and 1.00x bf16's compiled
            h200 step with the defaults below; "mxfp8_rceil", ...: MX numerics; precision/README.md).
        keep_bf16: comma-separated fnmatch patterns of module names a low-precision recipe
            leaves in bf16. The default keeps the task heads and the linears that read
            per-sample rows rather than the token stream (interaction, summary GLUs): at a
            few thousand rows a low-precision GEMM saves less than its quantizer launches.
        fp8_min_speedup: fp8_block recipes convert only the linears whose predicted fwd+bwd
            speed-up over bf16 is at least this (`gem_precision.FP8BlockConfig.predicted_speedup`,
            an H200 cost model); the 5 % margin covers the fusions a compiled bf16 linear keeps
            and an FP8 one loses. 0 converts by size alone.
        log_dir: JSONL + TensorBoard logs; "" disables.
        log_every: metrics line every N steps.
        eval_batches: held-out batches scored at the end for NE/AUC (64 x 64 samples =
            4,096 by default: fewer move AUC by +-0.02 from noise alone).
        max_bad_steps: consecutive non-finite losses that stop the run.
        compile: wrap the model in torch.compile (GPU presets).
        compile_cache: file of torch.compile cache artifacts: loaded before the first step
            if present, written after the compile warm-up if not (carries the compile of a
            previous run to a fresh machine; "" = off; needs compile).
        compile_aot: a directory where the compiled blocks are kept ahead of time (torch's
            aot_compile, through gem_parallel.AotBlocks): a later run loads them instead of
            tracing them again with dynamo ("" = off; needs compile and one process). A block
            whose traced source changed since is compiled again, never run stale. "auto" (the
            h200 preset's default): the user's cache folder (`$GEM_CACHE_DIR/aot`, else
            `$XDG_CACHE_HOME/gem/aot`, else `~/.cache/gem/aot`) in a compiled single-process
            run with unsharded tables, off otherwise; on the H200 it took the warm first step
            from 11.5 to 8.3 s, and a filled folder copied to a machine with empty caches
            gave a first step at 15.5 s instead of ~56 s.
        compile_background: with compile_aot, a block kind runs eagerly while a background
            thread loads its variant from the folder (~1.4 s a file on an H100), or compiles
            it when none there fits, and the compiled blocks take over when ready (the h200
            preset's default): the first step comes in eager time instead of after a minute
            or more of compiling, or seconds of loading. The warm-up (and so the steady
            MFU's window) lasts until no load or compile is pending. Which step switches
            depends on how fast the thread goes, so two such runs are not bit for bit the
            same; off under --deterministic and without a compile_aot folder ("" or "auto"
            resolved off: the blocks then load or compile before the first step).
        compile_background_after_first_step: with compile_background, the background loads
            and compiles start once the first step is done (queued meanwhile): loading a
            file is Python work that shares the GIL with the first eager step, which is
            host-bound (the first launch of every kernel). False: they start at the blocks'
            first calls.
        triton_precompile: a manifest of Triton kernel specializations
            (`gem_kernels.precompile.record_compiles`) that worker processes compile into Triton's disk
            cache while the run starts, so the first steps load those kernels instead of
            compiling each one when a launch first needs it ("" = off). "auto" (the default):
            the manifest shipped with gem_trainer for this Triton version and GPU (recorded
            from the h200 preset; `gem_trainer/triton_manifests/`), where there is one; nothing
            on CPU or without one. It changes no result: a kernel the run reaches before its
            worker does compiles as it would without it.
        jfa_gluon: which of JFA's kernels run as their Gluon twins (`gem_kernels.use_gluon_jfa`,
            set for the process at start-up): "all", "off" or a comma-separated list of "fwd",
            "dkdv", "dq". Default "dkdv,dq", the backward's two kernels, where they can serve
            (a Hopper GPU, bf16/fp16, head dim 64/128, no window, the two-pass backward;
            elsewhere, CPU included, the Triton kernels run and nothing changes). On an H100
            the h200 preset's compiled step took 0.1814 s against 0.1860 s with the Triton
            kernels (36.8 -> 37.1 % steady MFU, 250 warm steps each, trainer/BENCHMARKS.md);
            the forward's twin is slower there on full attention, so it is not in the default.
            The environment variable GEM_JFA_GLUON, when set, wins.
        progress: show a progress bar when stdout is a terminal.
        gc_freeze: after the warm-up steps, one full garbage collection and `gc.freeze()`, so
            later collections skip the warm-up's long-lived objects (compiled graphs, kernels,
            modules) instead of walking them all in a steady step; the collector stays on for
            what the steady steps allocate. Off by default: on CPU no steady step held a full
            collection either way, and the GPU is not measured yet. The summary's `gc` books
            every collection's pause either way (gem_trainer._gc).
        sparse_sharding: with several processes, shard the embedding tables with torchrec
            through gem_parallel ("table_wise", "row_wise", "column_wise"; "none" = the tables
            are dense parameters under HSDP like the rest). Sharded tables train with
            torchrec's fused exact SGD at `sparse_lr`; with "none" every embedding table
            trains with row-wise Adagrad at `sparse_lr` (gem_trainer._optim says why).
        sparse_lr: learning rate of the embedding tables' optimizer (row-wise Adagrad, or
            torchrec's fused SGD when sparse_sharding is on).
        table_grads: how the embedding tables' gradients are held: "dense" (the default: one
            `[rows, dim]` tensor per table) or "sparse" (one row per looked-up id,
            `gem_model.sparse_table_grads`; row-wise Adagrad updates only those rows). Sparse
            needs one process and unsharded tables. It saves the dense gradients' memory (1.8 GB
            at the h200 preset, ~all of it zeros) but not time: on the H200 the update's
            compaction of the ids costs what the backward saves, and the step was 0.8 % slower
            (trainer/BENCHMARKS.md). Both give the same update up to float rounding.
        sparse_mp: size of the embedding model-parallel group; 0 = every rank (1-D sharding).
            Smaller (it must divide the world size): 2-D sparse parallelism, torchrec
            `DMPCollection` through gem_parallel — the tables are sharded (`sparse_sharding`)
            over groups of `sparse_mp` ranks, each group a data-parallel replica whose
            weights are averaged with the other replicas after every step.
        comms: who moves HSDP's parameter all-gathers with several processes: "nccl" (the
            process group's own collective: NCCL on GPU, gloo on CPU), "copy_engine"
            (gem_comms copy engines, SM-free) or "auto" (gem_comms decides); gradient
            reduce-scatters stay on the process group.
        export_teacher: after training and evaluation, save the trained model to this file
            as a gem_transfer teacher (`gem_transfer.load_teacher`); "" disables. One
            process only: world > 1 or torchrec-sharded tables are refused at start-up.
    """

    preset: str = "tiny"
    steps: int = 600
    batch_size: int = 64
    batch_tokens: int = 0
    data: str = "synthetic"
    lr: float = 1e-3
    warmup_steps: int = 10
    lr_final_frac: float = 0.1
    seed: int = 0
    ckpt_dir: str = ""
    ckpt_every: int = 50
    keep_last: int = 3
    ckpt_writer: str = "auto"
    resume: bool = False
    precision: str = "fp32"
    keep_bf16: str = "heads*,*interaction.*,*summary.glu"
    fp8_min_speedup: float = 1.05
    log_dir: str = ""
    log_every: int = 10
    eval_batches: int = 64
    max_bad_steps: int = 5
    compile: bool = False
    compile_cache: str = ""
    compile_aot: str = ""
    compile_background: bool = False
    compile_background_after_first_step: bool = True
    triton_precompile: str = "auto"
    jfa_gluon: str = "dkdv,dq"
    progress: bool = True
    gc_freeze: bool = False
    sparse_sharding: str = "none"
    sparse_lr: float = 0.1
    table_grads: str = "dense"
    sparse_mp: int = 0
    comms: str = "nccl"
    export_teacher: str = ""

    def validate(self) -> None:
        """Raises ValueError naming the field and the rule."""
        if self.preset not in PRESETS:
            raise ValueError(f"preset={self.preset!r} must be one of {sorted(PRESETS)}")
        for name in ("steps", "batch_size", "ckpt_every", "keep_last", "log_every", "max_bad_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")
        if self.batch_tokens < 0:
            raise ValueError(f"batch_tokens={self.batch_tokens} must be >= 0")
        if self.eval_batches < 0:
            raise ValueError(f"eval_batches={self.eval_batches} must be >= 0")
        if not (self.lr > 0):
            raise ValueError(f"lr={self.lr} must be > 0")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be an int >= 0")
        if not 0.0 <= self.lr_final_frac <= 1.0:
            raise ValueError(f"lr_final_frac={self.lr_final_frac} must be in [0, 1]")
        if self.data != "synthetic" and not self.data.startswith("parquet:"):
            raise ValueError(f"data={self.data!r} must be 'synthetic' or 'parquet:DIR'")
        if self.data.startswith("parquet:") and not self.data[len("parquet:"):]:
            raise ValueError(f"data={self.data!r}: 'parquet:' needs a directory")
        if self.resume and not self.ckpt_dir:
            raise ValueError("resume=True needs ckpt_dir")
        if self.sparse_sharding not in SPARSE_SHARDINGS:
            raise ValueError(f"sparse_sharding={self.sparse_sharding!r} must be one of {SPARSE_SHARDINGS}")
        if isinstance(self.sparse_mp, bool) or not isinstance(self.sparse_mp, int) or self.sparse_mp < 0:
            raise ValueError(f"sparse_mp={self.sparse_mp!r} must be an int >= 0 (0 = every rank)")
        if self.sparse_mp > 0 and self.sparse_sharding == "none":
            raise ValueError(f"sparse_mp={self.sparse_mp} needs sparse_sharding other than 'none' "
                             "(it sizes the group the tables are sharded over)")
        if not (self.sparse_lr > 0):
            raise ValueError(f"sparse_lr={self.sparse_lr} must be > 0")
        if self.table_grads not in TABLE_GRADS:
            raise ValueError(f"table_grads={self.table_grads!r} must be one of {TABLE_GRADS}")
        if self.table_grads == "sparse" and self.sparse_sharding != "none":
            raise ValueError(f"table_grads='sparse' needs sparse_sharding='none' (got {self.sparse_sharding!r}): "
                             "sharded tables train inside torchrec's fused backward")
        if self.ckpt_writer not in CKPT_WRITERS:
            raise ValueError(f"ckpt_writer={self.ckpt_writer!r} must be one of {CKPT_WRITERS}")
        if self.comms not in COMMS:
            raise ValueError(f"comms={self.comms!r} must be one of {COMMS}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} must be one of {PRECISIONS}")
        if not isinstance(self.keep_bf16, str) or any(not p.strip() for p in self.keep_bf16.split(",")):
            raise ValueError(f"keep_bf16={self.keep_bf16!r} must be comma-separated non-empty fnmatch patterns "
                             "(e.g. 'heads*,*interaction*')")
        if isinstance(self.fp8_min_speedup, bool) or not isinstance(self.fp8_min_speedup, (int, float)) \
                or not 0 <= self.fp8_min_speedup < float("inf"):
            raise ValueError(f"fp8_min_speedup={self.fp8_min_speedup!r} must be a finite number >= 0")
        if self.compile_cache and not self.compile:
            raise ValueError(f"compile_cache={self.compile_cache!r} needs compile=True (it caches compiled graphs)")
        if self.compile_aot and self.compile_aot != AOT_AUTO and not self.compile:
            raise ValueError(f"compile_aot={self.compile_aot!r} needs compile=True (it keeps compiled blocks)")
        if self.triton_precompile not in ("", "auto") and not os.path.isfile(self.triton_precompile):
            raise ValueError(f"triton_precompile={self.triton_precompile!r} must be '', 'auto' or a manifest "
                             "file (gem_kernels.precompile.record_compiles writes one); no such file")
        if not isinstance(self.jfa_gluon, str):
            raise ValueError(f"jfa_gluon={self.jfa_gluon!r} must be a string: 'all', 'off' or a comma-separated "
                             "list of 'fwd', 'dkdv', 'dq'")
        from gem_kernels._gluon_jfa import kernels_named  # the switch's own rule

        kernels_named(self.jfa_gluon, "jfa_gluon")
        if self.export_teacher and self.sparse_sharding != "none":
            # torchrec's sharded tables are not a plain GEMModel state dict (save_teacher's format)
            raise ValueError(f"export_teacher={self.export_teacher!r} needs sparse_sharding='none' "
                             f"(got {self.sparse_sharding!r}): a teacher file holds unsharded tables")



def keep_bf16_patterns(cfg: TrainConfig) -> tuple[str, ...]:
    """cfg.keep_bf16 as the patterns gem_parallel.parallelize takes."""
    return tuple(p.strip() for p in cfg.keep_bf16.split(","))


COMMS = ("nccl", "copy_engine", "auto")
CKPT_WRITERS = ("auto", "thread", "process")
SPARSE_SHARDINGS = ("none", "table_wise", "row_wise", "column_wise")
TABLE_GRADS = ("dense", "sparse")
# compile_aot's default in the h200 preset: the user's cache folder where the run can use one
# (gem_trainer._preflight.resolve_compile_aot).
AOT_AUTO = "auto"


def resolve_ckpt_writer(writer: str, world: int, device: torch.device) -> str:
    """The checkpoint writer a run uses: `writer`, with "auto" made concrete.

    "auto" is "process" for one process on a CUDA device (on the H200 a 3.3 GB write in a
    thread of the training process ran >12 s beside training instead of ~6 s alone, so
    --ckpt-every 50 saved every 100 steps; in its own process it kept every 50th), and
    "thread" otherwise: several ranks (the process writer is single-process only) and CPU
    runs (small states, and the training thread drops the GIL inside its torch ops).
    """
    if writer != "auto":
        return writer
    return "process" if world == 1 and device.type == "cuda" else "thread"


# The mxfp8_* / fp8_block* values are gem_precision recipe names (`gem_precision.convert`),
# passed through as is. fp8_block*: Hopper's blockwise FP8; mxfp8_*: MX numerics (precision/README.md).
PRECISIONS = ("fp32", "bf16", "mxfp8_floor", "mxfp8_rceil", "mxfp8_rceil_wgrad_bf16",
              "fp8_block", "fp8_block_wgrad_bf16")


def precision_recipe(cfg: TrainConfig) -> str | None:
    """The gem_precision recipe `cfg.precision` names (its linears are converted), or None for
    fp32 and bf16 (no conversion: bf16 is autocast at run time)."""
    return None if cfg.precision in ("fp32", "bf16") else cfg.precision


def tiny(**overrides: object) -> TrainConfig:
    """CPU default: the tiny model on the embedded synthetic task, about a minute on 2 cores."""
    return dataclasses.replace(TrainConfig(), **overrides)  # type: ignore[arg-type]


def h200(**overrides: object) -> TrainConfig:
    """One H200: the h200 model preset, GEM-like lengths, bf16, compiled blocks.

    compile=True: on the H200 the steady step is 0.290 s compiled against 0.381 s eager
    (steady MFU 28.9 % vs 21.9 %, 2026-11-30, trainer/BENCHMARKS.md), for ~80 s of compiling
    before the first step; `--no-compile` for short runs. The `multi` preset keeps eager
    until it is measured on several GPUs."""
    # lr: the d_model-1024 model diverges from what it learns at the tiny model's 1e-3 (held-out
    # mean AUC after 80 steps on the H200: 1e-3 0.599, 3e-4 0.663, 1e-4 0.716; trainer/BENCHMARKS.md).
    base = TrainConfig(preset="h200", steps=1000, batch_size=64, batch_tokens=262144,
                       lr=1e-4, precision="bf16", ckpt_every=100, log_every=20,
                       eval_batches=64, compile=True, compile_aot=AOT_AUTO, compile_background=True)
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def multi(**overrides: object) -> TrainConfig:
    """Several GPUs (torchrun): the h200 model with HSDP + table-wise sparse sharding over
    every rank (add `sparse_mp=<ranks per group>` for 2-D sparse parallelism)."""
    base = dataclasses.replace(h200(), preset="multi", sparse_sharding="table_wise", compile=False,
                               compile_aot="", compile_background=False)
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


PRESETS = {"tiny": tiny, "h200": h200, "multi": multi}
