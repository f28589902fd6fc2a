"""Embedding front end: sparse ids → pooled feature tokens, events → sequence tokens.

The sparse tables are a torchrec `EmbeddingBagCollection` when torchrec is importable (so
gem_parallel can shard them with torchrec's planner), else one `nn.EmbeddingBag` per feature
(the GPU box has no torchrec). Both give the same `[B, emb_dim]` mean-pooled vector per
feature; `SparseArch.forward` accepts a KeyedJaggedTensor or anything with `keys()` and
`to_dict()` (gem_data.SparseFeatures).
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gem_model import _flops, _jagged
from gem_model._config import GEMConfig


def torchrec_available() -> bool:
    return importlib.util.find_spec("torchrec") is not None


def sparse_table_grads(model: nn.Module) -> list[str]:
    """Switches `model`'s embedding lookups to sparse gradients, in place; returns the modules'
    names.

    Every `nn.Embedding` and `nn.EmbeddingBag` (also inside an unsharded torchrec
    EmbeddingBagCollection, which is built from `nn.EmbeddingBag`) then gives its weight a
    sparse COO gradient: one row per looked-up id instead of a dense `[rows, dim]` tensor
    (the 1.8 GB of zeros the h200 preset's tables would take and write every step). The
    optimizer must take sparse gradients: row-wise Adagrad (`gem_kernels.rowwise_adagrad_`)
    and `torch.optim.SparseAdam` do, AdamW does not. Not for FSDP-sharded tables (FSDP
    reduces dense gradients). Left dense: `EmbeddingBag(mode="max")` (no sparse backward)
    and lookups with a `padding_idx` (their sparse backward drops the padding rows with a
    host sync). A table whose weight is read directly (EventArch's small tables, folded into
    a GEMM) keeps a dense gradient whatever the flag.
    """
    names = []
    for name, mod in model.named_modules():
        if (isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and mod.padding_idx is None
                and getattr(mod, "mode", None) != "max"):
            mod.sparse = True
            names.append(name)
    return names


class SparseArch(nn.Module):
    """Pooled sparse embeddings, projected to d_model: `[B, num_sparse, d_model]`."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.names = [n for n, _ in cfg.sparse_features]
        use_tr = torchrec_available() if cfg.use_torchrec is None else cfg.use_torchrec
        if use_tr and not torchrec_available():
            raise ValueError("GEMConfig.use_torchrec=True but torchrec is not importable")
        self.use_torchrec = use_tr
        self.ebc: nn.Module | None = None
        self.bags = nn.ModuleDict()
        if use_tr:
            from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
            from torchrec.modules.embedding_modules import EmbeddingBagCollection

            tables = [
                EmbeddingBagConfig(
                    name=f"t_{n}", embedding_dim=cfg.emb_dim, num_embeddings=v,
                    feature_names=[n], pooling=PoolingType.MEAN,
                )
                for n, v in cfg.sparse_features
            ]
            self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        else:
            for n, v in cfg.sparse_features:
                bag = nn.EmbeddingBag(v, cfg.emb_dim, mode="mean", include_last_offset=True)
                bound = math.sqrt(1.0 / v)  # torchrec's default init, so both paths match
                nn.init.uniform_(bag.weight, -bound, bound)
                self.bags[n] = bag
        nf = len(self.names)
        self.emb_dim, self.d_model = cfg.emb_dim, cfg.d_model
        # One projection per feature, applied as one batched product.
        self.proj = nn.Parameter(torch.randn(nf, cfg.emb_dim, cfg.d_model) / math.sqrt(cfg.emb_dim))
        self.proj_bias = nn.Parameter(torch.zeros(nf, cfg.d_model))

    def pooled(self, sparse: Any) -> torch.Tensor:
        """`[B, num_sparse, emb_dim]` mean-pooled embeddings in config order."""
        if self.ebc is not None:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

            if not isinstance(sparse, KeyedJaggedTensor):
                sparse = KeyedJaggedTensor(
                    keys=list(sparse.keys()), values=sparse.values(), lengths=sparse.lengths()
                )
            d = self.ebc(sparse).to_dict()
        else:
            jt = sparse.to_dict()
            d = {}
            for n in self.names:
                f = jt[n]
                d[n] = self.bags[n](f.values(), f.offsets())
        missing = [n for n in self.names if n not in d]
        if missing:
            raise ValueError(f"batch.sparse lacks features {missing} named in GEMConfig.sparse_features")
        return torch.stack([d[n] for n in self.names], dim=1)

    def forward(self, sparse: Any) -> torch.Tensor:
        e = self.pooled(sparse)  # [B, F, E]
        out = torch.einsum("bfe,fed->bfd", e, self.proj.to(e.dtype))
        return out + self.proj_bias

    def flops(self, shapes: _flops.Shapes) -> float:
        return _flops.linear(shapes.batch * len(self.names), self.emb_dim, self.d_model)


class DenseArch(nn.Module):
    """Dense features → one token (2-layer MLP); the domain id → one token."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.num_dense, self.d = cfg.num_dense, cfg.d_model
        self.mlp: nn.Module | None = None
        if cfg.num_dense:
            self.mlp = nn.Sequential(
                nn.Linear(cfg.num_dense, cfg.d_model), nn.GELU(), nn.Linear(cfg.d_model, cfg.d_model)
            )
        self.domain = nn.Embedding(cfg.num_domains, cfg.d_model)
        nn.init.normal_(self.domain.weight, std=0.02)

    def forward(self, dense: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        toks = [self.domain(domain)]
        if self.mlp is not None:
            toks.insert(0, self.mlp(dense))
        return torch.stack(toks, dim=1)  # [B, 1 or 2, d]

    def flops(self, shapes: _flops.Shapes) -> float:
        if not self.num_dense:
            return 0.0
        b = shapes.batch
        return _flops.linear(b, self.num_dense, self.d) + _flops.linear(b, self.d, self.d)


def rank_bucket(offsets: torch.Tensor, sample: torch.Tensor, buckets: int) -> torch.Tensor:
    """Each token's rank from its sequence's newest event (0 = newest), bucketed: ranks
    below 16 are their own bucket, rank r >= 16 falls in 12 + floor(log2 r); the last
    bucket takes everything older. `sample[t]` is token t's sequence."""
    r = _jagged.recency_positions(offsets, sample.shape[0], 0, sample)  # no CLS rows here
    log_b = 12 + torch.log2(r.clamp(min=1).to(torch.float32)).long()
    return torch.where(r < 16, r, log_b).clamp(max=buckets - 1)


class EventArch(nn.Module):
    """Event tokens `[T, d_model]`: item id + event type + age bucket + rank bucket.

    Two recency signals: the age (time since the sample's newest event, log2 seconds) and
    the rank (how many events are newer: 0 for the newest; exact below 16, then log2
    buckets). Rank is what "the last k events" means; on bursty time stamps the age
    cannot tell the 8th-newest event from the 30th, the rank can.

    Event-level personalization (Kunlun): event type t keeps only the first
    `event_widths[t]` columns of its item embedding (the rest are masked to zero), so
    high-value types get wide representations and cheap types narrow ones; one shared
    projection maps the masked vector to d_model (one GEMM for all types, no host sync).
    """

    num_time_buckets = 32

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.e, self.d = cfg.event_emb_dim, cfg.d_model
        self.item = nn.Embedding(cfg.event_vocab, cfg.event_emb_dim)
        nn.init.normal_(self.item.weight, std=0.05)
        self.type_emb = nn.Embedding(cfg.num_event_types, cfg.d_model)
        self.age = nn.Embedding(self.num_time_buckets, cfg.d_model)
        self.rank: nn.Embedding | None = None
        if cfg.rank_buckets:
            self.rank = nn.Embedding(cfg.rank_buckets, cfg.d_model)
        for emb in (self.type_emb, self.age, self.rank):
            if emb is not None:
                nn.init.normal_(emb.weight, std=0.02)
        self.proj = nn.Linear(cfg.event_emb_dim, cfg.d_model)
        self.compute_stream = cfg.stream_dtype == "compute"
        self.width_mask: torch.Tensor | None
        if cfg.event_widths is not None:
            cols = torch.arange(cfg.event_emb_dim)
            mask = (cols[None, :] < torch.tensor(cfg.event_widths)[:, None]).float()
            self.register_buffer("width_mask", mask, persistent=False)
        else:
            self.width_mask = None

    def forward(
        self, ids: torch.Tensor, types: torch.Tensor, timestamps: torch.Tensor,
        offsets: torch.Tensor, sample: torch.Tensor, lay: _jagged.PrefixLayout | None = None,
    ) -> torch.Tensor:
        """The event tokens `[T, d]`; with `lay`, already placed in its combined layout
        `[Tc, d]` (CLS rows zero), as `_jagged.to_layout` would place them."""
        x = self.item(ids)
        if self.width_mask is not None:
            x = x * self.width_mask[types]
        # Age relative to the sample's most recent event, log2-bucketed.
        last = timestamps[(offsets[1:] - 1).clamp(min=0)] if timestamps.numel() else timestamps
        age = (last[sample] - timestamps).clamp(min=0).to(torch.float32)
        bucket = torch.log2(age + 1.0).long().clamp(max=self.num_time_buckets - 1)
        # The small tables (type, age, rank; the projection's bias folded into the type rows,
        # which every token takes once) ride in the projection's GEMM: each token's row is
        # [item vector, multi-hot of its type / age / rank rows] and the weight is
        # [projᵀ; tables], so one GEMM gives proj(x) + bias + type + age + rank, and its
        # weight gradient is the tables' (no [T, d] lookups, adds or embedding backward).
        tables = [self.type_emb.weight + self.proj.bias, self.age.weight]
        cols = [types, bucket + self.type_emb.num_embeddings]
        if self.rank is not None:
            tables.append(self.rank.weight)
            cols.append(rank_bucket(offsets, sample, self.rank.num_embeddings)
                        + self.type_emb.num_embeddings + self.num_time_buckets)
        table = torch.cat(tables)  # [rows, d]
        idx = torch.stack(cols, dim=1)  # [T, k], k distinct columns per token
        if self.compute_stream:
            # The stream starts here in the compute dtype (bf16 under autocast), and every
            # layer's residual adds, norms and their backward stay in it.
            dt = _jagged.kernel_dtype(table)
            hot = torch.zeros(idx.shape[0], table.shape[0], dtype=dt, device=idx.device).scatter_(1, idx, 1.0)
            w = torch.cat([self.proj.weight, table.t()], dim=1).to(dt)
            inp = torch.cat([x.to(dt), hot], dim=1)
            if lay is not None and lay.n:
                # Place the GEMM's narrow input rows (item vector + multi-hot, ~1/3 of d wide)
                # in the layout instead of its d-wide output: all-zero CLS rows give zero
                # output rows (the bias rides in the type rows), so this is to_layout's result
                # without its [Tc, d] scatter forward or its [Tc, d] gather backward.
                inp = inp.new_zeros(lay.sample.shape[0], inp.shape[1]).index_copy_(0, lay.seq_rows, inp)
            return F.linear(inp, w)
        # float32 stream under autocast: the sum stays float32 (not rounded by a bf16 GEMM)
        small = F.embedding_bag(idx, table, mode="sum")
        out: torch.Tensor = F.linear(x, self.proj.weight) + small  # float32 stream
        return out if lay is None else _jagged.to_layout(out, lay)

    def flops(self, shapes: _flops.Shapes) -> float:
        # The compute stream's GEMM also multiplies the multi-hot columns (type, age, rank rows).
        k = self.e
        if self.compute_stream:
            k += self.type_emb.num_embeddings + self.num_time_buckets
            k += self.rank.num_embeddings if self.rank is not None else 0
        return _flops.linear(shapes.tokens, k, self.d)
