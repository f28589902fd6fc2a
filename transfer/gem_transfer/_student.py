"""The student value model: pooled embeddings + an MLP, a small fraction of the teacher's FLOPs.

Inputs per sample (all pooled, no attention):
    sparse ids      mean of each feature's id embeddings                  [K * E]
    event history   mean item embedding over all events, and over the last `recent`
                    events                                                [2 * E_event]
    event types     share of each event type among the last `recent_types` events
    length          log1p(history length) / 8
    dense, domain   raw dense features, one-hot domain
    teacher repr    (representation transfer) the teacher's pooled representation,
                    standardized per dimension with the training set's mean and std
                    (`set_repr_stats`); at serving time it comes from the score shards
                    (precomputed by the teacher), so it costs the student no teacher FLOPs.
Then `hidden` ReLU layers and one logit per task.

Parameter sharing: `share="frozen"` uses the teacher's embedding tables as fixed buffers
(widths are the teacher's), `share="finetune"` copies them as trainable initial values;
`"none"` learns own tables of width `emb_dim`.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_SHARE = ("none", "frozen", "finetune")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudentConfig:
    """Sizes of a `Student`.

    Attributes:
        emb_dim: width of the student's own embedding tables (share="none").
        hidden: widths of the MLP's hidden ReLU layers.
        recent: most recent events pooled separately from the whole history.
        recent_types: most recent events whose event-type shares are features.
        repr_dim: width of the teacher representation input; 0 = no representation input.
        share: "none" (own tables), "frozen" (the teacher's tables, fixed) or "finetune"
            (the teacher's tables as trainable initial values).
    """

    emb_dim: int = 16
    hidden: tuple[int, ...] = (64, 32)
    recent: int = 8
    recent_types: int = 16
    repr_dim: int = 0
    share: str = "none"

    def __post_init__(self) -> None:
        for name in ("emb_dim", "recent", "recent_types"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"StudentConfig.{name}={v!r} must be an int >= 1")
        if isinstance(self.repr_dim, bool) or not isinstance(self.repr_dim, int) or self.repr_dim < 0:
            raise ValueError(f"StudentConfig.repr_dim={self.repr_dim!r} must be an int >= 0")
        if not self.hidden or any(not isinstance(h, int) or h < 1 for h in self.hidden):
            raise ValueError(f"StudentConfig.hidden={self.hidden!r} must be non-empty ints >= 1")
        if self.share not in _SHARE:
            raise ValueError(f"StudentConfig.share={self.share!r} must be one of {_SHARE}")


def _recent_positions(offsets: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions of the last min(len, k) events of each sequence, their sample, and the counts."""
    lengths = offsets[1:] - offsets[:-1]
    cnt = lengths.clamp(max=k)
    b = lengths.shape[0]
    sample = torch.repeat_interleave(torch.arange(b, device=offsets.device), cnt)
    start = torch.cumsum(cnt, 0) - cnt
    within = torch.arange(sample.shape[0], device=offsets.device) - start[sample]
    return offsets[1:][sample] - cnt[sample] + within, sample, cnt


class Student(nn.Module):
    """Pooled-embedding MLP ranker: `student(batch, repr=None) -> logits [B, num_tasks]`.

    Args:
        cfg: sizes (StudentConfig).
        features: the data's feature sizes: any object with `event_vocab`, `num_event_types`,
            `sparse_features`, `num_dense`, `num_domains`, `tasks` (a gem_data.DataConfig or
            gem_model.GEMConfig).
        tables: the teacher's tables by name (`teacher_tables(model)`), needed when
            cfg.share != "none".
    """

    repr_mean: torch.Tensor
    repr_std: torch.Tensor

    def __init__(self, cfg: StudentConfig, features: Any, tables: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.names = [str(n) for n, _ in features.sparse_features]
        self.num_types = int(features.num_event_types)
        self.num_domains = int(features.num_domains)
        self.num_dense = int(features.num_dense)
        self.num_tasks = len(features.tasks)
        vocabs = {str(n): int(v) for n, v in features.sparse_features}
        vocabs["event"] = int(features.event_vocab)
        if cfg.share != "none":
            if tables is None:
                raise ValueError(f"StudentConfig.share={cfg.share!r} needs the teacher's tables (tables=None)")
            missing = [n for n in vocabs if n not in tables]
            if missing:
                raise ValueError(f"tables lacks {missing} (have {sorted(tables)})")
            for n, v in vocabs.items():
                if tables[n].shape[0] != v:
                    raise ValueError(f"tables[{n!r}].shape={tuple(tables[n].shape)} must have {v} rows (the vocab)")
        self.weights = nn.ParameterDict()
        for n, v in vocabs.items():
            if cfg.share == "none":
                w = torch.empty(v, cfg.emb_dim)
                nn.init.normal_(w, std=0.05)
                self.weights[n] = nn.Parameter(w)
            elif cfg.share == "finetune":
                assert tables is not None
                self.weights[n] = nn.Parameter(tables[n].detach().float().clone())
            else:
                assert tables is not None
                self.register_buffer(f"frozen_{n}", tables[n].detach().float().clone())
        widths = {n: int(self.table(n).shape[1]) for n in vocabs}
        self.widths = widths
        fan_in = (sum(widths[n] for n in self.names) + 2 * widths["event"] + self.num_types + 1
                  + self.num_dense + self.num_domains + cfg.repr_dim)
        # per-dimension standardization (not LayerNorm: a per-sample norm would erase the
        # scale of a dimension that carries the teacher's logit)
        self.register_buffer("repr_mean", torch.zeros(cfg.repr_dim))
        self.register_buffer("repr_std", torch.ones(cfg.repr_dim))
        layers: list[nn.Module] = []
        dims = (fan_in, *cfg.hidden)
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], self.num_tasks))
        self.mlp = nn.Sequential(*layers)
        self.fan_in = fan_in

    def set_repr_stats(self, repr: torch.Tensor) -> None:
        """Sets the representation's standardization from training samples `repr [N, repr_dim]`."""
        if repr.dim() != 2 or repr.shape[1] != self.cfg.repr_dim:
            raise ValueError(f"repr.shape={tuple(repr.shape)} must be [N, repr_dim={self.cfg.repr_dim}]")
        r = repr.detach().to(self.repr_mean.device, torch.float32)
        self.repr_mean.copy_(r.mean(0))
        self.repr_std.copy_(r.std(0).clamp(min=1e-6) if r.shape[0] > 1 else torch.ones_like(self.repr_mean))

    def table(self, name: str) -> torch.Tensor:
        """The embedding table used for `name` (a feature name or "event")."""
        t: torch.Tensor = getattr(self, f"frozen_{name}") if self.cfg.share == "frozen" else self.weights[name]
        return t

    def features(self, batch: Any, repr: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP input `[B, fan_in]`."""
        offs = batch.seq_offsets
        b = offs.shape[0] - 1
        if (self.cfg.repr_dim > 0) != (repr is not None):
            raise ValueError(f"repr is {'None' if repr is None else 'given'} but StudentConfig.repr_dim="
                             f"{self.cfg.repr_dim} (a representation input needs repr [B, repr_dim])")
        parts: list[torch.Tensor] = []
        jt = batch.sparse.to_dict()
        for n in self.names:
            f = jt[n]
            parts.append(F.embedding_bag(f.values(), self.table(n), f.offsets(), mode="mean",
                                         include_last_offset=True))
        item = self.table("event")
        parts.append(F.embedding_bag(batch.event_ids, item, offs, mode="mean", include_last_offset=True))
        pos, sample, cnt = _recent_positions(offs, self.cfg.recent)
        denom = cnt.clamp(min=1).unsqueeze(1).to(item.dtype)
        recent = torch.zeros(b, item.shape[1], dtype=item.dtype, device=item.device)
        parts.append(recent.index_add_(0, sample, item[batch.event_ids[pos]]) / denom)
        pos_t, sample_t, cnt_t = _recent_positions(offs, self.cfg.recent_types)
        onehot = F.one_hot(batch.event_types[pos_t], self.num_types).to(item.dtype)
        types = torch.zeros(b, self.num_types, dtype=item.dtype, device=item.device).index_add_(0, sample_t, onehot)
        parts.append(types / cnt_t.clamp(min=1).unsqueeze(1).to(item.dtype))
        parts.append(torch.log1p((offs[1:] - offs[:-1]).to(item.dtype)).unsqueeze(1) / 8.0)
        if self.num_dense:
            parts.append(batch.dense.to(item.dtype))
        parts.append(F.one_hot(batch.domain, self.num_domains).to(item.dtype))
        if repr is not None:
            if repr.shape != (b, self.cfg.repr_dim):
                raise ValueError(f"repr.shape={tuple(repr.shape)} must be [B={b}, repr_dim={self.cfg.repr_dim}]")
            parts.append((repr.to(item.dtype) - self.repr_mean) / self.repr_std)
        return torch.cat(parts, dim=1)

    def forward(self, batch: Any, repr: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.features(batch, repr))
        return out

    def num_params(self) -> dict[str, int]:
        """{"total": every weight the served model holds (frozen tables included),
        "trainable": those the optimizer updates, "dense": those outside the tables}."""
        tables = sum(self.table(n).numel() for n in self.widths)
        dense = sum(p.numel() for n, p in self.named_parameters() if not n.startswith("weights."))
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return {"total": tables + dense, "trainable": trainable, "dense": dense}

    def flops_per_sample(self, mean_len: float, mean_sparse_len: float) -> dict[str, float]:
        """Forward FLOPs per sample: "matmul" (the MLP, gem_model's convention: matrix products
        at 2 FLOPs per multiply-add) and "pooling" (embedding-bag adds, not counted by the
        teacher's figure either), for the given mean history length and ids per sparse feature."""
        dims = (self.fan_in, *self.cfg.hidden, self.num_tasks)
        mm = sum(2.0 * a * b for a, b in zip(dims[:-1], dims[1:]))
        pool = (mean_sparse_len * sum(self.widths[n] for n in self.names)
                + (mean_len + min(mean_len, self.cfg.recent)) * self.widths["event"])
        return {"matmul": mm, "pooling": pool, "total": mm + pool}


def cpu_latency(fn: Callable[[], Any], batch_size: int, *, reps: int = 5, warmup: int = 1) -> float:
    """Median wall seconds per sample of `fn()` (one forward of `batch_size` samples), no grad."""
    if batch_size < 1 or reps < 1:
        raise ValueError(f"{batch_size=} and {reps=} must be >= 1")
    times = []
    with torch.no_grad():
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times) / batch_size
