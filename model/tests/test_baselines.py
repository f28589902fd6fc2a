"""Baselines (logistic regression, pooled MLP), the no-attention ablation, recency positions."""
from __future__ import annotations

import pytest
import torch

from _batch import make_batch, tiny_config
from gem_model import GEMModel, LogisticRegression, PooledMLP
from gem_model._jagged import recency_positions as _recency_positions
from gem_model._layers import MeanPooling, SeqAttention


@pytest.mark.parametrize("cls", [LogisticRegression, PooledMLP])
def test_baselines_shapes_and_gradients(cls: type) -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    model = cls(cfg)
    batch = make_batch(9, lengths=[0, 1, 5, 12, 3, 0, 7, 2, 9], seed=3)
    out = model(batch)
    assert out.shape == (9, cfg.num_tasks) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    torch.nn.functional.binary_cross_entropy_with_logits(out, batch.labels).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_pooled_mlp_ignores_event_order_and_logreg_the_sequence() -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    batch = make_batch(4, lengths=[6, 6, 6, 6], seed=1)
    perm = torch.cat([torch.randperm(6) + 6 * i for i in range(4)])
    shuffled = type(batch)(**{**batch.__dict__, "event_ids": batch.event_ids[perm],
                              "event_types": batch.event_types[perm]})
    mlp, lr = PooledMLP(cfg), LogisticRegression(cfg)
    torch.testing.assert_close(mlp(batch), mlp(shuffled))
    no_events = type(batch)(**{**batch.__dict__, "event_ids": batch.event_ids.flip(0)})
    torch.testing.assert_close(lr(batch), lr(no_events))


def test_gem_without_sequence_attention() -> None:
    torch.manual_seed(0)
    model = GEMModel(tiny_config(sequence_attention=False))
    assert not any(isinstance(m, SeqAttention) for m in model.modules())
    assert any(isinstance(m, MeanPooling) for m in model.modules())
    batch = make_batch(5, lengths=[0, 3, 8, 1, 4], seed=2)
    out = model(batch)
    assert out.shape == (5, 2) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.flops(batch)["total"] > 0


def test_mean_pooling_is_the_sequence_mean() -> None:
    torch.manual_seed(0)
    pool = MeanPooling(tiny_config())
    offsets = torch.tensor([0, 3, 3, 8])
    seq = torch.randn(8, pool.d)
    out = pool(seq, offsets, 5)
    z = pool.norm(seq)
    means = [z[0:3].mean(0), torch.zeros(pool.d), z[3:8].mean(0)]
    ref = torch.stack([pool.proj(m).reshape(pool.n_out, pool.d) for m in means])
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recency_positions_count_back_from_the_newest_event(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n_cls = 2
    lengths = torch.randint(0, 7, (5,), generator=g).tolist()
    comb = [n + n_cls for n in lengths]
    off = torch.tensor([0] + torch.tensor(comb).cumsum(0).tolist())
    ref = []
    for n in lengths:
        ref += [-1 - j for j in range(n_cls)] + [n - 1 - i for i in range(n)]
    got = _recency_positions(off, int(off[-1]), n_cls)
    assert got.tolist() == ref
