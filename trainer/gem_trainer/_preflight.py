"""Start-up checks and run-level switches: what a user can get wrong is refused (or said)
before the model is built, not discovered as a traceback after the training.

- Checkpoint directory misuse (`check_dirs`, `check_checkpoints`): an unwritable directory,
  a new run into a directory that holds checkpoints (refused: it would overwrite them), a
  resume whose checkpoint is already past `steps` (refused), a resume with nothing to
  resume (a notice on stderr; the run starts at step 0, so one command line both starts a
  job and restarts it after a preemption, as torchtitan's `--checkpoint.enable` does).
- Reproducibility (`determinism`): torch's deterministic algorithms, on by default on CPU.
  The cause of the CPU drift: the backward of an index with repeated indices (`gamma[sample]`
  in the personalized FFN, `x[idx]` generally) is `index_put_(accumulate=True)`, which ATen
  runs on several threads with atomic float adds unless deterministic algorithms are on; the
  order of the adds, hence the rounding, depended on thread timing (machine load).
- Slow runs (`slow_run_notices`): emulated MXFP8, bf16 that runs as fp32, GPU presets on CPU.

Messages name config fields (`ckpt_dir=...`); the CLI rewrites them to flags (`--ckpt-dir`)
in one place (gem_trainer.__main__.cli_message).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch

from gem_trainer.config import AOT_AUTO, TrainConfig, precision_recipe


# How notices name settings: field names for library callers; the CLI installs its
# field -> flag rewrite (gem_trainer.__main__.cli_message) so they name flags there.
render: Callable[[str], str] = str


def say(msg: str, rank: int = 0) -> None:
    """A notice for the user on stderr (rank 0 only)."""
    if rank == 0:
        print(f"gem: note: {render(msg)}", file=sys.stderr, flush=True)


def compile_notice(cfg: TrainConfig, device: torch.device, cache_loaded: bool) -> str | None:
    """What to say before a compiled GPU run's first step, which comes only after
    torch.compile's warm-up (otherwise the run is silent for a minute), or None."""
    if not (cfg.compile and device.type == "cuda"):
        return None
    if cache_loaded:
        msg = "compile=True: compiling with the loaded compile_cache (~25 s to the first step on an H200)"
    elif cfg.compile_aot and cfg.compile_background:
        msg = (f"compile=True, compile_aot={cfg.compile_aot!r}, compile_background=True: the first steps run "
               "eager blocks while a background thread loads the compiled blocks an earlier run kept there "
               "(~1.4 s a kind on an H100) or compiles those not kept there (a minute or more); the compiled "
               "blocks take over when ready")
    elif cfg.compile_aot:
        msg = (f"compile=True, compile_aot={cfg.compile_aot!r}: the first step comes after a warm-up "
               "that loads the blocks an earlier run compiled there (on an H200 ~7-8 s; ~16 s on a "
               "machine with empty caches) or compiles and keeps them (~60-75 s); compile=False starts "
               "at once with ~30 % slower steps")
    else:
        msg = ("compile=True: the first step comes after torch.compile's warm-up (on an H200 ~65-100 s "
               "with empty caches, ~12-18 s warm); compile_cache carries a compile to a fresh machine, "
               "compile=False starts at once with ~30 % slower steps")
    return msg + (BYTECODE_NOTE if sys.dont_write_bytecode else "")


# Said with the compile notice where Python writes no bytecode caches: the lent H200 box sets
# PYTHONDONTWRITEBYTECODE=1 and ships torch without .pyc files, so every process compiled
# torch's Python from source: `import torch, torch._dynamo, torch._inductor.codecache,
# torch._functorch.aot_autograd` took 13.2 s there against 2.8 s with a bytecode folder, and a
# warm 2-step h200 run 22-24 s of wall time against 12 s (trainer/BENCHMARKS.md, 2026-12-05).
BYTECODE_NOTE = ("; Python writes no bytecode caches here (PYTHONDONTWRITEBYTECODE), so every start "
                 "compiles torch's own Python again (~10 s of a warm start's wall time on the H200 box): "
                 "unset it and set PYTHONPYCACHEPREFIX to a writable folder to keep them")


def check_writable(field: str, path: str) -> None:
    """Creates `path` if needed and writes (then removes) a probe file in it.

    Raises ValueError naming the field, the path and the OS error: at start-up, not at the
    first checkpoint after the whole training.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{field}={path!r} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{field}={path!r} cannot be created: {e.strerror or e} "
                         f"({type(e).__name__}); pick a directory you can write to") from None
    probe = os.path.join(path, f".gem_write_probe.{os.getpid()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"{field}={path!r} is not writable: {e.strerror or e} "
                         f"({type(e).__name__}); pick a directory you can write to") from None


def check_dirs(cfg: TrainConfig) -> None:
    """Every directory the run writes into exists (or can be made) and is writable."""
    if cfg.ckpt_dir:
        check_writable("ckpt_dir", cfg.ckpt_dir)
    if cfg.log_dir:
        check_writable("log_dir", cfg.log_dir)
    if cfg.compile_cache:
        if os.path.isdir(cfg.compile_cache):
            raise ValueError(f"compile_cache={cfg.compile_cache!r} is a directory; give a file path")
        check_writable("compile_cache", os.path.dirname(os.path.abspath(cfg.compile_cache)))
    if cfg.compile_aot:
        check_writable("compile_aot", cfg.compile_aot)


def aot_cache_dir() -> str:
    """Where compile_aot="auto" keeps the compiled blocks: `$GEM_CACHE_DIR/aot`, else
    `$XDG_CACHE_HOME/gem/aot`, else `~/.cache/gem/aot`. (gem_parallel.AotBlocks adds a folder
    per torch, Python and GPU, so one cache serves several installs.)"""
    root = os.environ.get("GEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gem")
    return os.path.join(root, "aot")


def resolve_compile_aot(cfg: TrainConfig, world: int, rank: int = 0) -> str:
    """`compile_aot` as the run uses it: a folder, or "" (off). "auto" is the cache folder in
    a compiled single-process run with unsharded tables and off otherwise (HSDP's hooks and
    torchrec's sharded modules are not what an ahead-of-time block can carry), and off with
    a notice when that folder cannot be written: the user did not ask for it, so it never
    stops a run. Anything else is the user's folder, checked by check_dirs/check_compile_aot."""
    if cfg.compile_aot != AOT_AUTO:
        return cfg.compile_aot
    if not cfg.compile or world > 1 or cfg.sparse_sharding != "none":
        return ""
    path = aot_cache_dir()
    try:
        check_writable("compile_aot", path)
    except ValueError as e:
        say(f"{e}; compile_aot='auto' is off for this run (set compile_aot to a writable folder, "
            "or GEM_CACHE_DIR)", rank)
        return ""
    return path


# The Triton manifests shipped with the trainer (`triton_precompile="auto"`), one per Triton
# version and GPU target, recorded from the h200 preset (tools/triton_compiles.py --record).
MANIFESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_manifests")


def start_precompile(cfg: TrainConfig, device: torch.device, rank: int = 0) -> Any:
    """Starts `triton_precompile`'s workers (gem_kernels.precompile.start_precompile) and returns its
    `Precompile`, or None: off, not on CUDA, no shipped manifest for this Triton and GPU
    ("auto"), or not the host's first process (`LOCAL_RANK` 0 starts them for every rank
    on the host: they fill the disk cache the host's processes share)."""
    if not cfg.triton_precompile or device.type != "cuda" or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    import gem_kernels.precompile

    path = cfg.triton_precompile
    if path == "auto":
        name = gem_kernels.precompile.manifest_name()
        if name is None or not os.path.isfile(os.path.join(MANIFESTS, name)):
            return None
        path = os.path.join(MANIFESTS, name)
    try:
        return gem_kernels.precompile.start_precompile(path)
    except ValueError as e:  # a user's manifest that is not one: the field, then the rule
        raise ValueError(f"triton_precompile={cfg.triton_precompile!r}: {e}") from e


def check_compile_aot(cfg: TrainConfig, world: int) -> None:
    """`compile_aot`: one process (gem_parallel refuses it with HSDP, which works through
    hooks on the blocks that an ahead-of-time call skips)."""
    if cfg.compile_aot and world > 1:
        raise ValueError(f"compile_aot={cfg.compile_aot!r} needs one process (world size {world}): "
                         "HSDP works through hooks on the blocks, which it skips; drop it for torchrun jobs")


def check_export(cfg: TrainConfig, world: int) -> None:
    """`export_teacher`: one process (a teacher file holds the whole model, and gathering FSDP
    shards for it is not built), a path that is not a directory, a writable parent."""
    if not cfg.export_teacher:
        return
    if world > 1:
        raise ValueError(f"export_teacher={cfg.export_teacher!r} needs one process (world size "
                         f"{world}): export from a single-process run")
    if os.path.isdir(cfg.export_teacher):
        raise ValueError(f"export_teacher={cfg.export_teacher!r} is a directory; give a file path")
    check_writable("export_teacher", os.path.dirname(os.path.abspath(cfg.export_teacher)))


def check_checkpoints(cfg: TrainConfig, latest: int | None, rank: int = 0) -> None:
    """Refuses checkpoint-directory misuse, given the newest committed step in `ckpt_dir`.

    - no resume, checkpoints present: refused (the new run would overwrite them);
    - resume, none present: a notice, the run starts at step 0;
    - resume, the checkpoint is past `steps`: refused (there is nothing to train, and the
      summary would describe a run that never happened);
    - resume, the checkpoint is at `steps`: a notice, no step runs, evaluation only.
    """
    if not cfg.ckpt_dir:
        return
    if latest is None:
        if cfg.resume:
            say(f"resume=True: no checkpoint in ckpt_dir={cfg.ckpt_dir!r} yet; starting at step 0", rank)
        return
    if not cfg.resume:
        raise ValueError(
            f"ckpt_dir={cfg.ckpt_dir!r} holds checkpoints (newest: step {latest}) and a new run "
            f"would overwrite them: pass resume=True to continue that run, or another or an "
            f"empty ckpt_dir to start a new one")
    if latest > cfg.steps:
        raise ValueError(
            f"steps={cfg.steps} is below the checkpoint's step {latest} in ckpt_dir={cfg.ckpt_dir!r}: "
            f"the run is already past it; pass `steps` > {latest} to train further, or another or "
            f"an empty ckpt_dir to start a new run")
    if latest == cfg.steps:
        say(f"the checkpoint in ckpt_dir={cfg.ckpt_dir!r} is already at steps={cfg.steps}: "
            "no step to run, evaluating only", rank)


def check_resumed_step(cfg: TrainConfig, step: int) -> None:
    """After loading: the loaded step (maybe an older one than latest()) is not past `steps`."""
    if step > cfg.steps:
        raise ValueError(f"steps={cfg.steps} is below the loaded checkpoint's step {step} in "
                         f"ckpt_dir={cfg.ckpt_dir!r}; pass `steps` > {step} to train further")


def world_change_notice(cfg: TrainConfig, step: int, saved_world: Any, world: int) -> str | None:
    """What to say when a run resumes a checkpoint written by another number of processes
    (None when the number is the same or unknown). The model, optimizer state and data
    position carry over exactly (DCP reshards the tensors; the loader counts global blocks),
    but the batch fields are per rank, so each step now takes another global batch."""
    if not isinstance(saved_world, int) or isinstance(saved_world, bool) or saved_world == world:
        return None
    field, n, unit = (("batch_tokens", cfg.batch_tokens, "tokens") if cfg.batch_tokens
                      else ("batch_size", cfg.batch_size, "samples"))
    keep = ""
    if (n * saved_world) % world == 0:  # (the saved run's own value of the field is not recorded)
        keep = f"; {field}={n * saved_world // world} keeps it, if the saved run used {field}={n}"
    return (f"resumed step {step}, written by {saved_world} process(es), on {world}: the model, the optimizer "
            f"state and the data position carry over exactly, but {field}={n} {unit} is per rank, so a "
            f"step now takes {world}/{saved_world} of the saved run's global batch{keep}")


def determinism(device: torch.device, requested: bool | None) -> bool:
    """Turns torch's deterministic algorithms on (or leaves them off) for this run.

    `requested` None: on for CPU (a tiny-preset step: 0.106 -> 0.113 s, ~6 %), off for CUDA.
    On CUDA, True also sets CUBLAS_WORKSPACE_CONFIG (before the first cuBLAS call) and
    cuDNN's deterministic mode; ops without a deterministic CUDA kernel warn instead of
    failing (warn_only). Returns whether deterministic algorithms are on.
    """
    on = device.type != "cuda" if requested is None else requested
    if on and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(on, warn_only=device.type == "cuda")
    return on


def slow_run_notices(cfg: TrainConfig, device: torch.device) -> list[str]:
    """What will make this run slower (or other) than the user likely expects."""
    out: list[str] = []
    if device.type != "cuda":
        if precision_recipe(cfg):
            out.append(f"precision={cfg.precision!r} on CPU is emulated (gem_precision's "
                       "dequantize-and-matmul in fp32 around every converted linear, the rest "
                       "under bf16 autocast as on the GPU): expect several times the fp32 step "
                       "time; the numerics are the recipe's, the speed is not")
        elif cfg.precision == "bf16":
            out.append("precision='bf16' on CPU runs in fp32 (bf16 autocast is used on CUDA only)")
        if cfg.preset != "tiny":
            out.append(f"preset={cfg.preset!r} is sized for GPUs; on CPU a step can take minutes "
                       "(the tiny preset is the CPU one)")
    return out


def effective_precision(cfg: TrainConfig, device: torch.device) -> str:
    """The arithmetic the run really uses (the summary records it next to the requested one)."""
    if cfg.precision == "bf16" and device.type != "cuda":
        return "fp32"
    if precision_recipe(cfg) and device.type != "cuda":
        return f"{cfg.precision} (emulated)"
    return cfg.precision


def run_info(cfg: TrainConfig, device: torch.device, deterministic: bool,
             resumed_from: int | None) -> dict[str, Any]:
    """Summary keys that say how the run ran (on CUDA also how the JFA backward is picked:
    its one-pass path adds dQ with atomics, so a run is not bitwise repeatable with it).

    `model_version`: MFU counts the model's useful FLOPs (`GEMModel.flops_for`), and what is
    useful changed with the model (gem-model 0.4.0 skips the last layer's unread attention
    rows and lowered the count by 12 % at the h200 preset): compare MFU between runs of one
    model version, step times across versions."""
    import gem_model

    info: dict[str, Any] = {"precision": cfg.precision, "precision_effective": effective_precision(cfg, device),
                            "deterministic": deterministic, "resumed_from": resumed_from,
                            "model_version": gem_model.__version__}
    if device.type == "cuda":
        import gem_kernels

        info["jfa_backward"] = gem_kernels.jfa_backward_rule()
        from gem_kernels import _gluon_jfa

        # Which kernels the Gluon switch asks for (cfg.jfa_gluon, or GEM_JFA_GLUON where set);
        # each runs where it can serve (Hopper, ...), the Triton kernel elsewhere.
        info["jfa_gluon"] = ",".join(_gluon_jfa.requested_kernels()) or "off"
    return info
