"""The teacher: a trained GEMModel, its outputs for a batch, its tables, save/load, training.

The teacher's *pooled representation* is the output of the task heads' shared bottom layer
(`model.heads.bottom`, a Linear over all final feature and sequence-summary tokens; before
its activation): one `[B, head_hidden]` vector per sample that every task tower reads. It is
captured with a forward hook, so gem_model needs no change. A model whose heads have no
`bottom` Linear falls back to the mean over the heads' input tokens (`[B, d_model]`).

The teacher training loop is deliberately small; it follows the trainer's recipe with torch's
own optimizers: Adagrad at a large step (`table_lr`, 0.1) for the embedding tables (a rare id's
row must move on its few occurrences; AdamW at a transformer's rate leaves the tail untrained,
gem_trainer/_optim.py measures it), AdamW with a linear warm-up and a cosine decay for the
rest, bf16 autocast on CUDA. The full trainer with parallelism and checkpoints is gem_trainer,
which transfer may not import (dependency direction: transfer -> model, data).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import gem_data
import gem_model

_FORMAT = "gem_transfer.teacher/1"


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under torch.compile's wrapper (OptimizedModule keeps it as `_orig_mod`)."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, nn.Module) else model


@contextlib.contextmanager
def _capture(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects the teacher's pooled representation of every forward run inside the block."""
    heads = getattr(_unwrap(model), "heads", None)
    if not isinstance(heads, nn.Module):
        raise ValueError(f"model {type(model).__name__} has no `heads` module: not a GEMModel")
    got: list[torch.Tensor] = []
    bottom = getattr(heads, "bottom", None)
    if isinstance(bottom, nn.Linear):
        def hook(_m: nn.Module, _i: Any, out: torch.Tensor) -> None:
            got.append(out.detach().float())
        handle = bottom.register_forward_hook(hook)
    else:
        def pre(_m: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]  # [B, tokens, d] feature tokens; args[1] the sequence summary
            toks = torch.cat([x, args[1].to(x.dtype)], dim=1) if args[1].numel() else x
            got.append(toks.detach().float().mean(1))
        handle = heads.register_forward_pre_hook(pre)
    try:
        yield got
    finally:
        handle.remove()


def teacher_outputs(model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher forward: (`logits [B, num_tasks]`, `representation [B, R]`), float32, no grad.

    Runs under bf16 autocast when the batch is on CUDA (as the trainer runs the model).
    """
    on_cuda = batch.dense.is_cuda
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()
    with torch.no_grad(), amp, _capture(model) as got:
        logits = model(batch).float()
    if len(got) != 1:
        raise RuntimeError(f"expected one representation per forward, captured {len(got)}")
    return logits, got[0]


def representation_dim(model: nn.Module) -> int:
    """R, the width of `teacher_outputs(...)[1]`."""
    m = _unwrap(model)
    bottom = getattr(getattr(m, "heads", None), "bottom", None)
    if isinstance(bottom, nn.Linear):
        return int(bottom.out_features)
    return int(getattr(m, "cfg").d_model)


def teacher_tables(model: nn.Module) -> dict[str, torch.Tensor]:
    """The teacher's embedding tables by feature name (+ "event" for the item-id table).

    Reads `model.sparse` (torchrec `EmbeddingBagCollection` tables `t_<name>` or one
    `nn.EmbeddingBag` per feature) and `model.events.item`. The tensors are the teacher's own
    parameters (detached views): copy them before changing them.
    """
    m = _unwrap(model)
    cfg = getattr(m, "cfg", None)
    sparse, events = getattr(m, "sparse", None), getattr(m, "events", None)
    if cfg is None or sparse is None or events is None:
        raise ValueError(f"model {type(model).__name__} is not a GEMModel (needs cfg, sparse, events)")
    out: dict[str, torch.Tensor] = {}
    ebc = getattr(sparse, "ebc", None)
    for name, _ in cfg.sparse_features:
        if ebc is not None:
            w = ebc.embedding_bags[f"t_{name}"].weight
        else:
            w = sparse.bags[name].weight
        out[name] = w.detach()
    out["event"] = events.item.weight.detach()
    return out


# ---- save / load ---------------------------------------------------------------------------

def save_teacher(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Writes `{format, config, state_dict}` with torch.save, atomically (temp file + rename)."""
    m = _unwrap(model)
    cfg = getattr(m, "cfg", None)
    if not isinstance(cfg, gem_model.GEMConfig):
        raise ValueError(f"model {type(model).__name__} has no GEMConfig `cfg`: not a GEMModel")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in m.state_dict().items()}
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    torch.save({"format": _FORMAT, "config": dataclasses.asdict(cfg), "state_dict": state}, tmp)
    os.replace(tmp, p)
    return p


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def load_teacher(path: str | os.PathLike[str], *, device: torch.device | str = "cpu",
                 **overrides: Any) -> gem_model.GEMModel:
    """A GEMModel from `save_teacher`'s file, in eval mode on `device`.

    `overrides` replace config fields that do not change the weights' shapes, e.g.
    `use_torchrec=False` or `attention_backend="reference"`.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"teacher path={str(p)!r} is not a file")
    blob = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
        raise ValueError(f"teacher path={str(p)!r} is not a gem_transfer teacher file (format {_FORMAT})")
    # a field GEMConfig no longer has (a removed option) is dropped: a change that matters to
    # the weights still fails below, in the strict load_state_dict
    known = {f.name for f in dataclasses.fields(gem_model.GEMConfig)}
    fields = {k: _tuples(v) for k, v in blob["config"].items() if k in known}
    cfg = gem_model.GEMConfig(**{**fields, **overrides})
    model = gem_model.GEMModel(cfg)
    model.load_state_dict(blob["state_dict"])
    return model.to(device).eval()


# ---- training --------------------------------------------------------------------------------

def embedding_tables(model: nn.Module) -> list[torch.Tensor]:
    """The weights of every nn.Embedding / nn.EmbeddingBag in `model`, each once."""
    out: list[torch.Tensor] = []
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and all(mod.weight is not p for p in out):
            out.append(mod.weight)
    return out


def _lr_scale(progress: float, warmup: float = 0.02, final: float = 0.1) -> float:
    """Dense lr multiplier at `progress` in [0, 1]: linear warm-up, then cosine decay to `final`."""
    if progress < warmup:
        return max(progress / warmup, 0.01)
    t = min((progress - warmup) / (1.0 - warmup), 1.0)
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t))


def train_teacher(model: nn.Module, source: Any, *, batch_blocks: int = 1, tokens_per_batch: int | None = None,
                  lr: float = 3e-3, table_lr: float | None = 0.1, max_samples: int | None = None,
                  max_seconds: float | None = None, device: torch.device | str = "cpu", seed: int = 0,
                  log_every: int = 50, log: Any = None) -> dict[str, Any]:
    """Trains `model` in place on `source` (one pass), then puts it in eval mode.

    BCE on every task, bf16 autocast on CUDA. Embedding tables: Adagrad at `table_lr` (None:
    AdamW like the rest); the other parameters: AdamW at `lr` with a linear warm-up over the
    first 2 % and a cosine decay to 10 %, driven by the progress towards whichever limit ends
    the run first (samples or seconds).
    Batches come from gem_data's `JaggedLoader` (`batch_blocks` blocks per step, or blocks up to
    `tokens_per_batch` tokens; background prefetch, async host-to-device copy).

    Args:
        model: a GEMModel (already on `device`).
        source: a block source (`num_blocks`, `lengths`, `read`): SyntheticSource (endless:
            give max_samples), ParquetSource or a BlockWindow.
        batch_blocks: blocks per step (ignored with tokens_per_batch).
        tokens_per_batch: token-budget batching (GEM-like lengths vary 100x between samples).
        lr: AdamW peak learning rate (dense parameters).
        table_lr: Adagrad learning rate of the embedding tables; None: they train with AdamW.
        max_samples: stop after this many samples (None: the whole source, which must be finite).
        max_seconds: stop after this much wall time (None: no limit); the summary says how many
            samples were actually seen.
        log: a text stream for progress lines (default stderr).

    Returns:
        {"steps", "samples", "tokens", "seconds", "samples_per_s", "final_loss", "stopped_by"}.
    """
    if batch_blocks < 1:
        raise ValueError(f"{batch_blocks=} must be >= 1")
    if tokens_per_batch is not None and tokens_per_batch < 1:
        raise ValueError(f"{tokens_per_batch=} must be >= 1 or None")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"{max_samples=} must be >= 1 or None")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"{max_seconds=} must be > 0 or None")
    if not lr > 0 or (table_lr is not None and not table_lr > 0):
        raise ValueError(f"{lr=} must be > 0 and {table_lr=} > 0 or None")
    if source.num_blocks is None and max_samples is None:
        raise ValueError("an endless source (num_blocks=None) needs max_samples")
    dev = torch.device(device)
    out = log if log is not None else sys.stderr
    budget = max_samples if max_samples is not None else source.num_blocks * int(source.lengths(0).shape[0])
    torch.manual_seed(seed)
    tables = embedding_tables(model) if table_lr is not None else []
    dense = [p for p in model.parameters() if all(p is not t for t in tables)]
    opts: list[torch.optim.Optimizer] = [torch.optim.AdamW(dense, lr=lr)]
    if table_lr is not None and tables:
        opts.append(torch.optim.Adagrad(tables, lr=table_lr))
    loader = gem_data.JaggedLoader(source, blocks_per_batch=batch_blocks, tokens_per_batch=tokens_per_batch,
                                   device=dev, num_workers=2, prefetch=4, sparse_kind="native", balance=False,
                                   num_epochs=1 if source.num_blocks is not None else None)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else contextlib.nullcontext()
    model.train()
    t0 = time.perf_counter()
    steps = samples = tokens = 0
    last, stopped = math.nan, "data"
    try:
        for batch in loader:
            elapsed = time.perf_counter() - t0
            progress = min(1.0, max(samples / budget, elapsed / max_seconds if max_seconds else 0.0))
            for g in opts[0].param_groups:
                g["lr"] = lr * _lr_scale(progress)
            with amp:
                logits = model(batch)
            loss = F.binary_cross_entropy_with_logits(logits.float(), batch.labels)
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            for o in opts:
                o.step()
            steps += 1
            samples += batch.num_samples
            tokens += batch.num_tokens
            done = samples >= budget
            over = max_seconds is not None and time.perf_counter() - t0 > max_seconds
            if steps % log_every == 0 or done or over:
                last = float(loss.detach())  # one host sync per log line
                dt = time.perf_counter() - t0
                print(f"teacher step {steps}: {samples:,}/{budget:,} samples, loss {last:.4f}, "
                      f"{samples / dt:,.0f} samples/s, {dt:.0f} s", file=out, flush=True)
            if done or over:
                stopped = "samples" if done else "seconds"
                break
    finally:
        loader.close()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    model.eval()
    dt = time.perf_counter() - t0
    return {"steps": steps, "samples": samples, "tokens": tokens, "seconds": dt,
            "samples_per_s": samples / dt if dt > 0 else 0.0, "final_loss": last, "stopped_by": stopped}
