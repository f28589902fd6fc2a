"""GEMModel: embedding front end → InterFormer/Kunlun layers → multi-domain multi-task heads.

Single-device code (STYLE.md point 6): gem_parallel shards the embedding tables and wraps the
dense layers from outside. Reads a gem_data.Batch by duck typing (INTERFACES.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gem_model import _flops, _jagged
from gem_model._config import GEMConfig
from gem_model._embedding import DenseArch, EventArch, SparseArch
from gem_model._layers import InterFormerLayer


class TaskHeads(nn.Module):
    """Shared bottom over all final tokens, then one domain-gated tower and logit per task."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.fan_in = (cfg.num_tokens + cfg.num_summary) * cfg.d_model
        self.hh, self.nt = cfg.head_hidden, cfg.num_tasks
        self.norm = nn.LayerNorm(cfg.d_model)
        self.bottom = nn.Linear(self.fan_in, self.hh)
        self.towers = nn.Parameter(torch.randn(self.nt, self.hh, self.hh) / self.hh**0.5)
        self.tower_bias = nn.Parameter(torch.zeros(self.nt, self.hh))
        self.domain_gate = nn.Embedding(cfg.num_domains, self.nt * self.hh)
        self.out = nn.Parameter(torch.randn(self.nt, self.hh) / self.hh**0.5)
        self.domain_bias = nn.Embedding(cfg.num_domains, self.nt)
        nn.init.zeros_(self.domain_gate.weight)
        nn.init.zeros_(self.domain_bias.weight)

    def forward(self, x: torch.Tensor, s_sum: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        z = self.norm(torch.cat([x, s_sum.to(x.dtype)], dim=1)).reshape(b, self.fan_in)
        h = F.gelu(self.bottom(z))
        ht = torch.einsum("bi,tij->btj", h, self.towers.to(h.dtype)) + self.tower_bias
        ht = F.gelu(ht) * (1.0 + self.domain_gate(domain).reshape(b, self.nt, self.hh))
        logits: torch.Tensor = (ht * self.out).sum(-1) + self.domain_bias(domain)
        return logits.float()

    def flops(self, s: _flops.Shapes) -> float:
        return _flops.linear(s.batch, self.fan_in, self.hh) + _flops.linear(s.batch * self.nt, self.hh, self.hh)


class GEMModel(nn.Module):
    """The GEM-like model. `model(batch) -> logits [B, num_tasks]` (float32).

    Args:
        cfg: sizes and switches; see `GEMConfig`.
    """

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.sparse = SparseArch(cfg)
        self.dense = DenseArch(cfg)
        self.events = EventArch(cfg)
        self.layers = nn.ModuleList(InterFormerLayer(cfg, i) for i in range(cfg.num_layers))
        self.heads = TaskHeads(cfg)

    def forward(self, batch: Any) -> torch.Tensor:
        offsets, max_len = _check_batch(batch)
        total = batch.event_ids.shape[0]
        sample = _jagged.token_sample(offsets, total)
        x = torch.cat([self.sparse(batch.sparse), self.dense(batch.dense, batch.domain)], dim=1)
        # The CLS rows are inserted once (the event tokens are built in that layout) and the
        # stream stays in it through every layer (each layer overwrites them); the final
        # stream is not read (the heads take x and the last summary), so nothing is stripped,
        # and the last layer attends only the rows it reads (GEMConfig.last_layer_rows_only).
        cfg = self.cfg
        n = cfg.num_cls if cfg.sequence_attention else 0
        lay = _jagged.prefix_layout(offsets, max_len, total, n, head_dim=cfg.head_dim, rope_base=cfg.rope_base)
        comb = self.events(batch.event_ids, batch.event_types, batch.timestamps, offsets, sample, lay)
        pooled: torch.Tensor | None = None
        s_sum = x.new_zeros(0)
        stream: torch.Tensor | None = comb
        for i, layer in enumerate(self.layers):
            if stream is None:  # only the last layer may return no stream (`last_rows`)
                raise RuntimeError(f"layer {i - 1} returned no token stream, but is not the last layer")
            if pooled is not None:
                # A fresh tensor for each layer, however the previous layer ran: an eager
                # pooling's output is a view (of a transpose or reshape) where a compiled
                # layer's is not, and a skip layer hands on its input. A block compiled ahead
                # of time from one guards on its `_base` and does not fit the other, so a
                # layer compiled in the background while its predecessor still ran eagerly
                # was compiled again once the predecessor ran compiled. (Values unchanged: a
                # copy of [B, seeds, d], strides kept.)
                pooled = pooled.clone()
            x, stream, s_sum, pooled = layer(x, stream, lay, pooled)
        return self.heads(x, s_sum, batch.domain)  # type: ignore[no-any-return]

    def flops(self, batch: Any) -> dict[str, float]:
        """Analytic forward FLOPs per module kind for this batch's jagged lengths (+ "total").

        Counts matrix products only, attention over visible pairs only (see gem_model._flops).
        Reads the offsets on the host (one sync): call it outside the timed region.
        """
        offsets, _ = _check_batch(batch)
        return self.flops_for(tuple(int(n) for n in _jagged.lengths_of(offsets).tolist()))

    def flops_for(self, lengths: tuple[int, ...]) -> dict[str, float]:
        """`flops` for explicit sequence lengths (one per sample)."""
        s = _flops.Shapes(lengths)
        out: dict[str, float] = {
            "embedding": self.sparse.flops(s) + self.dense.flops(s) + self.events.flops(s),
        }
        for layer in self.layers:
            for name, mod in layer.named_children():
                out[name] = out.get(name, 0.0) + mod.flops(s)  # type: ignore[operator]
        out["heads"] = self.heads.flops(s)
        out["total"] = sum(out.values())
        return out


def _check_batch(batch: Any) -> tuple[torch.Tensor, int]:
    """Cheap shape checks at the public boundary (no host sync)."""
    offsets = batch.seq_offsets
    b = batch.domain.shape[0]
    if offsets.dim() != 1 or offsets.shape[0] != b + 1:
        raise ValueError(f"batch.seq_offsets.shape={tuple(offsets.shape)} must be [B+1] with B={b}")
    if batch.event_ids.shape != batch.event_types.shape or batch.event_ids.dim() != 1:
        raise ValueError(
            f"batch.event_ids.shape={tuple(batch.event_ids.shape)} and batch.event_types.shape="
            f"{tuple(batch.event_types.shape)} must be equal [T]"
        )
    if batch.dense.dim() != 2 or batch.dense.shape[0] != b:
        raise ValueError(f"batch.dense.shape={tuple(batch.dense.shape)} must be [B={b}, num_dense]")
    max_len = batch.max_seq_len
    if isinstance(max_len, torch.Tensor) or not isinstance(max_len, int) or max_len < 0:
        raise TypeError(f"batch.max_seq_len={max_len!r} must be a host int >= 0")
    return offsets, max_len
