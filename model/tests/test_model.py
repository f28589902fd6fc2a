"""GEMModel: shapes, gradients, FLOP count, edge lengths, config and input validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from _batch import FEATURES, KUNLUN, make_batch, tiny_config
from gem_model import GEMConfig, GEMModel, presets
from gem_model import _flops, _jagged
from gem_model._embedding import rank_bucket, torchrec_available
from gem_model._layers import recent_tokens

@pytest.mark.parametrize("name", list(KUNLUN))
def test_shapes_and_every_parameter_gets_gradient(name: str) -> None:
    torch.manual_seed(0)
    model = GEMModel(tiny_config(**KUNLUN[name]))
    batch = make_batch(6, lengths=[0, 1, 5, 17, 2, 9], seed=1)
    logits = model(batch)
    assert logits.shape == (6, 2) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    zero = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.any()]
    # Only embedding rows/tables can be all-zero by chance of ids; dense weights must move.
    assert all("weight" in n and ("bags" in n or "ebc" in n or "domain" in n) for n in zero), zero


def test_empty_and_all_empty_batches() -> None:
    model = GEMModel(tiny_config(gdpa_ffn=True))
    for lengths in ([0, 0, 0], [1], [0, 3]):
        batch = make_batch(len(lengths), lengths=lengths, seed=2)
        out = model(batch)
        assert out.shape == (len(lengths), 2) and torch.isfinite(out).all()


def _slot_rows(cfg: GEMConfig, lengths: list[int]) -> list[int]:
    """Per sample, the valid query slots of a `last_rows` layer: its CLS rows and up to
    num_recent events."""
    return [cfg.num_cls + min(cfg.num_recent, n) for n in lengths]


def _flop_counter(model: GEMModel, batch: Any) -> int:
    """Matrix-product FLOPs executed, less the known waste the analytic count (the useful
    work) leaves out: the sequence FFN's work on the CLS rows (the model runs its FFN over
    the CLS-prefixed layout, copy-free, and overwrites those rows), and in a `last_rows`
    layer q and `wo` over its invalid slots (it projects q for its slots only)."""
    fc = FlopCounterMode(display=False)
    with fc:
        model(batch)
    lengths = _jagged.lengths_of(batch.seq_offsets).tolist()
    cfg = model.cfg
    n = cfg.num_cls if cfg.sequence_attention else 0
    waste = sum(
        layer.seq_ffn.flops(_flops.Shapes(tuple(x + n for x in lengths)))  # type: ignore[union-attr,operator]
        - layer.seq_ffn.flops(_flops.Shapes(tuple(lengths)))  # type: ignore[union-attr,operator]
        for layer in model.layers
    )
    if model.layers[-1].last_rows:
        slots, valid = len(lengths) * (n + cfg.num_recent), sum(_slot_rows(cfg, lengths))
        waste += 2 * _flops.linear(slots - valid, cfg.d_model, cfg.d_model)
    return int(fc.get_total_flops() - waste)


FLOP_CASES = ["interformer", "gdpa", "hier_pool", "skip", "skip_last", "event_widths"]


@pytest.mark.parametrize("name", FLOP_CASES)
def test_flops_match_flop_counter(name: str) -> None:
    """Analytic FLOPs vs FlopCounterMode on the reference attention path, equal lengths.

    Both count matrix products only. The kernels' reference attention is padded (or per
    sample); with equal lengths and no window both do exactly the visible pairs, so the
    counts agree exactly once the event GEMM's all-zero CLS input rows are added (so a
    projection over rows no output reads, e.g. q for every row of a `last_rows` layer,
    fails it).
    """
    model = GEMModel(tiny_config(attention_backend="reference", **KUNLUN[name]))
    lengths = [23] * 5
    batch = make_batch(5, lengths=lengths, seed=3)
    counted = _flop_counter(model, batch)
    analytic = model.flops(batch)
    assert analytic["total"] + _cls_event_rows(model, lengths) == pytest.approx(counted, rel=1e-9), (analytic, counted)
    assert analytic["total"] == pytest.approx(sum(v for k, v in analytic.items() if k != "total"))
    assert analytic["seq_attention"] > 0 and analytic["pooling"] > 0


def _padding_waste(model: GEMModel, lengths: list[int]) -> float:
    """Attention FLOPs a padded implementation does beyond the visible pairs."""
    cfg = model.cfg
    b, lmax, t = len(lengths), max(lengths), sum(lengths)
    lc = [n + cfg.num_cls for n in lengths]
    last_rows = model.layers[-1].last_rows
    full = cfg.num_layers - last_rows
    waste = full * (b * (lmax + cfg.num_cls) ** 2 - sum(_flops.band_pairs(n, cfg.window) for n in lc))
    if last_rows:  # every slot over the padded keys, against the valid slots over their own
        r = cfg.num_cls + cfg.num_recent
        waste += b * r * (lmax + cfg.num_cls) - sum(q * m for q, m in zip(_slot_rows(cfg, lengths), lc))
    n_seeds = cfg.hier_seeds if cfg.hierarchical_pooling else cfg.num_pma_seeds
    pools = sum(cfg.pools_at(i) for i in range(cfg.num_layers))
    waste += pools * n_seeds * (b * lmax - t)
    if cfg.gdpa_ffn:
        waste += cfg.num_layers * cfg.gdpa_kv_len * (b * lmax - t)
    return _flops.attention(waste, cfg.num_heads, cfg.head_dim)


def _cls_event_rows(model: GEMModel, lengths: list[int]) -> float:
    """FLOPs of the event GEMM over the CLS rows: it builds the tokens in the CLS layout, so
    it also multiplies the all-zero CLS input rows (EventArch with `lay`)."""
    ev, cfg = model.events, model.cfg
    if not cfg.sequence_attention or cfg.stream_dtype != "compute":
        return 0.0
    k = ev.proj.in_features + sum(t.num_embeddings for t in (ev.type_emb, ev.age, ev.rank) if t is not None)
    return 2.0 * len(lengths) * cfg.num_cls * k * cfg.d_model


@pytest.mark.parametrize("name", FLOP_CASES + ["window"])
def test_jagged_flops_bracket_flop_counter(name: str) -> None:
    """Jagged lengths: the analytic count is the useful work; the reference path does at
    least that and at most that plus the padding (and masked-window) waste."""
    cfg = tiny_config(attention_backend="reference", **KUNLUN[name])
    model = GEMModel(cfg)
    lengths = [0, 1, 30, 7, 64, 3]
    batch = make_batch(len(lengths), lengths=lengths, seed=4)
    counted = _flop_counter(model, batch)
    analytic = model.flops(batch)["total"]
    assert analytic <= counted * 1.0001
    assert counted <= (analytic + _padding_waste(model, lengths) + _cls_event_rows(model, lengths)) * 1.0001


def test_window_flops_count_only_visible_pairs() -> None:
    """With a window the analytic count is the band; the reference computes (then masks) all
    pairs, so with equal lengths FlopCounterMode exceeds it by exactly the masked pairs."""
    cfg = tiny_config(attention_backend="reference", window=4)
    model = GEMModel(cfg)
    lengths = [20] * 4
    batch = make_batch(4, lengths=lengths, seed=4)
    counted = _flop_counter(model, batch)
    analytic = model.flops(batch)["total"]
    full = sum((n + cfg.num_cls) ** 2 for n in lengths)
    band = sum(_flops.band_pairs(n + cfg.num_cls, 4) for n in lengths)
    masked = _flops.attention(full - band, cfg.num_heads, cfg.head_dim) * cfg.num_layers
    assert counted == pytest.approx(analytic + masked + _cls_event_rows(model, lengths))


@pytest.mark.parametrize("n,w", [(0, 3), (1, 1), (5, 1), (5, 3), (9, 4), (4, 9)])
def test_band_pairs_brute_force(n: int, w: int) -> None:
    i = torch.arange(n)
    assert _flops.band_pairs(n, w) == int(((i[:, None] - i[None, :]).abs() < w).sum())


def test_flops_scale_with_tokens() -> None:
    model = GEMModel(tiny_config())
    short, long = model.flops_for((10, 10)), model.flops_for((100, 100))
    assert long["seq_ffn"] == pytest.approx(10 * short["seq_ffn"], rel=0.05)
    assert long["seq_attention"] > 10 * short["seq_attention"]  # quadratic part
    assert long["interaction"] == short["interaction"]  # per-sample, not per-token


def test_h200_preset_is_wide() -> None:
    cfg = presets.h200(**FEATURES)
    assert cfg.head_dim == 128 and 512 <= cfg.d_model <= 1024
    assert cfg.gdpa_ffn and cfg.hierarchical_pooling and cfg.computation_skip


def test_recent_tokens_against_loops() -> None:
    lengths = [3, 0, 1, 5]
    offsets = torch.tensor([0, 3, 3, 4, 9])
    seq = torch.randn(9, 4)
    rec = recent_tokens(seq, offsets, 2)
    for b, n in enumerate(lengths):
        last = seq[offsets[b] : offsets[b + 1]][-2:]
        want = torch.cat([torch.zeros(2 - last.shape[0], 4), last])
        torch.testing.assert_close(rec[b], want, rtol=0, atol=0)


def test_rank_buckets_against_loops() -> None:
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    lengths = torch.randint(0, 3000, (7,), generator=g).tolist() + [0, 1, 16, 17]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    sample = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    got = rank_bucket(offsets, sample, 24).tolist()
    want = []
    for n in lengths:
        for pos in range(n):
            r = n - 1 - pos  # events newer than this one
            want.append(min(r if r < 16 else 12 + r.bit_length() - 1, 23))
    assert got == want


def test_rank_buckets_off_and_validated() -> None:
    model = GEMModel(tiny_config(rank_buckets=0))
    assert model.events.rank is None
    with pytest.raises(ValueError, match="rank_buckets"):
        tiny_config(rank_buckets=-1)


def test_event_widths_mask_columns_per_type() -> None:
    torch.manual_seed(0)
    model = GEMModel(tiny_config(event_widths=(16, 8, 4, 2)))
    batch = make_batch(3, lengths=[4, 6, 2], seed=5)
    batch.event_types = torch.full_like(batch.event_types, 3)  # every event has width 2
    before = model(batch)
    with torch.no_grad():
        model.events.item.weight[:, 2:] += 1.0
    torch.testing.assert_close(model(batch), before)
    with torch.no_grad():
        model.events.item.weight[:, :2] += 1.0
    assert not torch.allclose(model(batch), before)


def test_computation_skip_reuses_pooling() -> None:
    model = GEMModel(tiny_config(computation_skip=True, num_layers=4))
    pools = [layer.pooling is not None for layer in model.layers]  # type: ignore[union-attr]
    assert pools == [True, False, True, False]
    f = model.flops_for((10, 20))
    full = GEMModel(tiny_config(num_layers=4)).flops_for((10, 20))
    assert f["pooling"] == pytest.approx(full["pooling"] / 2)


@pytest.mark.skipif(not torchrec_available(), reason="torchrec not installed")
def test_torchrec_and_plain_front_ends_agree() -> None:
    torch.manual_seed(0)
    a = GEMModel(tiny_config(use_torchrec=True))
    b = GEMModel(tiny_config(use_torchrec=False))
    sd = b.state_dict()
    for name, _ in FEATURES["sparse_features"]:
        sd[f"sparse.bags.{name}.weight"] = a.sparse.ebc.embedding_bags[f"t_{name}"].weight  # type: ignore[union-attr,index]
    for k, v in a.state_dict().items():
        if not k.startswith("sparse.ebc"):
            sd[k] = v
    b.load_state_dict(sd)
    batch = make_batch(4, seed=6)
    torch.testing.assert_close(a(batch), b(batch))


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="d_model"):
        tiny_config(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="hier_seeds"):
        tiny_config(hierarchical_pooling=True, hier_seeds=2)
    with pytest.raises(ValueError, match="event_widths"):
        tiny_config(event_widths=(4, 4))
    with pytest.raises(ValueError, match="window"):
        tiny_config(window=0)
    with pytest.raises(ValueError, match="attention_backend"):
        tiny_config(attention_backend="cuda")
    for switch in ("stream_bias", "merged_stream_reads", "select_stream_rows", "gather_stream_grads",
                   "inplace_residual_gemm", "last_layer_rows_only"):
        with pytest.raises(ValueError, match=f"GEMConfig.{switch}=1 must be a bool"):
            tiny_config(**{switch: 1})
    with pytest.raises(TypeError, match="feature sizes"):
        presets.tiny(event_vocab=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config().d_model = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        GEMConfig(10, 2, (), 1, 1)  # type: ignore[misc]  # keyword-only


def test_bad_batch_raises() -> None:
    model = GEMModel(tiny_config())
    batch = make_batch(3, seed=7)
    bad = make_batch(3, seed=7)
    bad.seq_offsets = bad.seq_offsets[:-1]
    with pytest.raises(ValueError, match="seq_offsets"):
        model(bad)
    bad = make_batch(3, seed=7)
    bad.max_seq_len = torch.tensor(5)  # type: ignore[assignment]
    with pytest.raises(TypeError, match="max_seq_len"):
        model(bad)
    assert model(batch).shape == (3, 2)


def _on(batch: Any, device: str) -> Any:
    """The test batch with every tensor (the sparse features too) on `device`."""
    fields = ("event_ids", "event_types", "timestamps", "seq_offsets", "dense", "domain", "labels")
    out = dataclasses.replace(batch, **{f: getattr(batch, f).to(device) for f in fields})
    out.sparse = batch.sparse.to(device)
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_bf16_autocast_matches_reference_backend() -> None:
    torch.manual_seed(0)
    cfg = presets.h200(**FEATURES, num_layers=2, d_model=256, num_heads=2, event_widths=(256, 128, 64, 32))
    fast = GEMModel(cfg).cuda()
    ref = GEMModel(dataclasses.replace(cfg, attention_backend="reference")).cuda()
    ref.load_state_dict(fast.state_dict())
    batch = _on(make_batch(16, max_len=700, seed=8), "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = fast(batch), ref(batch)
    torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
    a.sum().backward()
    assert all(p.grad is not None for p in fast.parameters())


def _stream_dtypes(model: GEMModel) -> list[torch.dtype]:
    """Registers a hook recording the dtype of the token stream each layer receives."""
    seen: list[torch.dtype] = []
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda _m, args: seen.append(args[1].dtype))
    return seen


def test_stream_dtype_is_validated_and_a_no_op_without_autocast() -> None:
    with pytest.raises(ValueError, match="stream_dtype='bf16' must be one of"):
        tiny_config(stream_dtype="bf16")
    torch.manual_seed(3)
    a = GEMModel(tiny_config(gdpa_ffn=True))
    b = GEMModel(tiny_config(gdpa_ffn=True, stream_dtype="float32"))
    b.load_state_dict(a.state_dict())
    seen = _stream_dtypes(a)
    batch = make_batch(5, lengths=[0, 4, 11, 1, 6], seed=4)
    torch.testing.assert_close(a(batch), b(batch), rtol=1e-5, atol=1e-6)
    assert seen and set(seen) == {torch.float32}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_compute_stream_is_bf16_and_as_accurate_as_float32_stream() -> None:
    """Under bf16 autocast the "compute" stream is bf16 and "float32" is float32; against
    the float32 model without autocast, the bf16 stream's logits and layer gradients are
    within 2x the float32 stream's error (both carry bf16 matmul rounding)."""
    torch.manual_seed(0)
    cfg = presets.h200(**FEATURES, num_layers=2, d_model=256, num_heads=2)
    fast = GEMModel(cfg).cuda()
    wide = GEMModel(dataclasses.replace(cfg, stream_dtype="float32")).cuda()
    exact = GEMModel(dataclasses.replace(cfg, attention_backend="reference")).cuda()
    wide.load_state_dict(fast.state_dict())
    exact.load_state_dict(fast.state_dict())
    seen_fast, seen_wide = _stream_dtypes(fast), _stream_dtypes(wide)
    batch = _on(make_batch(16, max_len=700, seed=11), "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = fast(batch), wide(batch)
    ref = exact(batch)
    assert set(seen_fast) == {torch.bfloat16} and set(seen_wide) == {torch.float32}

    def rel(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((x.float() - y.float()).norm() / y.float().norm().clamp(min=1e-12))

    err_a, err_b = rel(a, ref), rel(b, ref)
    assert err_a < 2 * err_b + 1e-3, (err_a, err_b)
    for m in (fast, wide, exact):
        m.zero_grad()
    for out in (a, b, ref):
        torch.nn.functional.binary_cross_entropy_with_logits(out, batch.labels).backward()

    def layer_grads(m: GEMModel) -> torch.Tensor:
        return torch.cat([p.grad.float().flatten() for n, p in m.named_parameters() if "layers" in n and p.grad is not None])

    g_ref = layer_grads(exact)
    gerr_a, gerr_b = rel(layer_grads(fast), g_ref), rel(layer_grads(wide), g_ref)
    assert gerr_a < 2 * gerr_b + 1e-3, (gerr_a, gerr_b)


def test_mxfp8_recipe_converts_linears_and_trains() -> None:
    torch.manual_seed(0)
    # The model never imports precision code; the conversion is applied from outside
    # (gem_parallel.parallelize in the trainer), here directly through gem_precision.
    import gem_precision

    model = GEMModel(tiny_config(d_model=64))
    converted = gem_precision.convert_to_mxfp8(model, "mxfp8_rceil", min_features=64, keep_bf16=("heads*",))
    assert converted, "no linear was converted"
    assert not any(n.startswith("heads") for n in converted)
    batch = make_batch(4, lengths=[3, 0, 8, 5], seed=9)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("stream_dtype", ["compute", "float32"])
@pytest.mark.parametrize("rank_buckets", [0, 24])
def test_event_tokens_match_the_plain_sum_of_lookups(stream_dtype: str, rank_buckets: int) -> None:
    """EventArch's one embedding_bag + addmm equals proj(item) + type + age + rank lookups."""
    from gem_model._embedding import EventArch

    torch.manual_seed(5)
    cfg = tiny_config(stream_dtype=stream_dtype, rank_buckets=rank_buckets, event_widths=(16, 8, 4, 2))
    arch = EventArch(cfg)
    for p in arch.parameters():  # non-zero everywhere (the bias starts at zero otherwise)
        torch.nn.init.normal_(p, std=0.1)
    batch = make_batch(6, lengths=[0, 3, 40, 1, 7, 19], seed=6)
    offsets = batch.seq_offsets
    sample = _jagged.token_sample(offsets, batch.event_ids.shape[0])

    def reference() -> torch.Tensor:
        x = arch.item(batch.event_ids)
        assert arch.width_mask is not None
        x = x * arch.width_mask[batch.event_types]
        ts = batch.timestamps
        age = (ts[(offsets[1:] - 1).clamp(min=0)][sample] - ts).clamp(min=0).to(torch.float32)
        bucket = torch.log2(age + 1.0).long().clamp(max=arch.num_time_buckets - 1)
        out = arch.proj(x) + arch.type_emb(batch.event_types) + arch.age(bucket)
        if arch.rank is not None:
            out = out + arch.rank(rank_bucket(offsets, sample, arch.rank.num_embeddings))
        return out

    def run(fn: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        arch.zero_grad(set_to_none=True)
        out = fn()
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in arch.named_parameters() if p.grad is not None}

    want, want_g = run(reference)
    got, got_g = run(lambda: arch(batch.event_ids, batch.event_types, batch.timestamps, offsets, sample))
    assert (arch.rank is None) == (rank_buckets == 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_g.keys() == want_g.keys()
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-5, msg=n)


@pytest.mark.parametrize("use_torchrec", [
    False, pytest.param(True, marks=pytest.mark.skipif(not torchrec_available(), reason="torchrec not installed"))])
def test_sparse_table_grads_equal_the_dense_gradients(use_torchrec: bool) -> None:
    """After `sparse_table_grads`, every looked-up table gets a sparse gradient equal to the
    dense one a plain copy gets on the same batch; the rest of the gradients are unchanged."""
    import copy

    from gem_model import sparse_table_grads

    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    dense = GEMModel(tiny_config(use_torchrec=use_torchrec, **KUNLUN["all"]))
    sparse = copy.deepcopy(dense)
    names = sparse_table_grads(sparse)
    assert "events.item" in names and "dense.domain" in names
    assert any(n.startswith("sparse.") for n in names)
    batch = make_batch(6, lengths=[0, 1, 5, 17, 2, 9], seed=int(torch.randint(0, 10**6, ())))
    for m in (dense, sparse):
        torch.nn.functional.binary_cross_entropy_with_logits(m(batch), batch.labels).backward()
    looked_up = 0
    for (n, pd), (_, ps) in zip(dense.named_parameters(), sparse.named_parameters(), strict=True):
        assert pd.grad is not None and ps.grad is not None, n
        if ps.grad.is_sparse:
            looked_up += 1
            torch.testing.assert_close(ps.grad.to_dense(), pd.grad, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(ps.grad, pd.grad), n
    # the item table, the sparse features, the domain lookups (front end and heads)
    assert looked_up >= 3 + len(FEATURES["sparse_features"]), looked_up
    assert sparse.events.item.weight.grad.is_sparse  # type: ignore[union-attr]
    assert not sparse.events.type_emb.weight.grad.is_sparse  # read directly (folded into a GEMM)
