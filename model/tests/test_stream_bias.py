"""GEMConfig.stream_bias=False: the token-stream linears without biases, the residual added
inside the projection's GEMM (`_layers._add_linear`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from _batch import FEATURES, KUNLUN, make_batch, tiny_config
from gem_model import GEMModel, presets
from gem_model._layers import _add_linear

# The linears over every stream row, per layer (those with `bias=cfg.stream_bias`).
STREAM = ("seq_ffn.w1", "seq_ffn.w2", "seq_ffn.wq", "seq_ffn.wo", "seq_attention.wqkv", "seq_attention.wo",
          "pooling.wkv")


def _is_stream(name: str) -> bool:
    return any(f".{name}".endswith(f".{s}") for s in STREAM)


def _stream_bias_names(model: GEMModel) -> list[str]:
    return [n for n, _ in model.named_parameters() if n.endswith(".bias") and _is_stream(n[: -len(".bias")])]


@pytest.mark.parametrize("name", ["interformer", "gdpa", "skip_last", "all"])
def test_off_drops_only_the_stream_biases_and_equals_zero_biases(name: str) -> None:
    """The bias-free model computes what the biased one computes with those biases zero
    (logits and every shared parameter's gradient), and only the stream linears lose theirs."""
    torch.manual_seed(3)
    cfg = tiny_config(**KUNLUN[name])
    biased = GEMModel(cfg)
    free = GEMModel(dataclasses.replace(cfg, stream_bias=False))
    dropped = _stream_bias_names(biased)
    assert dropped, "the config has stream linears"
    assert not _stream_bias_names(free)
    assert set(biased.state_dict()) - set(free.state_dict()) == set(dropped)
    # Per-sample linears (summaries, interaction, pooling's seeds) keep theirs.
    assert any(n.endswith("interaction.wqkv.bias") for n, _ in free.named_parameters())
    with torch.no_grad():
        for n, p in biased.named_parameters():
            if n in dropped:
                p.uniform_(-0.5, 0.5)  # random first: the zeroed run below must differ from this one
    batch = make_batch(6, lengths=[0, 3, 11, 1, 7, 19], seed=5)
    with_bias = biased(batch)
    with torch.no_grad():
        for n, p in biased.named_parameters():
            if n in dropped:
                p.zero_()
    free.load_state_dict({k: v for k, v in biased.state_dict().items() if k not in dropped})
    a, b = biased(batch), free(batch)
    assert not torch.allclose(with_bias, a), "the stream biases had no effect to remove"
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for m, out in ((biased, a), (free, b)):
        torch.nn.functional.binary_cross_entropy_with_logits(out, batch.labels).backward()
    grads = dict(biased.named_parameters())
    for n, p in free.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, rtol=1e-4, atol=1e-6, msg=n)


def test_h200_preset_drops_stream_biases_and_loading_biased_state_names_keys() -> None:
    cfg = presets.h200(**FEATURES, num_layers=2, d_model=64, num_heads=2)
    assert cfg.stream_bias is False and presets.tiny(**FEATURES).stream_bias is True
    free = GEMModel(cfg)
    biased = GEMModel(dataclasses.replace(cfg, stream_bias=True))
    with pytest.raises(RuntimeError, match=r"Unexpected key.*seq_attention\.wqkv\.bias"):
        free.load_state_dict(biased.state_dict())
    with pytest.raises(ValueError, match="stream_bias"):
        dataclasses.replace(cfg, stream_bias=1)


def _plain(res: torch.Tensor, lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return res + lin(x)


def test_add_linear_against_the_plain_sum() -> None:
    torch.manual_seed(0)
    res, x = torch.randn(37, 24), torch.randn(37, 16)
    free, biased = nn.Linear(16, 24, bias=False), nn.Linear(16, 24)
    # Bias-free, same dtype: the GEMM's own sum (not bitwise the two-step one).
    torch.testing.assert_close(_add_linear(res, free, x), _plain(res, free, x), rtol=1e-5, atol=1e-5)
    # With a bias, or 3-D operands: exactly the plain form.
    assert torch.equal(_add_linear(res, biased, x), _plain(res, biased, x))
    r3, x3 = res.reshape(1, 37, 24), x.reshape(1, 37, 16)
    assert torch.equal(_add_linear(r3, free, x3), _plain(r3, free, x3))
    # Gradients reach the residual, the input and the weight as through the plain form.
    leaves = [t.clone().requires_grad_() for t in (res, x)]
    _add_linear(leaves[0], free, leaves[1]).pow(2).sum().backward()
    got = [t.grad for t in leaves] + [free.weight.grad]
    free.weight.grad = None
    ref_leaves = [t.clone().requires_grad_() for t in (res, x)]
    _plain(ref_leaves[0], free, ref_leaves[1]).pow(2).sum().backward()
    for g, want in zip(got, [t.grad for t in ref_leaves] + [free.weight.grad]):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)


def test_add_linear_under_autocast_keeps_the_plain_dtype() -> None:
    """bf16 autocast: a bf16 residual is added in the GEMM (bf16 out, one rounding: at least
    as close to the float32 sum as the plain form); a float32 residual (stream_dtype
    "float32") keeps the plain float32 sum."""
    torch.manual_seed(1)
    free = nn.Linear(32, 48, bias=False)
    x = torch.randn(64, 32)
    res16 = torch.randn(64, 48).bfloat16()
    exact = res16.float() + x @ free.weight.t()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused, plain = _add_linear(res16, free, x), _plain(res16, free, x)
        wide = _add_linear(res16.float(), free, x)
        wide_plain = _plain(res16.float(), free, x)
    assert fused.dtype == plain.dtype == torch.bfloat16
    assert wide.dtype == torch.float32 and torch.equal(wide, wide_plain)
    err = (fused.float() - exact).abs().max()
    assert err <= (plain.float() - exact).abs().max() + 1e-6 and err < 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_add_linear_bf16_at_the_h200_width() -> None:
    """On the GPU under bf16 autocast, at the h200 stream width: the GEMM's sum against the
    float32 one, within the plain form's error."""
    torch.manual_seed(2)
    free = nn.Linear(1024, 1024, bias=False).cuda()
    x, res = torch.randn(4099, 1024, device="cuda"), torch.randn(4099, 1024, device="cuda").bfloat16()
    exact = res.float() + x @ free.weight.t()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused, plain = _add_linear(res, free, x), _plain(res, free, x)
    assert fused.dtype == torch.bfloat16
    rel = lambda y: float((y.float() - exact).norm() / exact.norm())  # noqa: E731
    assert rel(fused) <= rel(plain) * 1.05 + 1e-6, (rel(fused), rel(plain))


@pytest.mark.parametrize("device,autocast", [
    ("cpu", False), ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")),
])
def test_inplace_residual_gemm_compiled_is_addmm_bit_for_bit(device: str, autocast: bool) -> None:
    """GEMConfig.inplace_residual_gemm: compiled by inductor, `_add_linear(..., in_place=True)`
    gives addmm's sum bit for bit and its gradients, through `gem_model::addmm_into` on a
    copy of the residual (no `addmm` left in the compiled code; the option off keeps it)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(4)
    n, k, d = (4099, 4096, 1024) if device == "cuda" else (53, 40, 24)  # cuda: the h200 FFN's w2
    lin = nn.Linear(k, d, bias=False, device=device)
    norm = nn.LayerNorm(d, device=device)
    dt = torch.bfloat16 if autocast else torch.float32

    def block(res: torch.Tensor, x: torch.Tensor, in_place: bool) -> torch.Tensor:
        # as in the layers: a layer norm reads the residual, the GEMM adds into it
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            h = torch.nn.functional.gelu(x * norm(res).to(x.dtype)[:, :1])
            return _add_linear(res, lin, h, in_place)

    res, x = torch.randn(n, d, device=device).to(dt), torch.randn(n, k, device=device).to(dt)
    results = {}
    for in_place in (True, False):
        torch._dynamo.reset()
        leaves = [t.clone().requires_grad_() for t in (res, x)]
        f = torch.compile(lambda r, y, ip=in_place: block(r, y, ip), backend="inductor", fullgraph=True)
        out, code = run_and_get_code(f, *leaves)
        out.float().pow(2).sum().backward()
        grads = [t.grad for t in leaves] + [lin.weight.grad, norm.weight.grad]
        lin.weight.grad = norm.weight.grad = None
        results[in_place] = (out.detach(), grads, "\n".join(code))
    (got, got_g, code), (want, want_g, plain_code) = results[True], results[False]
    assert got.dtype == dt and torch.equal(got, want)
    rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
    tol = 1e-2 if autocast else 1e-6  # bf16: the backward's GEMMs may sum in another order
    for g, w in zip(got_g, want_g):
        assert rel(g, w) < tol
    assert "gem_model.addmm_into" in code and "addmm(" not in code.replace("addmm_into", "")
    assert "addmm" in plain_code and "addmm_into" not in plain_code
    # Eager (not compiling) keeps addmm: the same values either way, close to the compiled ones.
    eager = block(res, x, True)
    assert torch.equal(eager, block(res, x, False))
    assert rel(eager, got) < tol
