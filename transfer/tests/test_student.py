"""Student features against a per-sample loop reference; sharing; FLOPs; params; config errors."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from _common import DATA, source, teacher
from gem_transfer import Student, StudentConfig
from gem_transfer._distill import _loss
from gem_transfer._teacher import teacher_tables


def _reference_features(st: Student, batch: Any, rep: torch.Tensor | None) -> torch.Tensor:
    """The spec, one sample at a time in plain Python/PyTorch."""
    offs = batch.seq_offsets.tolist()
    jt = batch.sparse.to_dict()
    rows = []
    for i in range(len(offs) - 1):
        parts = []
        for n in st.names:
            f = jt[n]
            o = f.offsets().tolist()
            ids = f.values()[o[i]:o[i + 1]]
            w = st.table(n)
            parts.append(w[ids].mean(0) if len(ids) else torch.zeros(w.shape[1]))
        ids = batch.event_ids[offs[i]:offs[i + 1]]
        types = batch.event_types[offs[i]:offs[i + 1]]
        w = st.table("event")
        parts.append(w[ids].mean(0) if len(ids) else torch.zeros(w.shape[1]))
        last = ids[-st.cfg.recent:] if len(ids) else ids
        parts.append(w[last].mean(0) if len(last) else torch.zeros(w.shape[1]))
        lt = types[-st.cfg.recent_types:] if len(types) else types
        parts.append(torch.tensor([float((lt == k).sum()) / max(len(lt), 1) for k in range(st.num_types)]))
        parts.append(torch.tensor([np.log1p(len(ids)) / 8.0], dtype=torch.float32))
        parts.append(batch.dense[i])
        parts.append(F.one_hot(batch.domain[i], st.num_domains).float())
        if rep is not None:
            parts.append((rep[i] - st.repr_mean) / st.repr_std)
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def _batch_with_edges() -> Any:
    """A tiny-preset block whose first sequences are cut to lengths 0, 1, recent-1, recent, recent+1."""
    h = source(block_size=12).read(0)
    keep = np.array([0, 1, 7, 8, 9, 15, 16, 17])
    lengths = np.minimum(h.lengths, 10**9).copy()
    lengths[: len(keep)] = np.minimum(keep, h.lengths[: len(keep)])
    # rebuild the events by taking the first `lengths[i]` events of each sequence
    offs = np.r_[0, np.cumsum(h.lengths)]
    pos = np.concatenate([np.arange(offs[i], offs[i] + lengths[i]) for i in range(len(lengths))]).astype(np.int64)
    h.event_ids, h.event_types, h.timestamps = h.event_ids[pos], h.event_types[pos], h.timestamps[pos]
    h.lengths = lengths
    return h.to_batch("native")


@pytest.mark.parametrize("share", ["none", "frozen", "finetune"])
@pytest.mark.parametrize("repr_dim", [0, 5])
def test_features_match_reference(share: str, repr_dim: int) -> None:
    torch.manual_seed(0)
    tables = teacher_tables(teacher()) if share != "none" else None
    st = Student(StudentConfig(emb_dim=6, recent=8, recent_types=16, repr_dim=repr_dim, share=share), DATA, tables)
    batch = _batch_with_edges()
    rep = torch.randn(batch.num_samples, repr_dim) * 3 + 1 if repr_dim else None
    if rep is not None:
        st.set_repr_stats(rep[:5])
    got = st.features(batch, rep)
    torch.testing.assert_close(got, _reference_features(st, batch, rep), rtol=1e-5, atol=1e-6)
    assert got.shape == (batch.num_samples, st.fan_in)
    assert st(batch, rep).shape == (batch.num_samples, len(DATA.tasks))


def test_sharing_uses_teacher_tables() -> None:
    t = teacher(seed=2)
    tables = teacher_tables(t)
    frozen = Student(StudentConfig(share="frozen"), DATA, tables)
    fine = Student(StudentConfig(share="finetune"), DATA, tables)
    for n in ("user_id", "event"):
        assert torch.equal(frozen.table(n), tables[n]) and torch.equal(fine.table(n), tables[n])
    assert not any(p.shape == tables["event"].shape for p in frozen.parameters())  # buffers, not trained
    assert fine.table("event").requires_grad
    assert frozen.widths["event"] == t.cfg.event_emb_dim
    p = frozen.num_params()
    assert p["total"] == p["dense"] + sum(v.numel() for v in tables.values()) and p["trainable"] == p["dense"]
    with pytest.raises(ValueError, match="needs the teacher's tables"):
        Student(StudentConfig(share="frozen"), DATA, None)
    bad = dict(tables, page=torch.zeros(3, 16))
    with pytest.raises(ValueError, match=r"tables\['page'\]"):
        Student(StudentConfig(share="frozen"), DATA, bad)


def test_matmul_flops_match_flop_counter() -> None:
    st = Student(StudentConfig(hidden=(24, 12), repr_dim=7), DATA)
    batch = source().batch(0, "native")
    x = st.features(batch, torch.randn(batch.num_samples, 7))
    with FlopCounterMode(display=False) as fc:
        st.mlp(x)
    lengths = batch.seq_lengths().double()
    fl = st.flops_per_sample(float(lengths.mean()), 2.0)
    assert fl["matmul"] * batch.num_samples == fc.get_total_flops()
    assert fl["pooling"] > 0 and fl["total"] == fl["matmul"] + fl["pooling"]


def test_repr_argument_checked() -> None:
    batch = source().batch(0, "native")
    with pytest.raises(ValueError, match="repr_dim=0"):
        Student(StudentConfig(), DATA)(batch, torch.zeros(batch.num_samples, 3))
    with pytest.raises(ValueError, match="repr.shape"):
        Student(StudentConfig(repr_dim=4), DATA)(batch, torch.zeros(batch.num_samples, 3))


@pytest.mark.parametrize("field,value", [("emb_dim", 0), ("recent", -1), ("repr_dim", -2), ("share", "x"),
                                         ("hidden", ())])
def test_config_errors_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"StudentConfig.{field}="):
        StudentConfig(**{field: value})


def test_kd_loss_reference() -> None:
    torch.manual_seed(0)
    z, t = torch.randn(9, 2), torch.randn(9, 2) * 2
    y = torch.bernoulli(torch.full((9, 2), 0.3))
    torch.testing.assert_close(_loss(z, y, t, 0.0, 1.0), F.binary_cross_entropy_with_logits(z, y))
    # a = 1, T = 2: T^2 * mean cross entropy of sigmoid(z/T) against sigmoid(t/T), written out
    p, q = torch.sigmoid(z / 2), torch.sigmoid(t / 2)
    ref = 4 * -(q * torch.log(p) + (1 - q) * torch.log(1 - p)).mean()
    torch.testing.assert_close(_loss(z, y, t, 1.0, 2.0), ref)
    mix = 0.3 * F.binary_cross_entropy_with_logits(z, y) + 0.7 * F.binary_cross_entropy_with_logits(z, torch.sigmoid(t))
    torch.testing.assert_close(_loss(z, y, t, 0.7, 1.0), mix)
