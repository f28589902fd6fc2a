"""`jagged_flash_attention_kv`: keys and values packed in one `[Tkv, 2, H, D]` tensor, kv's
gradient one packed tensor written by the backward (no stack of dk and dv).

CPU (Triton's interpreter, 16x16 tiles, lengths 0 and 1 and on the tile edges): out, dq and
dkv equal `jagged_flash_attention(q, kv[:, 0], kv[:, 1])`'s out, dq and stacked dk, dv bit for
bit (the same kernels run), both near the fp32 reference, for our two-pass, one-pass and
split-kv backwards and the reference backend; torch's FlashAttention-2 and FlashAttention-4's
backwards through plain-PyTorch stand-ins of their contracts (the FlashAttention-4 stand-in
checks it is handed the strided halves of one buffer); the compiled backward graph holds the
packed op and no stack; bad kv shapes are refused naming `kv`. GPU (skipped without CUDA):
real sizes, packed vs unpacked for each backward, and FlashAttention-4 writing into strided
dk/dv where it runs.
"""

import os
from typing import Any

import pytest
import torch

from gem_kernels import _flash2, _flash4, _jfa, _triton_jfa, jagged_flash_attention, jagged_flash_attention_kv
from gem_kernels import rope
from gem_kernels._triton_jfa import BWD_ENV, force_config, jfa_backward

from _flash_ref import (CONFIGS, DEVICE, VARIANTS, _backward_graph, _count_calls, _fa2_stand_in, _lognormal,
                        _offsets, _rel, _use_recording_fa4_bwd, needs_gpu, needs_triton)

SELF = ([17, 0, 1, 16, 5], [17, 0, 1, 16, 5])
CROSS = ([17, 0, 1, 16, 3], [5, 3, 0, 16, 40])


@pytest.fixture(autouse=True)
def _no_flash4_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashAttention-4 runs only where a test asks for it (a GPU with flash-attn-4 would
    otherwise take every default backward)."""
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", False)


def _case(lq: list[int], lk: list[int], *, h: int = 2, d: int = 16,
          dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """q `[Tq, H, D]`, kv `[Tkv, 2, H, D]`, dout and the offsets, fresh random data (the seed
    comes from the test's seed: `GEM_TEST_SEED` replays it)."""
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    q = torch.randn(sum(lq), h, d, generator=g, device=DEVICE).to(dtype)
    kv = torch.randn(sum(lk), 2, h, d, generator=g, device=DEVICE).to(dtype)
    dout = torch.randn(sum(lq), h, d, generator=g, device=DEVICE).to(dtype)
    return q, kv, dout, _offsets(lq), _offsets(lk)


def _packed(q: torch.Tensor, kv: torch.Tensor, dout: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor,
            **kw: Any) -> list[torch.Tensor]:
    """out, dq, dkv of `jagged_flash_attention_kv` (kv a leaf: its gradient is what autograd hands back)."""
    xq, xkv = q.detach().requires_grad_(), kv.detach().requires_grad_()
    mq, mk = _max_len(qo), _max_len(ko)
    out = jagged_flash_attention_kv(xq, xkv, qo, ko, mq, mk, **kw)
    return [out.detach(), *torch.autograd.grad(out, (xq, xkv), dout)]


def _unpacked(q: torch.Tensor, kv: torch.Tensor, dout: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor,
              **kw: Any) -> list[torch.Tensor]:
    """out, dq and stack(dk, dv) of `jagged_flash_attention(q, kv[:, 0], kv[:, 1])`."""
    xq, xk, xv = q.detach().requires_grad_(), *(t.detach().requires_grad_() for t in kv.unbind(1))
    out = jagged_flash_attention(xq, xk, xv, qo, ko, _max_len(qo), _max_len(ko), **kw)
    dq, dk, dv = torch.autograd.grad(out, (xq, xk, xv), dout)
    return [out.detach(), dq, torch.stack((dk, dv), 1)]


def _max_len(off: torch.Tensor) -> int:
    return int((off[1:] - off[:-1]).max()) if off.numel() > 1 else 0


def _assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for name, a, b in zip(("out", "dq", "dkv"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} {name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        assert torch.equal(a, b), f"{what} {name}: max diff {float((a.float() - b.float()).abs().max()):.3g}"


def _assert_near(got: list[torch.Tensor], ref: list[torch.Tensor], tol: float, what: str) -> None:
    for name, a, r in zip(("out", "dq", "dkv"), got, ref):
        assert torch.isfinite(a).all(), f"{what} {name}"
        assert _rel(a, r) <= tol, f"{what} {name}: {_rel(a, r):.3g} (relative to max |ref|) > {tol}"


def _packed_is_contiguous(dkv: torch.Tensor, kv: torch.Tensor) -> None:
    assert dkv.shape == kv.shape and dkv.is_contiguous(), (dkv.shape, dkv.stride())


# --- CPU: the interpreter and the reference ------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_packed_equals_unpacked_triton(cfg: str, variant: str) -> None:
    """Our backwards (two-pass, one-pass, split-kv dQ) write dk, dv into the halves of dkv: the
    same bits as the unpacked call's stacked dk, dv; out and dq too; all near the reference.
    Self attention and cross attention (other kv offsets, an empty sample on either side)."""
    causal, window = VARIANTS[variant]
    kw = dict(causal=causal, window=window)
    for lq, lk in (SELF, CROSS):
        q, kv, dout, qo, ko = _case(lq, lk)
        with force_config(CONFIGS[cfg]):
            got = _packed(q, kv, dout, qo, ko, backend="triton", **kw)
            want = _unpacked(q, kv, dout, qo, ko, backend="triton", **kw)
        _assert_equal(got, want, f"{cfg} {variant} lq={lq} lk={lk}")
        _packed_is_contiguous(got[2], kv)
        ref = _packed(q, kv, dout, qo, ko, backend="reference", **kw)
        _assert_near(got, ref, 5e-5, f"{cfg} {variant} vs reference")


@pytest.mark.parametrize("causal", [False, True])
def test_packed_equals_unpacked_reference(causal: bool) -> None:
    """backend="reference": the packed call differentiates `kv.unbind(1)` and the same
    reference; equal to the unpacked call bit for bit, self and cross attention."""
    for lq, lk in (SELF, CROSS):
        q, kv, dout, qo, ko = _case(lq, lk)
        got = _packed(q, kv, dout, qo, ko, causal=causal, backend="reference")
        _assert_equal(got, _unpacked(q, kv, dout, qo, ko, causal=causal, backend="reference"), "reference")
        assert got[2].shape == kv.shape


@needs_triton
def test_flash2_backward_copied_into_dkv(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's FlashAttention-2 backward (its contract's stand-in) returns fresh dk, dv: copied
    into dkv's halves, equal to the unpacked call's stack and near the reference."""
    monkeypatch.setattr(_flash2, "_fa2_backward", _fa2_stand_in)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.setenv(BWD_ENV, "flash")  # torch's FlashAttention-2 backward (asked for: not the default)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")  # our forward (the lengths are short)
    calls = _count_calls(monkeypatch, _flash2, "flash_backward")
    q, kv, dout, qo, ko = _case(*CROSS)
    got = _packed(q, kv, dout, qo, ko, causal=True, backend="triton")
    assert calls == [1], "jfa_backward did not hand the packed call to flash_backward"
    _assert_equal(got, _unpacked(q, kv, dout, qo, ko, causal=True, backend="triton"), "flash2")
    _packed_is_contiguous(got[2], kv)
    _assert_near(got, _packed(q, kv, dout, qo, ko, causal=True, backend="reference"), 5e-5, "flash2 vs reference")


@needs_triton
@pytest.mark.parametrize("package", ["writes_into", "returns_fresh"])
def test_flash4_backward_writes_strided_halves(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """FlashAttention-4's backward (its contract's stand-in) is handed `dk=dkv[:, 0]`,
    `dv=dkv[:, 1]` (row stride 2·H·D, v's half H·D elements on) and writes into them; the
    unpacked call passes neither. A package that returned fresh tensors instead would be copied
    in (`returns_fresh`). Equal to the unpacked call and near the reference."""
    seen = _use_recording_fa4_bwd(monkeypatch, write=package == "writes_into")
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    h, d = 2, 16
    q, kv, dout, qo, ko = _case(*CROSS, h=h, d=d)
    got = _packed(q, kv, dout, qo, ko, causal=True, backend="triton")
    assert len(seen) == 1
    dk, dv = seen[0]["dk"], seen[0]["dv"]
    assert dk is not None and dv is not None, "the packed call must hand FlashAttention-4 its output halves"
    assert seen[0]["dq"] is None  # dq is its own tensor
    assert dk.stride() == (2 * h * d, d, 1) and dv.stride() == dk.stride()
    assert dv.data_ptr() == dk.data_ptr() + h * d * dk.element_size()
    assert dk.data_ptr() == got[2].data_ptr()  # the buffer autograd hands back as kv's gradient
    want = _unpacked(q, kv, dout, qo, ko, causal=True, backend="triton")
    assert seen[1]["dk"] is None and seen[1]["dv"] is None  # the unpacked call: as before
    _assert_equal(got, want, f"flash4 {package}")
    _assert_near(got, _packed(q, kv, dout, qo, ko, causal=True, backend="reference"), 5e-5, "flash4 vs reference")


@needs_triton
def test_empty_kv_and_empty_batch() -> None:
    """No keys at all: out 0, dq 0, dkv a zeroed `[0 or T, 2, H, D]`; the empty batch."""
    q, kv, dout, qo, ko = _case([3, 2], [0, 0])
    out, dq, dkv = _packed(q, kv, dout, qo, ko, backend="triton")
    assert torch.count_nonzero(out) == 0 and torch.count_nonzero(dq) == 0 and dkv.shape == (0, 2, 2, 16)
    # jfa_backward's early return fills a given buffer (garbage before) with zeros.
    k = v = torch.randn(5, 2, 16, device=DEVICE)
    dkv = torch.full((5, 2, 2, 16), float("nan"), device=DEVICE)
    lse = torch.full((5, 2), float("inf"), device=DEVICE)
    _, dk, dv = jfa_backward(dout, q, k, v, out, lse, qo, _offsets([5, 0]), 3, 0, False, None, 0.25,
                             into=(None, dkv[:, 0], dkv[:, 1]))
    assert torch.count_nonzero(dkv) == 0 and dk.data_ptr() == dkv.data_ptr()
    q, kv, dout, off, _ = _case([], [])
    out, dq, dkv = _packed(q, kv, dout, off, off, causal=True, backend="triton")
    assert out.shape == (0, 2, 16) and dkv.shape == (0, 2, 2, 16)


@needs_triton
def test_eager_leaf_grad_and_no_grad() -> None:
    """kv a leaf with `.backward()`: kv.grad is the packed buffer, near the reference; without
    grad the call returns the same output."""
    q, kv, dout, qo, ko = _case(*SELF)
    with force_config(CONFIGS["two_pass"]):
        xkv = kv.detach().requires_grad_()
        out = jagged_flash_attention_kv(q, xkv, qo, ko, 17, 17, causal=True, backend="triton")
        out.backward(dout)
        with torch.no_grad():
            again = jagged_flash_attention_kv(q, kv, qo, ko, 17, 17, causal=True, backend="triton")
    assert xkv.grad is not None and xkv.grad.shape == kv.shape and torch.equal(again, out.detach())
    ref = _packed(q, kv, dout, qo, ko, causal=True, backend="reference")
    assert _rel(xkv.grad, ref[2]) <= 5e-5


@needs_triton
def test_compiled_backward_writes_packed_gradient() -> None:
    """`torch.compile(fullgraph=True)` of a fused kv projection feeding the packed call: the
    backward graph runs `gem_kernels.jfa_bwd_kv` and hands its dkv to the projection's matmuls
    with no stack, cat or select_backward (the unpacked call over `unbind` stacks; checked too,
    so the test can see one). The gradient matches eager."""
    t, h, d, e = 9, 2, 16, 8
    off = _offsets([4, 0, 5])
    q, _, _, _, _ = _case([4, 0, 5], [])
    wkv = torch.nn.Linear(e, 2 * h * d, device=DEVICE)
    x = torch.randn(t, e, device=DEVICE)

    def packed(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention_kv(q, wkv(x).reshape(t, 2, h, d), off, off, 5, 5, causal=True,
                                         backend="triton")

    def unpacked(x: torch.Tensor) -> torch.Tensor:
        k, v = wkv(x).reshape(t, 2, h, d).unbind(1)
        return jagged_flash_attention(q, k, v, off, off, 5, 5, causal=True, backend="triton")

    copies = ("aten.stack", "aten.cat", "aten.select_backward", "aten.select_scatter", "aten.slice_scatter",
              "aten.copy")
    ops, grad = _backward_graph(packed, x)
    assert "gem_kernels.jfa_bwd_kv.default" in ops, ops
    assert not [op for op in ops if op.startswith(copies)], ops
    ops_u, grad_u = _backward_graph(unpacked, x)
    assert "aten.stack.default" in ops_u, ops_u
    xg = x.detach().requires_grad_()
    (eager,) = torch.autograd.grad(packed(xg).sum(), (xg,))
    torch.testing.assert_close(grad, eager)
    torch.testing.assert_close(grad, grad_u)


@needs_triton
def test_opcheck_kv_op() -> None:
    q, kv, _, qo, ko = _case([3, 0, 5], [4, 2, 5], h=1)
    torch.library.opcheck(
        torch.ops.gem_kernels.jfa_fwd_kv.default,
        (q.requires_grad_(), kv.requires_grad_(), None, None, qo, ko, 5, 5, True, None, 0.25),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    cos, sin = _tables(kv.shape[0], kv.shape[3])
    torch.library.opcheck(
        torch.ops.gem_kernels.jfa_fwd_kv.default,
        (q, kv, cos, sin, qo, ko, 5, 5, True, None, 0.25),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_bad_kv_is_refused_naming_it() -> None:
    q, kv, _, qo, ko = _case([3, 2], [4, 1])
    bad = {
        "3-D": kv[:, 0],
        "shape[1] = 3": torch.cat((kv, kv[:, :1]), 1),
        "other H": kv[:, :, :1],
        "other D": kv[..., :8],
    }
    for what, t in bad.items():
        for backend in ("reference", "triton"):
            with pytest.raises(ValueError, match=r"^kv\.shape=") as err:
                jagged_flash_attention_kv(q, t, qo, ko, 3, 4, backend=backend)
            assert "[Tkv, 2, H, D]" in str(err.value) or "[H, D]" in str(err.value), (what, err.value)
    with pytest.raises(TypeError, match=r"^kv\.dtype="):
        jagged_flash_attention_kv(q, kv.double(), qo, ko, 3, 4)
    with pytest.raises(TypeError, match=r"^kv must be a torch\.Tensor"):
        jagged_flash_attention_kv(q, [kv], qo, ko, 3, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^rope's cos\.shape=\(3, 16\) must be \[T, D\]"):
        jagged_flash_attention_kv(q, kv, qo, ko, 3, 4, rope=(torch.ones(3, 16), torch.ones(5, 16)))
    with pytest.raises(TypeError, match=r"^rope must be None or a \(cos, sin\) tuple"):
        jagged_flash_attention_kv(q, kv, qo, ko, 3, 4, rope=torch.ones(5, 16))  # type: ignore[arg-type]
    # the rest: jagged_flash_attention's checks (one that needs no read of the offsets' values,
    # which a CUDA call skips to stay free of host syncs)
    with pytest.raises(ValueError, match=r"kv_offsets\.shape=\(1, 3\) must be \[B\+1\]"):
        jagged_flash_attention_kv(q, kv, qo, ko[None], 3, 4)
    with pytest.raises(ValueError, match=r"^into's dk \(5, 1, 16\)"):  # jfa_backward's packed output
        lse = torch.zeros(5, 2, device=DEVICE)
        jfa_backward(q, q, kv[:, 0], kv[:, 1], q, lse, qo, ko, 3, 4, False, None, 0.25,
                     into=(None, kv[:, 0, :1], kv[:, 1, :1]))


def _tables(t: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables at random positions (cos = [c, c], sin = [-s, s])."""
    pos = torch.randint(0, 5000, (t,), device=DEVICE).float()
    half = d // 2
    ang = pos[:, None] * 10000.0 ** (-torch.arange(half, device=DEVICE, dtype=torch.float32) / half)[None, :]
    return torch.cat((ang.cos(), ang.cos()), -1), torch.cat((-ang.sin(), ang.sin()), -1)


def _composed_rope(q: torch.Tensor, kv: torch.Tensor, dout: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor,
                   tables: tuple[torch.Tensor, torch.Tensor], **kw: Any) -> list[torch.Tensor]:
    """out, dq, dkv of the parts: the plain rotation of kv[:, 0], then `jagged_flash_attention`."""
    xq, xkv = q.detach().requires_grad_(), kv.detach().requires_grad_()
    k = rope(xkv[:, 0], *tables)
    out = jagged_flash_attention(xq, k, xkv[:, 1], qo, ko, _max_len(qo), _max_len(ko), **kw)
    return [out.detach(), *torch.autograd.grad(out, (xq, xkv), dout)]


@needs_triton
@pytest.mark.parametrize("cfg", ["two_pass", "one_pass"])
def test_rope_keys_match_composed(cfg: str) -> None:
    """`rope=(cos, sin)`: keys rotated before the attention, dk rotated back in place in dkv;
    out, dq, dkv match the composed call (the plain rotation, autograd) on the same kernels
    and the reference backend, self and cross attention."""
    for lq, lk in (SELF, CROSS):
        q, kv, dout, qo, ko = _case(lq, lk)
        tables = _tables(kv.shape[0], kv.shape[3])
        with force_config(CONFIGS[cfg]):
            got = _packed(q, kv, dout, qo, ko, causal=True, rope=tables, backend="triton")
            want = _composed_rope(q, kv, dout, qo, ko, tables, causal=True, backend="triton")
        _packed_is_contiguous(got[2], kv)
        _assert_near(got, want, 2e-6, f"{cfg} lq={lq} vs composed")
        ref = _packed(q, kv, dout, qo, ko, causal=True, rope=tables, backend="reference")
        _assert_equal(ref, _composed_rope(q, kv, dout, qo, ko, tables, causal=True, backend="reference"), "reference")
        _assert_near(got, ref, 5e-5, f"{cfg} lq={lq} vs reference")


@needs_triton
@pytest.mark.parametrize("flash", ["flash2", "flash4"])
def test_rope_keys_through_the_flash_backwards(monkeypatch: pytest.MonkeyPatch, flash: str) -> None:
    """With rope, torch's FlashAttention-2 backward (fresh dk, dv: rotated and moved in one
    pass) and FlashAttention-4's (handed the halves of dkv, which it writes; dk then rotated in
    place), through their contracts' stand-ins: near the reference."""
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    seen: list[Any] = []
    if flash == "flash2":
        monkeypatch.setattr(_flash2, "_fa2_backward", _fa2_stand_in)
        monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
        monkeypatch.setenv(BWD_ENV, "flash")
        seen = _count_calls(monkeypatch, _flash2, "flash_backward")
    else:
        seen = _use_recording_fa4_bwd(monkeypatch)
    q, kv, dout, qo, ko = _case(*CROSS)
    tables = _tables(kv.shape[0], kv.shape[3])
    got = _packed(q, kv, dout, qo, ko, causal=True, rope=tables, backend="triton")
    assert len(seen) == 1
    if flash == "flash4":
        assert seen[0]["dk"].data_ptr() == got[2].data_ptr() and seen[0]["dv"].data_ptr() == got[2][:, 1].data_ptr()
    _assert_near(got, _packed(q, kv, dout, qo, ko, causal=True, rope=tables, backend="reference"), 5e-5, flash)


@needs_triton
def test_compiled_rope_keys_backward_has_no_stack() -> None:
    """Compiled with rope: the backward graph is `jfa_bwd_kv` handing dkv to the projection,
    no stack or cat (the rotation back is inside the op)."""
    t, h, d, e = 9, 2, 16, 8
    off = _offsets([4, 0, 5])
    q, _, _, _, _ = _case([4, 0, 5], [])
    tables = _tables(t, d)
    wkv = torch.nn.Linear(e, 2 * h * d, device=DEVICE)
    x = torch.randn(t, e, device=DEVICE)

    def f(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention_kv(q, wkv(x).reshape(t, 2, h, d), off, off, 5, 5, causal=True, rope=tables,
                                         backend="triton")

    ops, grad = _backward_graph(f, x)
    assert "gem_kernels.jfa_bwd_kv.default" in ops, ops
    assert not [op for op in ops if op.startswith(("aten.stack", "aten.cat", "aten.select_backward"))], ops
    xg = x.detach().requires_grad_()
    (eager,) = torch.autograd.grad(f(xg).sum(), (xg,))
    torch.testing.assert_close(grad, eager)


# --- GPU: real sizes -------------------------------------------------------------------------------


def _gpu_case() -> tuple[torch.Tensor, ...]:
    lengths = _lognormal(32, 4096, seed=int(torch.randint(0, 10**6, ())))
    return _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16)


def _gpu_check(got: list[torch.Tensor], want: list[torch.Tensor], what: str, *, dq_exact: bool) -> None:
    """out and dkv bit for bit (dk, dv are written once per kv tile by every backward); dq bit
    for bit where it is summed without atomics, else within 1e-2 (the atomics' order)."""
    assert torch.equal(got[0], want[0]), f"{what} out: {_rel(got[0], want[0]):.3g}"
    assert torch.equal(got[2], want[2]), f"{what} dkv: {_rel(got[2], want[2]):.3g}"
    assert torch.isfinite(got[1]).all()
    if dq_exact:
        assert torch.equal(got[1], want[1]), f"{what} dq: {_rel(got[1], want[1]):.3g}"
    else:
        assert _rel(got[1], want[1]) <= 1e-2, f"{what} dq: {_rel(got[1], want[1]):.3g}"


@needs_gpu
@pytest.mark.parametrize("bwd", ["default", "two_pass", "one_pass", "flash"])
def test_gpu_packed_equals_unpacked(monkeypatch: pytest.MonkeyPatch, bwd: str) -> None:
    """32 log-normal lengths up to 4,096, H=8, D=128, bf16, causal: packed vs unpacked for the
    default backward (torch's FlashAttention-2 here; FlashAttention-4 is the next test) and
    each one `GEM_JFA_BWD` names; the packed dkv is contiguous `[T, 2, H, D]`."""
    if bwd == "default":
        monkeypatch.delenv(BWD_ENV, raising=False)
    else:
        monkeypatch.setenv(BWD_ENV, bwd)
    q, kv, dout, off, _ = _gpu_case()
    got = _packed(q, kv, dout, off, off, causal=True)
    want = _unpacked(q, kv, dout, off, off, causal=True)
    _packed_is_contiguous(got[2], kv)
    _gpu_check(got, want, bwd, dq_exact=bwd == "two_pass")


@needs_gpu
def test_gpu_flash4_writes_strided_dk_dv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flash-attn-4 runs: its backward given the strided halves of one `[T, 2, H, D]`
    buffer gives the unpacked FlashAttention-4 path's dk, dv (bit for bit) and dq; the public
    packed call through it too. Skipped, with the reason, where it cannot run."""
    why = _flash4.unavailable_reason(torch.zeros(1, 1, 128, dtype=torch.bfloat16, device="cuda"), None)
    if why is not None:
        pytest.skip(f"FlashAttention-4 cannot run here: {why}")
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", True)
    monkeypatch.delenv(BWD_ENV, raising=False)
    calls = _count_calls(monkeypatch, _flash4, "_fa4_backward")
    q, kv, dout, off, _ = _gpu_case()
    mx, scale = _max_len(off), 128**-0.5
    out, lse = _jfa._run_forward(q, kv[:, 0], kv[:, 1], off, off, mx, mx, True, None, scale)
    k, v = kv.unbind(1)
    base = _flash4.flash4_backward(dout, q, k, v, out, lse, off, off, mx, mx, True, scale)
    dkv = torch.empty_like(kv)
    packed = _flash4.flash4_backward(dout, q, k, v, out, lse, off, off, mx, mx, True, scale, dk=dkv[:, 0],
                                     dv=dkv[:, 1])
    assert packed[1].data_ptr() == dkv.data_ptr() and packed[2].data_ptr() == dkv[:, 1].data_ptr()
    assert torch.equal(dkv, torch.stack(base[1:], 1)), _rel(dkv, torch.stack(base[1:], 1))
    assert _rel(packed[0], base[0]) <= 1e-2
    got = _packed(q, kv, dout, off, off, causal=True)
    want = _unpacked(q, kv, dout, off, off, causal=True)
    assert len(calls) == 4, "the public calls did not take FlashAttention-4's backward"
    _gpu_check(got, want, "flash4", dq_exact=False)


@needs_gpu
def test_gpu_compiled_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (inductor) of the fused projection + packed call on the GPU: the gradient
    of the projection's input matches eager's."""
    monkeypatch.delenv(BWD_ENV, raising=False)
    lengths = _lognormal(8, 1024, seed=int(torch.randint(0, 10**6, ())))
    off, t, h, d = _offsets(lengths), sum(lengths), 8, 128
    mx = max(lengths)
    q, _, _, _, _ = _case(lengths, [], h=h, d=d, dtype=torch.bfloat16)
    wkv = torch.nn.Linear(256, 2 * h * d, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, 256, device="cuda", dtype=torch.bfloat16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention_kv(q, wkv(x).reshape(t, 2, h, d), off, off, mx, mx, causal=True)

    xs = [x.detach().requires_grad_() for _ in range(2)]
    (got,) = torch.autograd.grad(torch.compile(f, fullgraph=True)(xs[0]).float().square().sum(), xs[:1])
    (want,) = torch.autograd.grad(f(xs[1]).float().square().sum(), xs[1:])
    assert _rel(got, want) <= 2e-2

