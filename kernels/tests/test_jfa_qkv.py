"""`jagged_flash_attention_qkv`: self-attention from one fused `[T, 3, H, D]` projection with
rotary q and k, its gradient one `[T, 3, H, D]` tensor written by the attention's backward and
rotated back in place.

CPU (Triton's interpreter, 16x16 tiles, lengths 0 and 1 and on the tile edges): against the
composed form (the rotation, then `jagged_flash_attention` over the slots, autograd between)
and the fp32 reference, for our two-pass, one-pass and split-kv backwards, with and without
rope; torch's FlashAttention-2 and FlashAttention-4's backwards through plain-PyTorch
stand-ins of their contracts (the FlashAttention-4 stand-in checks it is handed the three
strided slots of one buffer); the compiled backward graph holds the op and no stack, cat or
rotary gradient; opcheck; bad qkv and rope refused naming them. GPU (skipped without CUDA):
real sizes against the composed form for each backward, FlashAttention-4 where it runs, compiled.
"""

from typing import Any

import pytest
import torch

from gem_kernels import _flash2, _flash4, _jfa, _triton_jfa, jagged_flash_attention, jagged_flash_attention_qkv
from gem_kernels import rope as rope_fn
from gem_kernels._triton_jfa import BWD_ENV, force_config, jfa_backward

from _flash_ref import (CONFIGS, DEVICE, VARIANTS, _backward_graph, _count_calls, _fa2_stand_in, _lognormal,
                        _offsets, _rel, _use_recording_fa4_bwd, needs_gpu, needs_triton)

LENGTHS = [17, 0, 1, 16, 5]


@pytest.fixture(autouse=True)
def _no_flash4_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashAttention-4 runs only where a test asks for it."""
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", False)


def _tables(t: int, d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables at random positions (the model's layout: cos = [c, c], sin = [-s, s])."""
    pos = torch.randint(0, 5000, (t,), generator=g, device=DEVICE).float()
    half = d // 2
    ang = pos[:, None] * 10000.0 ** (-torch.arange(half, device=DEVICE, dtype=torch.float32) / half)[None, :]
    return torch.cat((ang.cos(), ang.cos()), -1), torch.cat((-ang.sin(), ang.sin()), -1)


def _case(lengths: list[int], *, h: int = 2, d: int = 16, dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """qkv `[T, 3, H, D]`, dout, offsets and rotary tables, fresh random data (the seed comes
    from the test's seed: `GEM_TEST_SEED` replays it)."""
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    t = sum(lengths)
    qkv = torch.randn(t, 3, h, d, generator=g, device=DEVICE).to(dtype)
    dout = torch.randn(t, h, d, generator=g, device=DEVICE).to(dtype)
    return qkv, dout, _offsets(lengths), _tables(t, d, g)


def _max_len(off: torch.Tensor) -> int:
    return int((off[1:] - off[:-1]).max()) if off.numel() > 1 else 0


def _fused(qkv: torch.Tensor, dout: torch.Tensor, off: torch.Tensor, rope: Any, **kw: Any) -> list[torch.Tensor]:
    """out, dqkv of `jagged_flash_attention_qkv` (qkv a leaf)."""
    x = qkv.detach().requires_grad_()
    out = jagged_flash_attention_qkv(x, off, _max_len(off), rope=rope, **kw)
    return [out.detach(), *torch.autograd.grad(out, (x,), dout)]


def _composed(qkv: torch.Tensor, dout: torch.Tensor, off: torch.Tensor, rope: Any, **kw: Any) -> list[torch.Tensor]:
    """out, dqkv of the parts: the plain rotation, then `jagged_flash_attention` over the
    slots, autograd between (the model's form before this op)."""
    x = qkv.detach().requires_grad_()
    q, k = rope_fn(x[:, :2], *rope).unbind(1) if rope is not None else (x[:, 0], x[:, 1])
    out = jagged_flash_attention(q, k, x[:, 2], off, off, _max_len(off), _max_len(off), **kw)
    return [out.detach(), *torch.autograd.grad(out, (x,), dout)]


def _assert_near(got: list[torch.Tensor], want: list[torch.Tensor], tol: float, what: str) -> None:
    for name, a, r in zip(("out", "dqkv"), got, want):
        assert a.shape == r.shape and a.dtype == r.dtype, f"{what} {name}: {a.shape} {a.dtype} vs {r.shape} {r.dtype}"
        assert torch.isfinite(a).all(), f"{what} {name}"
        assert _rel(a, r) <= tol, f"{what} {name}: {_rel(a, r):.3g} (relative to max |ref|) > {tol}"


# --- CPU: the interpreter and the reference ------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_fused_matches_composed_triton(cfg: str, variant: str, rope: bool) -> None:
    """Our backwards: out and dqkv match the composed call on the same kernels and the fp32
    reference; without rope bit for bit (the same kernels write the same values, here into the
    slots); dqkv is one contiguous `[T, 3, H, D]`."""
    causal, window = VARIANTS[variant]
    qkv, dout, off, tables = _case(LENGTHS)
    tabs = tables if rope else None
    kw = dict(causal=causal, window=window)
    with force_config(CONFIGS[cfg]):
        got = _fused(qkv, dout, off, tabs, backend="triton", **kw)
        want = _composed(qkv, dout, off, tabs, backend="triton", **kw)
    assert got[1].shape == qkv.shape and got[1].is_contiguous()
    if rope:
        _assert_near(got, want, 2e-6, f"{cfg} {variant} vs composed")
    else:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"{cfg} {variant}"
    ref = _fused(qkv, dout, off, tabs, backend="reference", **kw)
    _assert_near(got, ref, 5e-5, f"{cfg} {variant} vs reference")


@pytest.mark.parametrize("causal", [False, True])
def test_reference_backend_is_the_composed_reference(causal: bool) -> None:
    """backend="reference": autograd through the plain rotation and the reference attention;
    equal to the composed reference call bit for bit."""
    qkv, dout, off, tables = _case(LENGTHS)
    for tabs in (tables, None):
        got = _fused(qkv, dout, off, tabs, causal=causal, backend="reference")
        want = _composed(qkv, dout, off, tabs, causal=causal, backend="reference")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@needs_triton
def test_flash2_backward_rotated_into_dqkv(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's FlashAttention-2 backward (its contract's stand-in) returns fresh dq, dk, dv:
    the one rotation pass moves them into dqkv (v copied), near the reference."""
    monkeypatch.setattr(_flash2, "_fa2_backward", _fa2_stand_in)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.setenv(BWD_ENV, "flash")  # torch's FlashAttention-2 backward (asked for: not the default)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    calls = _count_calls(monkeypatch, _flash2, "flash_backward")
    qkv, dout, off, tables = _case(LENGTHS)
    for tabs in (tables, None):
        got = _fused(qkv, dout, off, tabs, causal=True, backend="triton")
        _assert_near(got, _fused(qkv, dout, off, tabs, causal=True, backend="reference"), 5e-5, "flash2")
    assert calls == [1, 1], "jfa_backward did not hand the op to flash_backward"


@needs_triton
@pytest.mark.parametrize("package", ["writes_into", "returns_fresh"])
def test_flash4_backward_writes_the_three_slots(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """FlashAttention-4's backward (its contract's stand-in) is handed `dq=dqkv[:, 0]`,
    `dk=dqkv[:, 1]`, `dv=dqkv[:, 2]` (row stride 3·H·D) and writes into them; q's and k's
    slots are then rotated in place. A package that returned fresh tensors would be copied in
    (`returns_fresh`). Near the reference either way."""
    seen = _use_recording_fa4_bwd(monkeypatch, write=package == "writes_into")
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    h, d = 2, 16
    qkv, dout, off, tables = _case(LENGTHS, h=h, d=d)
    got = _fused(qkv, dout, off, tables, causal=True, backend="triton")
    assert len(seen) == 1
    dq, dk, dv = seen[0]["dq"], seen[0]["dk"], seen[0]["dv"]
    assert dq is not None and dk is not None and dv is not None, "the op must hand FlashAttention-4 its slots"
    assert dq.stride() == (3 * h * d, d, 1) and dk.stride() == dq.stride() and dv.stride() == dq.stride()
    step = h * d * dq.element_size()
    assert dk.data_ptr() == dq.data_ptr() + step and dv.data_ptr() == dq.data_ptr() + 2 * step
    assert dq.data_ptr() == got[1].data_ptr()  # the buffer autograd hands back as qkv's gradient
    _assert_near(got, _fused(qkv, dout, off, tables, causal=True, backend="reference"), 5e-5, f"flash4 {package}")


@needs_triton
def test_empty_sequences_and_empty_batch() -> None:
    """Only empty sequences: out 0 and a zeroed dqkv; no rows at all; `jfa_backward(into=)`
    fills given (garbage) slots with zeros on its early return."""
    qkv, dout, off, tables = _case([0, 0])
    out, dqkv = _fused(qkv, dout, off, tables, backend="triton")
    assert out.shape == (0, 2, 16) and dqkv.shape == (0, 3, 2, 16)
    buf = torch.full((4, 3, 2, 16), float("nan"), device=DEVICE)
    x = torch.randn(4, 2, 16, device=DEVICE)
    lse = torch.full((4, 2), float("inf"), device=DEVICE)
    dq, _, _ = jfa_backward(x, x, x, x, x, lse, _offsets([4]), _offsets([4]), 0, 0, False, None, 0.25,
                            into=(buf[:, 0], buf[:, 1], buf[:, 2]))
    assert torch.count_nonzero(buf) == 0 and dq.data_ptr() == buf.data_ptr()


@needs_triton
def test_eager_no_grad_and_leaf_grad() -> None:
    """qkv a leaf with `.backward()`: its .grad is the fused buffer; without grad the same out."""
    qkv, dout, off, tables = _case(LENGTHS)
    with force_config(CONFIGS["two_pass"]):
        x = qkv.detach().requires_grad_()
        out = jagged_flash_attention_qkv(x, off, 17, rope=tables, causal=True, backend="triton")
        out.backward(dout)
        with torch.no_grad():
            again = jagged_flash_attention_qkv(qkv, off, 17, rope=tables, causal=True, backend="triton")
    assert torch.equal(again, out.detach()) and x.grad is not None and x.grad.shape == qkv.shape
    ref = _fused(qkv, dout, off, tables, causal=True, backend="reference")
    assert _rel(x.grad, ref[1]) <= 5e-5


@needs_triton
def test_compiled_backward_is_the_op_alone() -> None:
    """`torch.compile(fullgraph=True)` of a fused projection feeding the op: the backward graph
    runs `gem_kernels.jfa_bwd_qkv` and hands its dqkv to the projection's matmuls, with no
    stack, cat, select_backward or rotary gradient between. The gradient matches eager."""
    t, h, d, e = 9, 2, 16, 8
    off = _offsets([4, 0, 5])
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    tables = _tables(t, d, g)
    wqkv = torch.nn.Linear(e, 3 * h * d, device=DEVICE)
    x = torch.randn(t, e, device=DEVICE)

    def f(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention_qkv(wqkv(x).reshape(t, 3, h, d), off, 5, rope=tables, causal=True,
                                          backend="triton")

    copies = ("aten.stack", "aten.cat", "aten.select_backward", "aten.select_scatter", "aten.slice_scatter",
              "aten.copy", "gem_kernels.rope_qkv_grad")
    ops, grad = _backward_graph(f, x)
    assert "gem_kernels.jfa_bwd_qkv.default" in ops, ops
    assert not [op for op in ops if op.startswith(copies)], ops
    xg = x.detach().requires_grad_()
    (eager,) = torch.autograd.grad(f(xg).sum(), (xg,))
    torch.testing.assert_close(grad, eager)


@needs_triton
@pytest.mark.parametrize("rope", [True, False])
def test_opcheck_qkv_op(rope: bool) -> None:
    qkv, _, off, tables = _case([3, 0, 5], h=1)
    cos, sin = tables if rope else (None, None)
    torch.library.opcheck(
        torch.ops.gem_kernels.jfa_fwd_qkv.default,
        (qkv.requires_grad_(), cos, sin, off, 5, True, None, 0.25),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_bad_qkv_and_rope_are_refused_naming_them() -> None:
    qkv, _, off, (cos, sin) = _case([3, 2])
    for t in (qkv[:, 0], qkv[:, :2], torch.cat((qkv, qkv[:, :1]), 1)):
        for backend in ("reference", "triton"):
            with pytest.raises(ValueError, match=r"^qkv\.shape=.*\[T, 3, H, D\]"):
                jagged_flash_attention_qkv(t, off, 3, backend=backend)
    with pytest.raises(TypeError, match=r"^qkv must be a torch\.Tensor"):
        jagged_flash_attention_qkv([qkv], off, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^rope's cos\.shape=\(4, 16\) must be \[T, D\]"):
        jagged_flash_attention_qkv(qkv, off, 3, rope=(cos[:4], sin))
    with pytest.raises(ValueError, match=r"^rope's sin must be a floating tensor"):
        jagged_flash_attention_qkv(qkv, off, 3, rope=(cos, sin.long()))
    with pytest.raises(TypeError, match=r"^rope must be None or a \(cos, sin\) tuple"):
        jagged_flash_attention_qkv(qkv, off, 3, rope=[cos, sin])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"offsets\.shape=\(1, 3\) must be \[B\+1\]"):  # the shared checks
        jagged_flash_attention_qkv(qkv, off[None], 3)
    x = qkv[:, 0]
    lse = torch.zeros(5, 2, device=DEVICE)
    with pytest.raises(ValueError, match=r"^into's dk \(5, 2, 8\)"):
        jfa_backward(x, x, x, x, x, lse, off, off, 3, 3, False, None, 0.25, into=(x, x[..., :8], x))
    with pytest.raises(ValueError, match=r"^into must be a tuple \(dq, dk, dv\)"):
        jfa_backward(x, x, x, x, x, lse, off, off, 3, 3, False, None, 0.25, into=(x, x))  # type: ignore[arg-type]


# --- GPU: real sizes -------------------------------------------------------------------------------


def _gpu_case() -> tuple[Any, ...]:
    lengths = _lognormal(32, 4096, seed=int(torch.randint(0, 10**6, ())))
    return _case(lengths, h=8, d=128, dtype=torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("bwd", ["default", "two_pass", "one_pass", "flash"])
def test_gpu_fused_matches_composed(monkeypatch: pytest.MonkeyPatch, bwd: str) -> None:
    """32 log-normal lengths up to 4,096, H=8, D=128, bf16, causal, rope: the op against the
    composed call for the default backward (torch's FlashAttention-2 here; FlashAttention-4 is
    the next test) and each one `GEM_JFA_BWD` names. The rotation in bf16 rounds differently
    from the composed call's (fp32 products, one rounding): within 2e-2 of it."""
    if bwd == "default":
        monkeypatch.delenv(BWD_ENV, raising=False)
    else:
        monkeypatch.setenv(BWD_ENV, bwd)
    qkv, dout, off, tables = _gpu_case()
    got = _fused(qkv, dout, off, tables, causal=True)
    want = _composed(qkv, dout, off, tables, causal=True)
    assert got[1].is_contiguous()
    _assert_near(got, want, 2e-2, bwd)


@needs_gpu
def test_gpu_flash4_writes_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flash-attn-4 runs: its backward handed the strided slots of one `[T, 3, H, D]`
    buffer gives the unpacked call's dk, dv bit for bit and dq to its atomics' order; the op
    through it matches the composed call. Skipped, with the reason, where it cannot run."""
    why = _flash4.unavailable_reason(torch.zeros(1, 1, 128, dtype=torch.bfloat16, device="cuda"), None)
    if why is not None:
        pytest.skip(f"FlashAttention-4 cannot run here: {why}")
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", True)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", True)
    monkeypatch.delenv(BWD_ENV, raising=False)
    calls = _count_calls(monkeypatch, _flash4, "_fa4_backward")
    qkv, dout, off, tables = _gpu_case()
    mx, scale = _max_len(off), 128**-0.5
    q, k, v = qkv.unbind(1)
    out, lse = _jfa._run_forward(q, k, v, off, off, mx, mx, True, None, scale)
    base = _flash4.flash4_backward(dout, q, k, v, out, lse, off, off, mx, mx, True, scale)
    buf = torch.empty_like(qkv)
    got = _flash4.flash4_backward(dout, q, k, v, out, lse, off, off, mx, mx, True, scale, dq=buf[:, 0],
                                  dk=buf[:, 1], dv=buf[:, 2])
    assert [t.data_ptr() for t in got] == [buf[:, i].data_ptr() for i in range(3)]
    assert torch.equal(buf[:, 1], base[1]) and torch.equal(buf[:, 2], base[2])
    assert _rel(buf[:, 0], base[0]) <= 1e-2
    fused = _fused(qkv, dout, off, tables, causal=True)
    composed = _composed(qkv, dout, off, tables, causal=True)
    assert len(calls) == 4, "the public calls did not take FlashAttention-4's backward"
    _assert_near(fused, composed, 2e-2, "flash4")


@needs_gpu
def test_gpu_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (inductor) of the fused projection + op on the GPU: the projection's
    input gradient matches eager's."""
    monkeypatch.delenv(BWD_ENV, raising=False)
    lengths = _lognormal(8, 1024, seed=int(torch.randint(0, 10**6, ())))
    off, t, h, d = _offsets(lengths), sum(lengths), 8, 128
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    tables = _tables(t, d, g)
    wqkv = torch.nn.Linear(256, 3 * h * d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, 256, device="cuda", dtype=torch.bfloat16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention_qkv(wqkv(x).reshape(t, 3, h, d), off, max(lengths), rope=tables, causal=True)

    xs = [x.detach().requires_grad_() for _ in range(2)]
    (got,) = torch.autograd.grad(torch.compile(f, fullgraph=True)(xs[0]).float().square().sum(), xs[:1])
    (want,) = torch.autograd.grad(f(xs[1]).float().square().sum(), xs[1:])
    assert _rel(got, want) <= 2e-2
