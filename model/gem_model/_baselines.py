"""Plain rankers the GEM model must beat: logistic regression and a pooled-embedding MLP.

They read the same `gem_data.Batch` as `GEMModel` (duck typing) and return `[B, num_tasks]`
logits, so the quality bench trains every model on identical sample streams. Neither looks
at the order of the events: they are what a recommender gets without sequence modelling.

- `LogisticRegression`: one weight per sparse id and task (mean over a feature's ids), a
  linear map of the dense features, a domain bias. No event sequence.
- `PooledMLP` (DLRM-style, without torchrec so it runs on the GPU box too): mean-pooled
  embeddings of each sparse feature, of the event item ids and of the event types, the
  dense features through a bottom MLP, the domain embedding and the log length,
  concatenated into a top MLP. torchrec's `DLRM` needs torchrec's KeyedJaggedTensor and a
  fixed dense/sparse split; this model is the same idea written with `nn.EmbeddingBag`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from gem_model._config import GEMConfig


def _bag(vocab: int, dim: int) -> nn.EmbeddingBag:
    bag = nn.EmbeddingBag(vocab, dim, mode="mean", include_last_offset=True)
    nn.init.normal_(bag.weight, std=0.05)
    return bag


def _pooled_sparse(bags: nn.ModuleDict, sparse: Any) -> list[torch.Tensor]:
    jt = sparse.to_dict()
    return [bags[n](jt[n].values(), jt[n].offsets()) for n in bags]


class LogisticRegression(nn.Module):
    """Logistic regression on the sparse ids, the dense features and the domain.

    Args:
        cfg: the GEMConfig whose feature sizes (sparse vocabularies, dense width, domains,
            tasks) this model reads; its dense-block sizes are ignored.
    """

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        nt = cfg.num_tasks
        self.bags = nn.ModuleDict({n: _bag(v, nt) for n, v in cfg.sparse_features})
        for bag in self.bags.values():
            nn.init.zeros_(bag.weight)  # type: ignore[arg-type]
        self.dense = nn.Linear(cfg.num_dense, nt) if cfg.num_dense else None
        if self.dense is not None:  # zero start, as logistic regression is usually fit
            nn.init.zeros_(self.dense.weight)
            nn.init.zeros_(self.dense.bias)
        self.domain = nn.Embedding(cfg.num_domains, nt)
        nn.init.zeros_(self.domain.weight)

    def forward(self, batch: Any) -> torch.Tensor:
        out: torch.Tensor = self.domain(batch.domain)
        for p in _pooled_sparse(self.bags, batch.sparse):
            out = out + p
        if self.dense is not None:
            out = out + self.dense(batch.dense)
        return out.float()


class PooledMLP(nn.Module):
    """DLRM-style ranker: mean-pooled embeddings + bottom MLP on dense, then a top MLP.

    Args:
        cfg: GEMConfig for feature sizes; `emb_dim` (sparse and event embeddings) and
            `head_hidden` (MLP width) size the model.
    """

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        e, h = cfg.emb_dim, cfg.head_hidden
        self.bags = nn.ModuleDict({n: _bag(v, e) for n, v in cfg.sparse_features})
        self.items = _bag(cfg.event_vocab, e)
        self.types = _bag(cfg.num_event_types, e)
        self.domain = nn.Embedding(cfg.num_domains, e)
        nn.init.normal_(self.domain.weight, std=0.05)
        self.bottom = nn.Sequential(nn.Linear(cfg.num_dense, e), nn.ReLU()) if cfg.num_dense else None
        n_in = e * (len(cfg.sparse_features) + 3 + (1 if cfg.num_dense else 0)) + 1
        self.top = nn.Sequential(
            nn.Linear(n_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, cfg.num_tasks)
        )

    def forward(self, batch: Any) -> torch.Tensor:
        off = batch.seq_offsets
        parts = _pooled_sparse(self.bags, batch.sparse)
        parts += [self.items(batch.event_ids, off), self.types(batch.event_types, off),
                  self.domain(batch.domain)]
        if self.bottom is not None:
            parts.append(self.bottom(batch.dense))
        loglen = torch.log1p((off[1:] - off[:-1]).to(parts[0].dtype))[:, None] / math.log(1000.0)
        parts.append(loglen)
        out: torch.Tensor = self.top(torch.cat(parts, dim=1))
        return out.float()
