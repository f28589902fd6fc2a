"""The CLS layout kept across layers equals the per-layer prefixed-copy formulation.

`_reference_forward` is the model as it was before issue 16 (each SeqAttention copied the
sequence into a CLS-prefixed buffer, gathered it back, and RoPE'd q and k separately); the
model now inserts the CLS rows once and keeps that layout through every layer. Outputs and
every gradient must agree on fresh random batches with edge lengths.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _batch import KUNLUN, make_batch, tiny_config
from gem_model import GEMModel
from gem_model import _jagged
from gem_model._layers import InterFormerLayer, SeqAttention, SeqPooling, recent_tokens


def assert_grads_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Every parameter's gradient equal to float32 rounding (which scales with a sum's largest
    terms, not with each element)."""
    assert got.keys() == want.keys()
    top = max(float(v.abs().max()) for v in want.values())
    for n in want:
        scale = float(want[n].abs().max())
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6 * top + 1e-4 * scale, msg=n)


def _insert_prefix(
    seq: torch.Tensor, prefix: torch.Tensor, offsets: torch.Tensor, seq_sample: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The old per-layer copy: (combined `[T + B*n, d]`, offsets, seq rows, prefix rows)."""
    b, n, d = prefix.shape
    shift = torch.arange(b + 1, dtype=torch.int64) * n
    new_off = offsets + shift
    seq_pos = torch.arange(seq.shape[0]) + shift[1:][seq_sample]
    pre_pos = (new_off[:-1, None] + torch.arange(n)).reshape(-1)
    out = seq.new_zeros(seq.shape[0] + b * n, d)
    out = out.index_copy(0, seq_pos, seq).index_copy(0, pre_pos, prefix.reshape(b * n, d).to(seq.dtype))
    return out, new_off, seq_pos, pre_pos


def _old_rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(half, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cos(ang)[:, None, :].to(x.dtype)
    sin = torch.sin(ang)[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _old_attention(
    m: SeqAttention, seq: torch.Tensor, cls: torch.Tensor, offsets: torch.Tensor, max_len: int,
    sample: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    b = cls.shape[0]
    comb, off, seq_pos, cls_pos = _insert_prefix(seq, cls, offsets, sample)
    tc = comb.shape[0]
    pos = _jagged.recency_positions(off, tc, m.n_cls)
    q, k, v = m.wqkv(m.norm(comb)).reshape(tc, 3, m.heads, m.dh).unbind(1)
    q, k = _old_rope(q, pos, m.base), _old_rope(k, pos, m.base)
    lc = max_len + m.n_cls
    o = _jagged.attention(q.contiguous(), k.contiguous(), v.contiguous(), off, off, lc, lc,
                          window=m.window, backend=m.backend)
    comb = comb + m.wo(o.reshape(tc, m.d))
    return comb[seq_pos], comb[cls_pos].reshape(b, m.n_cls, m.d)


def _old_layer(
    layer: InterFormerLayer, x: torch.Tensor, seq: torch.Tensor, offsets: torch.Tensor, max_len: int,
    sample: torch.Tensor, pooled: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x_sum = layer.nonseq_summary(x)
    seq = layer.seq_ffn(seq, x_sum, offsets, max_len, sample)
    cls_out = x_sum
    if layer.seq_attention is not None:
        seq, cls_out = _old_attention(layer.seq_attention, seq, x_sum, offsets, max_len, sample)
    if layer.pooling is not None:
        pooled = layer.pooling(seq, offsets, max_len)
    assert pooled is not None
    s_sum = layer.seq_summary(cls_out, pooled, recent_tokens(seq, offsets, layer.num_recent))
    return layer.interaction(x, s_sum), seq, s_sum, pooled


def _reference_forward(model: GEMModel, batch: Any) -> torch.Tensor:
    offsets, max_len = batch.seq_offsets, batch.max_seq_len
    total = batch.event_ids.shape[0]
    sample = _jagged.token_sample(offsets, total)
    x = torch.cat([model.sparse(batch.sparse), model.dense(batch.dense, batch.domain)], dim=1)
    seq = model.events(batch.event_ids, batch.event_types, batch.timestamps, offsets, sample)
    pooled: torch.Tensor | None = None
    s_sum = x.new_zeros(0)
    for layer in model.layers:
        assert isinstance(layer, InterFormerLayer)
        x, seq, s_sum, pooled = _old_layer(layer, x, seq, offsets, max_len, sample, pooled)
    out: torch.Tensor = model.heads(x, s_sum, batch.domain)
    return out


CASES = list(KUNLUN) + ["no_attention"]


def _config(name: str, **extra: Any) -> Any:
    if name == "no_attention":
        return tiny_config(sequence_attention=False, **extra)
    return tiny_config(**KUNLUN[name], **extra)


@pytest.mark.parametrize("name,seed,merged,select", [(n, s, False, False) for n in CASES for s in (0, 1)]
                         # merged_stream_reads: pooled and skip layers, windows, Kunlun at once
                         + [("skip", 0, True, False), ("all", 1, True, False), ("interformer", 1, True, False)]
                         # select_stream_rows (eager: the same scatters; compiled: test_*_compiled)
                         + [("all", 0, True, True), ("skip", 1, False, True)])
def test_layout_matches_per_layer_prefix_copies(name: str, seed: int, merged: bool, select: bool) -> None:
    torch.manual_seed(100 + seed)
    model = GEMModel(_config(name, merged_stream_reads=merged, select_stream_rows=select))
    g = torch.Generator().manual_seed(seed)
    lengths = [0, 1, 17, 2] + torch.randint(0, 12, (4,), generator=g).tolist()
    batch = make_batch(len(lengths), lengths=lengths, seed=seed)

    def run(fn: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = fn(batch)
        F.binary_cross_entropy_with_logits(out, batch.labels).backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want, want_g = run(lambda b: _reference_forward(model, b))
    got, got_g = run(model)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_grads_close(got_g, want_g)


def test_cls_rows_are_not_events() -> None:
    """The layout's event rows are the sequence in order, recent tokens skip the CLS rows,
    and the RoPE tables sit at the recency positions."""
    offsets = torch.tensor([0, 3, 3, 4, 9])
    lay = _jagged.prefix_layout(offsets, 5, 9, 2, head_dim=4, rope_base=100.0)
    assert lay.offsets.tolist() == [0, 5, 7, 10, 17] and lay.max_len == 7
    assert lay.cls_rows.tolist() == [0, 1, 5, 6, 7, 8, 10, 11]
    assert lay.sample.tolist() == [0] * 5 + [1] * 2 + [2] * 3 + [3] * 7
    seq = torch.randn(9, 4)
    comb = _jagged.to_layout(seq, lay)
    torch.testing.assert_close(_jagged.events_of(comb, lay), seq, rtol=0, atol=0)
    assert not comb[lay.cls_rows].any()
    comb[lay.cls_rows] = 1e3  # CLS values must never reach the recent tokens
    rec = recent_tokens(comb, lay.offsets, 2, lay.n)
    torch.testing.assert_close(rec, recent_tokens(seq, offsets, 2), rtol=0, atol=0)
    pos = _jagged.recency_positions(lay.offsets, 17, 2)
    cos, sin = _jagged.rope_tables(pos, 4, 100.0)
    torch.testing.assert_close(lay.cos, cos, rtol=0, atol=0)
    torch.testing.assert_close(lay.sin, sin, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_the_rotate_half_formula(dtype: torch.dtype) -> None:
    """One multiply-add over sign-folded tables = the four-product rotate-half form (fp32:
    to rounding, the add is fused; bf16: within one bf16 rounding of the old form)."""
    g = torch.Generator().manual_seed(3)
    pos = torch.randint(-4, 300, (29,), generator=g)
    x = torch.randn(29, 2, 3, 16, generator=g).to(dtype)
    cos, sin = _jagged.rope_tables(pos, 16, 10000.0)
    want = _old_rope(x.reshape(29, 6, 16), pos, 10000.0).reshape(29, 2, 3, 16)
    tol = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (1.6e-2, 1e-2)}[dtype]
    torch.testing.assert_close(_jagged.rope(x, cos, sin), want, rtol=tol[0], atol=tol[1])
    # A rotation: norms of each (x1_i, x2_i) pair are kept.
    if dtype == torch.float32:
        y = _jagged.rope(x, cos, sin)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_unique_rows_matches_index_select_forward_and_backward(dtype: torch.dtype, compiled: bool) -> None:
    g = torch.Generator().manual_seed(21)
    x = torch.randn(37, 3, 5, generator=g).to(dtype).requires_grad_()
    rows = torch.randperm(37, generator=g)[:23]
    up = torch.randn(23, 3, 5, generator=g).to(dtype)

    def loss(fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x.grad = None
        y = fn(x, rows)
        (y * up).sum().backward()
        assert x.grad is not None
        return y.detach(), x.grad

    fn: Any = _jagged.unique_rows
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(_jagged.unique_rows, fullgraph=True, dynamic=True)
    y, gx = loss(fn)
    y_ref, gx_ref = loss(lambda a, r: a.index_select(0, r))
    # One contribution per row: the scatter and index_add's accumulation agree exactly.
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=0)
    untouched = torch.ones(37, dtype=torch.bool)
    untouched[rows] = False
    assert not gx[untouched].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("compiled,gather", [(False, False), (True, False), (True, True)])
def test_stream_reads_match_the_separate_reads(dtype: torch.dtype, events: bool, compiled: bool, gather: bool) -> None:
    """`stream_reads` = `unique_rows` of the CLS rows + `recent_tokens` + `events_of`: the same
    values bit for bit, and the gradient of any upstream to the sums' rounding (sequences of
    0, 1 and 2 events included, shorter than k = 3)."""
    g = torch.Generator().manual_seed(31 + events)
    lengths = [0, 1, 2, 9, 5, 0, 13]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    lay = _jagged.prefix_layout(offsets, max(lengths), int(offsets[-1]), 2, head_dim=4, rope_base=100.0)
    tc, k, d = lay.sample.shape[0], 3, 6
    comb = torch.randn(tc, d, generator=g).to(dtype).requires_grad_()
    ups = [torch.randn(shape, generator=g).to(dtype)
           for shape in ((len(lengths) * 2, d), (len(lengths), k, d), (int(offsets[-1]), d))]

    def separate(c: torch.Tensor) -> tuple[Any, ...]:
        return (_jagged.unique_rows(c, lay.cls_rows), recent_tokens(c, lay.offsets, k, lay.n),
                _jagged.events_of(c, lay) if events else None)

    def merged(c: torch.Tensor) -> tuple[Any, ...]:
        return _jagged.stream_reads(c, lay, k, events=events, gather_grad=gather)

    def run(fn: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        comb.grad = None
        outs = fn(comb)
        loss = sum(((o.float() * u.float()).sum() for o, u in zip(outs, ups) if o is not None),
                   torch.zeros(()))
        loss.backward()
        assert comb.grad is not None
        return [o.detach() for o in outs if o is not None], comb.grad

    fn: Any = merged
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(merged, fullgraph=True, dynamic=True, backend="aot_eager")
    got, got_g = run(fn)
    want, want_g = run(separate)
    assert len(got) == len(want) == 2 + events
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got_g, want_g, rtol=tol, atol=tol)
    if not events:  # rows neither CLS nor recent get an exact zero
        read = torch.zeros(tc, dtype=torch.bool)
        read[lay.cls_rows] = True
        idx = lay.offsets[1:, None] - k + torch.arange(k)
        read[idx[idx >= lay.offsets[:-1, None] + lay.n]] = True
        assert not got_g[~read].any()


def _assert_same_bits(ours: Any, plain: Any, run: Any, compiled: bool) -> None:
    """`run(ours)` (eager, or compiled by dynamo with aot_eager) and `run(plain)` give the
    same tensors bit for bit."""
    fn = ours
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(ours, fullgraph=True, dynamic=True, backend="aot_eager")
    for a, b in zip(run(fn), run(plain), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_with_cls_is_index_copy(dtype: torch.dtype, compiled: bool) -> None:
    """`with_cls` = `index_copy` of the CLS rows: the same values bit for bit, x's gradient
    with the CLS rows zeroed and the CLS tokens' gradient gathered (sequences of 0 and 1
    events included), eager and compiled (where it is a per-row select)."""
    g = torch.Generator().manual_seed(7 + compiled)
    lengths = [0, 4, 1, 11, 0, 6]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    lay = _jagged.prefix_layout(offsets, max(lengths), int(offsets[-1]), 3, head_dim=4, rope_base=100.0)
    tc, d = lay.sample.shape[0], 5
    x0 = torch.randn(tc, d, generator=g).to(dtype)
    cls0 = torch.randn(len(lengths) * 3, d, generator=g).to(dtype)
    up = torch.randn(tc, d, generator=g)

    def ours(x: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        return _jagged.with_cls(x * 1, cls, lay)  # x * 1: a fresh activation, as in the layer

    def plain(x: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        return x.index_copy(0, lay.cls_rows, cls)

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, cls = x0.clone().requires_grad_(), cls0.clone().requires_grad_()
        out = fn(x, cls)
        (out.float() * up).sum().backward()
        assert x.grad is not None and cls.grad is not None
        return out.detach(), x.grad, cls.grad

    _assert_same_bits(ours, plain, run, compiled)
    with pytest.raises(ValueError, match="cls must be"):
        _jagged.with_cls(x0, cls0[1:], lay)


def test_stream_reads_refuse_what_it_cannot_read() -> None:
    offsets = torch.tensor([0, 3, 5])
    lay = _jagged.prefix_layout(offsets, 3, 5, 2, head_dim=4, rope_base=100.0)
    comb = torch.randn(9, 4)
    with pytest.raises(ValueError, match="k >= 1"):
        _jagged.stream_reads(comb, lay, 0, events=True)
    plain = _jagged.prefix_layout(offsets, 3, 5, 0, head_dim=4, rope_base=100.0)
    with pytest.raises(ValueError, match="CLS rows"):
        _jagged.stream_reads(comb[:5], plain, 2, events=True)


@pytest.mark.parametrize("stream", ["compute", "float32"])
def test_event_tokens_built_in_the_layout(stream: str) -> None:
    """EventArch given the layout (its GEMM input rows scattered, not its output rows) =
    to_layout of its plain output: values, zero CLS rows, and every gradient."""
    torch.manual_seed(5)
    model = GEMModel(tiny_config(stream_dtype=stream))
    lengths = [0, 1, 17, 2, 5, 0, 9]
    batch = make_batch(len(lengths), lengths=lengths, seed=5)
    off, total = batch.seq_offsets, batch.event_ids.shape[0]
    sample = _jagged.token_sample(off, total)
    lay = _jagged.prefix_layout(off, batch.max_seq_len, total, 2, head_dim=16, rope_base=100.0)
    args = (batch.event_ids, batch.event_types, batch.timestamps, off, sample)
    w = torch.randn(lay.sample.shape[0], model.cfg.d_model)
    grads = []
    for placed in (True, False):
        model.zero_grad(set_to_none=True)
        out = model.events(*args, lay) if placed else _jagged.to_layout(model.events(*args), lay)
        (out * w).sum().backward()
        grads.append((out.detach(), {n: p.grad.clone() for n, p in model.events.named_parameters()
                                     if p.grad is not None}))
    (got, got_g), (want, want_g) = grads
    assert got.shape == (total + 2 * len(lengths), model.cfg.d_model) and not got[lay.cls_rows].any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_g.keys() == want_g.keys() and got_g
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-6, msg=n)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_rope_qkv_matches_autograd_of_the_sliced_form(dtype: torch.dtype, compiled: bool) -> None:
    """`rope_qkv`'s values and qkv gradient = autograd through `rope(qkv[:, :2])` and
    `qkv[:, 2]` (its hand-written backward is the rotation by -θ); views of qkv / one tensor."""
    g = torch.Generator().manual_seed(int(compiled) * 2 + (dtype == torch.bfloat16))
    t, h, d = 37, 3, 16
    qkv = torch.randn(t, 3, h, d, generator=g).to(dtype)
    pos = torch.randint(-4, 300, (t,), generator=g)
    cos, sin = _jagged.rope_tables(pos, d, 10000.0)
    ups = [torch.randn(t, h, d, generator=g).to(dtype) for _ in range(3)]

    def old(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k = _jagged.rope(x[:, :2], cos, sin).unbind(1)
        return q, k, x[:, 2]

    def new(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _jagged.rope_qkv(x, cos, sin)

    grads, outs = [], []
    for fn in (old, new):
        f = torch.compile(fn, fullgraph=True) if compiled else fn
        x = qkv.clone().requires_grad_()
        o = f(x)
        sum((oi.float() * u.float()).sum() for oi, u in zip(o, ups, strict=True)).backward()
        outs.append([oi.detach() for oi in o])
        grads.append(x.grad)
    # Compiled bf16: inductor keeps the product x*cos in fp32 in one form and rounds it in
    # the other: one bf16 rounding apart (the v view is exact either way).
    tol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 2e-2)}[dtype]
    exact = not compiled or dtype == torch.float32
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, rtol=0 if exact else tol[0], atol=0 if exact else tol[1])
    torch.testing.assert_close(outs[1][2], outs[0][2], rtol=0, atol=0)
    assert grads[1].dtype == dtype and grads[1].shape == qkv.shape
    torch.testing.assert_close(grads[1], grads[0], rtol=tol[0], atol=tol[1])
    torch.testing.assert_close(grads[1][:, 2], ups[2], rtol=0, atol=0)  # v passes through
    with pytest.raises(ValueError, match=r"qkv must be \[T, 3, H, D\]"):
        _jagged.rope_qkv(qkv[:, :2], cos, sin)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the Triton backward)")
@pytest.mark.parametrize("compiled", [False, True])
def test_rope_qkv_gpu_backward_matches_the_sliced_form(compiled: bool) -> None:
    """On CUDA the backward is gem_kernels' rope_qkv_grad kernel: the h200 layer's size, bf16."""
    g = torch.Generator().manual_seed(11)
    t, h, d = 20_011, 8, 128
    qkv = torch.randn(t, 3, h, d, generator=g).to(torch.bfloat16).cuda()
    cos, sin = (x.cuda() for x in _jagged.rope_tables(torch.randint(0, 9000, (t,), generator=g), d, 10000.0))
    ups = [torch.randn(t, h, d, generator=g).to(torch.bfloat16).cuda() for _ in range(3)]

    def old(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k = _jagged.rope(x[:, :2], cos, sin).unbind(1)
        return q, k, x[:, 2]

    grads = []
    for fn in (old, lambda x: _jagged.rope_qkv(x, cos, sin)):
        f = torch.compile(fn, fullgraph=True) if compiled else fn
        x = qkv.clone().requires_grad_()
        sum((o.float() * u.float()).sum() for o, u in zip(f(x), ups, strict=True)).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(grads[1][:, 2], ups[2], rtol=0, atol=0)


def _interaction_all_queries(m: Any, x: torch.Tensor, s_sum: torch.Tensor) -> torch.Tensor:
    """Reference: self-attention over all N = F + n_sum tokens, FFN, then the F feature rows
    (gem-model 0.3.9's Interaction, which also attended and projected the summary rows)."""
    z = torch.cat([x, s_sum.to(x.dtype)], dim=1)
    b, n = z.shape[:2]
    q, k, v = m.wqkv(m.norm1(z)).reshape(b, n, 3, m.heads, m.dh).permute(2, 0, 3, 1, 4).unbind(0)
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, m.d)
    x = (z + m.wo(a))[:, : m.f]
    return x + m.w2(F.gelu(m.w1(m.norm2(x))))


@pytest.mark.parametrize("b", [1, 5])
def test_interaction_matches_attending_every_token(b: int) -> None:
    """The interaction attends only the feature tokens' queries (the summary rows' outputs
    are dropped): forward and every gradient equal the all-token formulation's (float64)."""
    model = GEMModel(tiny_config()).double()
    m = model.layers[0].interaction
    x = torch.randn(b, m.f, m.d, dtype=torch.float64, requires_grad=True)
    s = torch.randn(b, m.n - m.f, m.d, dtype=torch.float64, requires_grad=True)
    out, ref = m(x, s), _interaction_all_queries(m, x, s)
    assert out.shape == (b, m.f, m.d)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    params = [x, s, *m.parameters()]
    got = torch.autograd.grad(out, params, g)
    want = torch.autograd.grad(ref, params, g)
    for name, a, e in zip(["x", "s_sum", *(n for n, _ in m.named_parameters())], got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("compiled,gather", [(False, False), (True, False), (False, True), (True, True)])
def test_slot_rows_is_the_masked_gather(compiled: bool, gather: bool) -> None:
    """`slot_rows` = `x.index_select(0, rows) * valid`: the same values bit for bit and the
    same gradient, with invalid slots naming rows that valid slots also name (clamped rows
    of short sequences), eager and compiled; with `gather_grad` (the backward gathered per
    row when compiled, GEMConfig.gather_stream_grads) too, on fresh lengths each run."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10**6, ())))
    lengths = [0, 1, 6, 2, 9] + torch.randint(0, 8, (4,), generator=g).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0)
    lay = _jagged.prefix_layout(offsets, max(lengths), int(offsets[-1]), 2, head_dim=4, rope_base=100.0)
    rows, valid = _jagged.query_slots(lay, 3)
    assert rows.shape == valid.shape == (len(lengths), 5)
    assert valid.sum(1).tolist() == [2 + min(3, n) for n in lengths]
    ok = rows[valid]
    assert ok.unique().numel() == ok.numel() and not valid.all()  # distinct valid rows; some invalid
    x0 = torch.randn(lay.sample.shape[0], 3, 4, generator=g)
    up = torch.randn(rows.numel(), 3, 4, generator=g)

    def ours(x: torch.Tensor) -> torch.Tensor:
        return _jagged.slot_rows(x, rows.reshape(-1), valid.reshape(-1), (lay, 3) if gather else None)

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, rows.reshape(-1)) * valid.reshape(-1, 1, 1)

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_()
        out = fn(x)
        (out * up).sum().backward()
        assert x.grad is not None
        return out.detach(), x.grad

    _assert_same_bits(ours, plain, run, compiled)


def _logits_and_grads(m: GEMModel, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One fwd+bwd of `m` on `batch` (BCE on its labels): the logits and every parameter's
    gradient, named as in the unwrapped model (activation checkpointing's wrapper dropped)."""
    out = m(batch)
    F.binary_cross_entropy_with_logits(out, batch.labels).backward()
    return out.detach(), {n.replace("_checkpoint_wrapped_module.", ""): p.grad
                          for n, p in m.named_parameters() if p.grad is not None}


def _backward_ops(fn: Any, *args: torch.Tensor) -> set[str]:
    """The ops of the backward graph AOTAutograd builds for `fn(*args)` summed (dynamic sizes)."""
    from torch._dynamo.backends.common import aot_autograd

    ops: set[str] = set()

    def bw(gm: torch.fx.GraphModule, _: object) -> Any:
        ops.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True,
                             backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=bw))
    outs = compiled(*args)
    sum(o.float().sum() for o in (outs if isinstance(outs, tuple) else (outs,)) if o is not None).backward()
    return ops


@pytest.mark.parametrize("events", [False, True])
def test_gathered_stream_grads_leave_no_scatter_in_the_backward(events: bool) -> None:
    """GEMConfig.gather_stream_grads' point: compiled, the backward of the stream's reads
    (`stream_reads`, the last layer's `slot_rows`) has no scatter and no zero-filled buffer
    (index_put / index_copy / full), only gathers inductor can fuse into the sum with the
    stream's other gradient; without it, the scatter is there."""
    lengths = [0, 3, 7, 1] + torch.randint(0, 9, (3,)).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0)
    lay = _jagged.prefix_layout(offsets, max(lengths), int(offsets[-1]), 2, head_dim=4, rope_base=100.0)
    comb = torch.randn(lay.sample.shape[0], 6, requires_grad=True)
    rows, valid = _jagged.query_slots(lay, 3)
    scatters = {"aten.index_put.default", "aten.index_copy.default", "aten.full.default", "aten.index_put_.default",
                "aten.index_copy_.default", "aten.new_zeros.default", "aten.zeros.default"}
    for gather in (False, True):
        reads = _backward_ops(lambda c, gather=gather: _jagged.stream_reads(c, lay, 3, events=events,
                                                                            gather_grad=gather), comb)
        slots = _backward_ops(lambda c, gather=gather: _jagged.slot_rows(
            c, rows.reshape(-1), valid.reshape(-1), (lay, 3) if gather else None), comb)
        for ops in (reads, slots):
            assert bool(ops & scatters) != gather, sorted(ops)


@pytest.mark.parametrize("extra", [dict(), dict(num_recent=0), dict(num_cls=1, num_recent=7),
                                   dict(merged_stream_reads=False, select_stream_rows=True),
                                   dict(gather_stream_grads=True)])
@pytest.mark.parametrize("compiled", [False, True])
def test_last_layer_rows_only_matches_every_row(extra: dict[str, Any], compiled: bool) -> None:
    """The last layer (no pooling) attends only the rows it reads: the logits and every
    gradient equal the model that attends every row (`last_layer_rows_only=False`), with
    empty sequences and sequences shorter than num_recent in the batch."""
    cfg = tiny_config(**KUNLUN["skip_last"], **extra)
    torch.manual_seed(5)
    model = GEMModel(cfg)
    every = GEMModel(dataclasses.replace(cfg, last_layer_rows_only=False))
    every.load_state_dict(model.state_dict())
    assert model.layers[-1].last_rows and not every.layers[-1].last_rows
    assert not any(layer.last_rows for layer in model.layers[:-1])
    if compiled:
        torch._dynamo.reset()
        model.layers[-1].compile(backend="aot_eager", fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(3)
    lengths = [0, 1, 13, 2] + torch.randint(0, 20, (3,), generator=g).tolist()
    batch = make_batch(len(lengths), lengths=lengths, seed=6)

    (got, got_g), (want, want_g) = _logits_and_grads(model, batch), _logits_and_grads(every, batch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_grads_close(got_g, want_g)


TOKEN_MIXES = ("nonseq_summary.mix", "seq_ffn.kv_mix", "pooling.up")


def test_token_mixes_have_no_bias_and_old_checkpoints_load() -> None:
    """The linears over a token axis that a LayerNorm over d follows carry no bias (it would
    add one constant per token, which the LayerNorm's mean removes). A model whose token
    mixes have random biases (gem-model < 0.5) gives the same logits, and its state dict,
    biases included, loads strictly into today's model."""
    cfg = tiny_config(**KUNLUN["skip_last"])
    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    model = GEMModel(cfg)
    names = [n for n, _ in model.named_modules() if n.endswith(TOKEN_MIXES)]
    assert len(names) == 2 * cfg.num_layers + sum(cfg.pools_at(i) for i in range(cfg.num_layers))
    assert not any(n.endswith(tuple(m + ".bias" for m in TOKEN_MIXES)) for n, _ in model.named_parameters())
    old = GEMModel(cfg)
    old.load_state_dict(model.state_dict())
    for n in names:  # the gem-model 0.4 module: the same weight, plus a random bias
        parent, _, leaf = n.rpartition(".")
        lin = old.get_submodule(n)
        biased = nn.Linear(lin.in_features, lin.out_features)
        with torch.no_grad():
            biased.weight.copy_(lin.weight)
            biased.bias.normal_(0.0, 3.0)
        setattr(old.get_submodule(parent), leaf, biased)
    batch = make_batch(6, lengths=[0, 4, 19, 1, 11, 30], seed=int(torch.randint(0, 100, ())))
    with torch.no_grad():
        torch.testing.assert_close(old(batch), model(batch), rtol=1e-4, atol=1e-5)
        fresh = GEMModel(cfg)
        fresh.load_state_dict(old.state_dict())  # strict: the hook drops the three biases
        torch.testing.assert_close(fresh(batch), model(batch), rtol=0, atol=0)


class _ConvertedLinear(nn.Linear):
    """Stands in for a precision recipe's linear (its own forward, as MXFP8Linear's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class _SliceableLinear(_ConvertedLinear):
    """A converted linear with `forward_slice`, as gem_precision's FP8 linears have."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.slices: list[tuple[int, int, int]] = []

    def forward_slice(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        self.slices.append((x.shape[0], start, stop))
        return nn.functional.linear(x, self.weight[start:stop], self.bias[start:stop])


@pytest.mark.parametrize("kind", [_ConvertedLinear, _SliceableLinear])
def test_last_layer_rows_only_with_a_converted_wqkv(kind: type[nn.Linear]) -> None:
    """A converted `wqkv` (a Linear subclass with its own forward: FP8 recipes). With
    `forward_slice` the rows-only layer calls it twice, k/v over every row and q over the
    slot rows, and never its forward; without, it projects q for every row through the
    forward and gathers the slot rows after. Either way: the same logits and gradients as the
    every-row model."""
    cfg = tiny_config(**KUNLUN["skip_last"])
    torch.manual_seed(15)
    model = GEMModel(cfg)
    every = GEMModel(dataclasses.replace(cfg, last_layer_rows_only=False))
    every.load_state_dict(model.state_dict())
    att = model.layers[-1].seq_attention
    assert att is not None
    conv = kind(att.wqkv.in_features, att.wqkv.out_features)
    conv.load_state_dict(att.wqkv.state_dict())
    att.wqkv = conv
    seen: list[int] = []
    conv.register_forward_hook(lambda _m, inp, _out: seen.append(inp[0].shape[0]))
    lengths = [0, 2, 17, 9, 4]
    batch = make_batch(len(lengths), lengths=lengths, seed=12)

    (got, got_g), (want, want_g) = _logits_and_grads(model, batch), _logits_and_grads(every, batch)
    rows, d = sum(lengths) + len(lengths) * cfg.num_cls, cfg.d_model
    if kind is _SliceableLinear:
        assert seen == [] and conv.slices == [(rows, d, 3 * d), (len(lengths) * (cfg.num_cls + cfg.num_recent), 0, d)]
    else:
        assert seen == [rows]  # every row of the stream, once
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert_grads_close(got_g, want_g)


@pytest.mark.parametrize("recipe,d_model", [("fp8_block", 128), ("mxfp8_rceil", 64)])
def test_last_layer_rows_only_with_gem_precision_linears(recipe: str, d_model: int) -> None:
    """gem_precision's converted linears (reference arithmetic on CPU): the rows-only last
    layer reads q and k/v through `forward_slice`, never the fused forward, and the model
    matches the every-row model converted the same way (each row's codes and scales are the
    same in both: only the GEMMs' rounding differs)."""
    import gem_precision

    cfg = tiny_config(**KUNLUN["skip_last"], d_model=d_model)
    model = GEMModel(cfg)
    every = GEMModel(dataclasses.replace(cfg, last_layer_rows_only=False))
    every.load_state_dict(model.state_dict())
    for m in (model, every):
        converted = gem_precision.convert(m, recipe, min_features=1, keep_bf16=("heads*",))
        assert f"layers.{cfg.num_layers - 1}.seq_attention.wqkv" in converted
    att = model.layers[-1].seq_attention
    assert att is not None
    fused: list[int] = []
    sliced: list[tuple[int, int, int]] = []
    att.wqkv.register_forward_hook(lambda _m, inp, _out: fused.append(inp[0].shape[0]))
    real = att.wqkv.forward_slice

    def counted(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        sliced.append((x.shape[0], start, stop))
        out: torch.Tensor = real(x, start, stop)
        return out

    att.wqkv.forward_slice = counted  # type: ignore[method-assign]
    lengths = [0, 3, 21, 9, 5]
    batch = make_batch(len(lengths), lengths=lengths, seed=int(torch.randint(0, 100, ())))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the trainer runs them (FP8 linears return bf16)
        (got, got_g), (want, want_g) = _logits_and_grads(model, batch), _logits_and_grads(every, batch)
    rows, d = sum(lengths) + len(lengths) * cfg.num_cls, cfg.d_model
    assert fused == [] and sliced == [(rows, d, 3 * d), (len(lengths) * (cfg.num_cls + cfg.num_recent), 0, d)]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    # The gradients: FP8 quantizes dY in blocks along the tokens for the weight gradients,
    # and the rows-only layer packs its q rows densely, so the blocks (and their scales)
    # differ, and the difference grows through each earlier FP8 backward (up to ~20 % for
    # the first layers' weights; measured). The last layer's own q / k / v weight gradients
    # stay within ~1 % (a q that passes no gradient is off by 100 %); every parameter's
    # gradient points the same way overall.
    w = f"layers.{cfg.num_layers - 1}.seq_attention.wqkv.weight"
    for i, part in enumerate("qkv"):
        g, ref = got_g[w][i * d:(i + 1) * d], want_g[w][i * d:(i + 1) * d]
        assert float((g - ref).norm() / ref.norm()) < 0.05, part
    assert got_g.keys() == want_g.keys()
    flat = lambda gs: torch.cat([gs[n].float().flatten() / gs[n].float().norm().clamp_min(1e-12) for n in sorted(gs)])  # noqa: E731
    assert float(F.cosine_similarity(flat(got_g), flat(want_g), dim=0)) > 0.97


@pytest.mark.parametrize("extra,last_rows", [
    (dict(computation_skip=True, num_layers=2), True),
    (dict(computation_skip=True, num_layers=3), False),  # the last layer pools: it reads every event
    (dict(computation_skip=False, num_layers=2), False),
    (dict(computation_skip=True, num_layers=2, window=4), False),  # the band needs aligned positions
    (dict(computation_skip=True, num_layers=2, last_layer_rows_only=False), False),
    (dict(computation_skip=True, num_layers=2, sequence_attention=False), False),
])
def test_last_rows_only_where_the_stream_is_not_read(extra: dict[str, Any], last_rows: bool) -> None:
    model = GEMModel(tiny_config(**extra))
    assert [layer.last_rows for layer in model.layers] == [False] * (len(model.layers) - 1) + [last_rows]
    att = model.layers[-1].seq_attention
    assert (att is not None and att.query_slots is not None) == last_rows
    if last_rows:
        assert att is not None
        with pytest.raises(ValueError, match="slots must be given"):
            att(torch.zeros(4, model.cfg.d_model), None)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs on the GPU box)")
def test_last_rows_attention_gpu_matches_every_row() -> None:
    """On CUDA at the h200 layer's size (d 1024, 8 heads of 128, 4 CLS + 8 recent rows, long
    and empty sequences), bf16 under autocast: the slot queries through gem_kernels' jagged
    cross-attention give the every-row layer's outputs at those rows, and the same gradients."""
    cfg = tiny_config(d_model=1024, num_heads=8, num_cls=4, num_recent=8)
    torch.manual_seed(21)
    every = SeqAttention(cfg).cuda()
    rows_only = SeqAttention(cfg, cfg.num_cls + cfg.num_recent).cuda()
    rows_only.load_state_dict(every.state_dict())
    lengths = [0, 3, 2_500, 700, 64, 1_300, 9, 4_000]
    offsets = torch.tensor([0] + lengths).cumsum(0).cuda()
    lay = _jagged.prefix_layout(offsets, max(lengths), sum(lengths), cfg.num_cls, head_dim=cfg.head_dim,
                                rope_base=cfg.rope_base)
    rows, valid = _jagged.query_slots(lay, cfg.num_recent)
    comb0 = torch.randn(lay.sample.shape[0], cfg.d_model, device="cuda").to(torch.bfloat16)
    up = torch.randn(*rows.shape, cfg.d_model, device="cuda")

    def run(m: SeqAttention, slots: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        m.zero_grad(set_to_none=True)
        comb = comb0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(comb, lay, slots) if slots else m(comb, lay)[rows] * valid[..., None]
        (out.float() * up).sum().backward()
        return out.detach().float(), [comb.grad, *(p.grad for p in m.parameters())]  # type: ignore[list-item]

    (got, got_g), (want, want_g) = run(rows_only, (rows, valid)), run(every, None)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * float(b.abs().max()))


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (Bazel sets it) or a GPU")
def test_last_rows_attention_triton_matches_reference() -> None:
    """The slot path through gem_kernels' Triton kernels (Triton's interpreter on CPU): q
    projected apart, k and v read strided from the `[T, 2, H, D]` projection. Outputs and
    gradients equal the reference backend's, with empty and short sequences."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tiny_config(num_cls=2, num_recent=3)
    g = torch.Generator().manual_seed(int(torch.randint(0, 10**6, ())))
    lengths = [0, 2, 9] + torch.randint(0, 12, (2,), generator=g).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0).to(dev)
    lay = _jagged.prefix_layout(offsets, max(lengths), sum(lengths), cfg.num_cls, head_dim=cfg.head_dim,
                                rope_base=cfg.rope_base)
    slots = _jagged.query_slots(lay, cfg.num_recent)
    comb0 = torch.randn(lay.sample.shape[0], cfg.d_model, generator=g).to(dev)
    state = SeqAttention(cfg, cfg.num_cls + cfg.num_recent).state_dict()
    res = []
    for backend in ("reference", "triton"):
        m = SeqAttention(dataclasses.replace(cfg, attention_backend=backend), cfg.num_cls + cfg.num_recent).to(dev)
        m.load_state_dict(state)
        comb = comb0.clone().requires_grad_()
        out = m(comb, lay, slots)
        out.square().sum().backward()
        res.append([out.detach(), comb.grad, *(p.grad for p in m.parameters())])
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()) + 1e-6)


def _pooling_unpacked(m: SeqPooling, seq: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """gem-model <= 0.5.1's pooling: k and v split by `unbind` (whose backward stacks dk, dv)."""
    b, t = offsets.shape[0] - 1, seq.shape[0]
    q = m.wq(m.seeds).reshape(1, m.n_seeds, m.heads, m.dh).expand(b, -1, -1, -1).reshape(b * m.n_seeds, m.heads, m.dh)
    k, v = m.wkv(m.norm(seq)).reshape(t, 2, m.heads, m.dh).unbind(1)
    o = _jagged.attention(q, k, v, _jagged.uniform_offsets(b, m.n_seeds, seq.device), offsets, m.n_seeds, max_len,
                          backend=m.backend)
    p = m.wo(o.reshape(b * m.n_seeds, m.d)).reshape(b, m.n_seeds, m.d) + m.seeds.to(o.dtype)
    assert m.down is not None and m.up is not None
    return m.up(m.down(p.transpose(1, 2))).transpose(1, 2)


def _pooling_pair(m: SeqPooling, seq0: torch.Tensor, offsets: torch.Tensor, max_len: int, up: torch.Tensor,
                  autocast: bool = False) -> list[list[torch.Tensor]]:
    """[outputs and gradients] of the packed pooling (the module) and the unpacked one."""
    res = []
    for fn in (m, lambda s, o, n: _pooling_unpacked(m, s, o, n)):
        m.zero_grad(set_to_none=True)
        seq = seq0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = fn(seq, offsets, max_len)
        (out.float() * up).sum().backward()
        res.append([out.detach().float(), seq.grad, *(p.grad for p in m.parameters())])
    return res


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs TRITON_INTERPRET=1 (Bazel sets it) or a GPU")
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_pooling_with_packed_kv_matches_unbind(backend: str) -> None:
    """gem-model 0.5.2's pooling hands `[T, 2, H, D]` to the attention and gets kv's gradient back
    as one tensor: the same outputs and gradients as k, v split by `unbind` (0.5.1), on both
    backends (Triton's interpreter on CPU), with empty and one-event sequences."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dataclasses.replace(tiny_config(), hierarchical_pooling=True, hier_seeds=4, hier_rank=2,
                              attention_backend=backend)
    g = torch.Generator().manual_seed(int(torch.randint(0, 10**6, ())))
    lengths = [0, 1, 9] + torch.randint(0, 14, (2,), generator=g).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0).to(dev)
    m = SeqPooling(cfg).to(dev)
    seq0 = torch.randn(sum(lengths), cfg.d_model, generator=g).to(dev)
    up = torch.randn(len(lengths), cfg.num_pma_seeds, cfg.d_model, generator=g).to(dev)
    got, want = _pooling_pair(m, seq0, offsets, max(lengths), up)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()) + 1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pooling_with_packed_kv_gpu_matches_unbind() -> None:
    """The h200 pooling's size on CUDA, bf16 under autocast (32 seeds, 8 heads of 128, long and
    empty histories): packed kv gives the unpacked pooling's outputs and gradients. The
    backward is FlashAttention-4's where it imports (dk, dv written into kv's gradient
    directly), else torch's FlashAttention-2's."""
    cfg = dataclasses.replace(tiny_config(d_model=1024, num_heads=8), hierarchical_pooling=True, hier_seeds=32,
                              hier_rank=8, num_pma_seeds=8)
    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    m = SeqPooling(cfg).cuda()
    lengths = [0, 3, 2_500, 700, 64, 1_300, 9, 4_000]
    offsets = torch.tensor([0] + lengths).cumsum(0).cuda()
    seq0 = torch.randn(sum(lengths), cfg.d_model, device="cuda").to(torch.bfloat16)
    up = torch.randn(len(lengths), cfg.num_pma_seeds, cfg.d_model, device="cuda")
    got, want = _pooling_pair(m, seq0, offsets, max(lengths), up, autocast=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2 * float(b.abs().max()))


def test_last_layer_rows_only_under_activation_checkpointing() -> None:
    """With every layer under torch's non-reentrant activation checkpointing (the trainer's
    `--ac`), the rows-only last layer (its `slot_rows` gathers recomputed in the backward)
    gives the same logits and gradients as without."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    cfg = tiny_config(**KUNLUN["skip_last"])
    torch.manual_seed(9)
    plain = GEMModel(cfg)
    ac = GEMModel(cfg)
    ac.load_state_dict(plain.state_dict())
    for i in range(len(ac.layers)):
        ac.layers[i] = checkpoint_wrapper(ac.layers[i], preserve_rng_state=False)
    assert plain.layers[-1].last_rows
    batch = make_batch(6, lengths=[0, 1, 14, 3, 8, 25], seed=8)

    (got, got_g), (want, want_g) = _logits_and_grads(ac, batch), _logits_and_grads(plain, batch)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_g.keys() == want_g.keys()
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=0, atol=0, msg=n)
