"""Shared by the FlashAttention stand-in tests (test_jfa_flash2.py, test_jfa_flash4.py,
test_jfa_kv.py, test_jfa_qkv.py):
plain-PyTorch stand-ins written to FlashAttention's varlen contracts (int32 cu_seqlens,
natural-log lse `[H, Tq]`, causal bottom-right aligned), jagged cases, and the checks against
our kernels and the fp32 reference."""

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gem_kernels import _flash4, jagged_flash_attention
from gem_kernels._triton_jfa import BWD_ENV, JfaConfig, JfaTiles

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# The packed-kv and rotary-qkv tests' marks, and the small tiles that put lengths 0, 1 and the
# tile edges on every path of our backwards under the interpreter.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
needs_gpu = pytest.mark.skipif(not CUDA, reason="GPU test")
_T16 = JfaTiles(block_m=16, block_n=16)
CONFIGS = {
    "two_pass": JfaConfig(fwd=_T16, dkdv=_T16, dq=_T16),
    "one_pass": JfaConfig(fwd=_T16, dkdv=_T16, dq=_T16, one_pass=True),
    "split_kv": JfaConfig(fwd=_T16, dkdv=_T16, dq=_T16, kv_split=32),
}
VARIANTS = {"full": (False, None), "causal": (True, None), "causal_window": (True, 5)}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Wraps `module.<name>` so each call appends to the returned list (the dispatch looks it
    up at call time), and still runs it."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    if want.numel() == 0:
        return 0.0
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.float().abs().max()))


def _fa2_stand_in(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                  dropout_p: float, causal: bool, seed: torch.Tensor, offset: torch.Tensor, *,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's varlen backward in plain PyTorch, to its contract: int32 cu_seqlens,
    natural-log lse [H, Tq], causal bottom-right aligned, P recomputed from the given lse."""
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert dropout_p == 0.0 and seed.dtype == torch.uint64 and offset.dtype == torch.uint64
    assert all(t.stride(-1) == 1 for t in (dout, q, k, v, out))
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    for b in range(cu_q.numel() - 1):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        assert qe - qs <= max_q and ke - ks <= max_k
        if qe == qs or ke == ks:
            continue
        qb, kb, vb, ob, dob = (x.float().transpose(0, 1) for x in (q[qs:qe], k[ks:ke], v[ks:ke], out[qs:qe],
                                                                    dout[qs:qe]))
        s = qb @ kb.transpose(1, 2) * scale  # [H, lq, lk]
        if causal:
            i = torch.arange(qe - qs, device=q.device)[:, None] + (ke - ks) - (qe - qs)
            s = s.masked_fill(torch.arange(ke - ks, device=q.device)[None, :] > i, float("-inf"))
        p = torch.exp(s - lse[:, qs:qe, None])
        dp = dob @ vb.transpose(1, 2)
        ds = p * (dp - (dob * ob).sum(-1, keepdim=True))
        dq[qs:qe] = (ds @ kb * scale).transpose(0, 1)
        dk[ks:ke] = (ds.transpose(1, 2) @ qb * scale).transpose(0, 1)
        dv[ks:ke] = (p.transpose(1, 2) @ dob).transpose(0, 1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _fa4_bwd_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                      lse: torch.Tensor, *, softmax_scale: float, causal: bool, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, deterministic: bool,
                      dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
                      dv: torch.Tensor | None = None, _write: bool = True) -> tuple[torch.Tensor, ...]:
    """`_flash_attn_bwd`'s varlen contract (note: q, k, v, out, dout, lse in this order).
    Outputs given as dq / dk / dv are checked as the package checks them (shape, dtype, device
    only: its kernels take the strides at run time), written into and returned; `_write=False`
    stands for a package version that returns fresh tensors instead."""
    assert deterministic == torch.are_deterministic_algorithms_enabled()
    for t, like in ((dq, q), (dk, k), (dv, v)):
        assert t is None or (t.shape == like.shape and t.dtype == like.dtype and t.device == like.device)
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    fresh = _fa2_stand_in(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                          causal, seed, offset, scale=softmax_scale)
    if not _write:
        return fresh
    return tuple(f if t is None else t.copy_(f) for t, f in zip((dq, dk, dv), fresh))


def _recording_fa4_bwd(seen: list[dict[str, Any]], *, write: bool = True) -> Callable[..., tuple[torch.Tensor, ...]]:
    """`_fa4_bwd_stand_in`, appending the outputs each call was handed ({"dq", "dk", "dv"}:
    a tensor or None) to `seen`; `write=False`: the package that returns fresh tensors."""
    def bwd(*a: Any, dq: torch.Tensor | None = None, dk: torch.Tensor | None = None,
            dv: torch.Tensor | None = None, **kw: Any) -> tuple[torch.Tensor, ...]:
        seen.append({"dq": dq, "dk": dk, "dv": dv})
        return _fa4_bwd_stand_in(*a, dq=dq, dk=dk, dv=dv, _write=write, **kw)

    return bwd


def _use_recording_fa4_bwd(monkeypatch: pytest.MonkeyPatch, *, write: bool = True) -> list[dict[str, Any]]:
    """Routes the JFA backward to FlashAttention-4 as if the package were installed, through
    `_recording_fa4_bwd`; returns the list its calls are recorded in."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(_flash4, "_fa4_backward", _recording_fa4_bwd(seen, write=write))
    monkeypatch.setattr(_flash4, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.setenv(BWD_ENV, "flash4")
    return seen


def _case(lq: list[int], lk: list[int], *, h: int = 2, d: int = 16, dtype: torch.dtype = torch.float32,
          seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(sum(n), h, d, generator=g, device=DEVICE).to(dtype) for n in (lq, lk, lk))
    dout = torch.randn(sum(lq), h, d, generator=g, device=DEVICE).to(dtype)
    return q, k, v, dout, _offsets(lq), _offsets(lk)


def _grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, qo: torch.Tensor,
           ko: torch.Tensor, causal: bool, backend: str = "triton") -> list[torch.Tensor]:
    mq, mk = int((qo[1:] - qo[:-1]).max()), int((ko[1:] - ko[:-1]).max())
    xq, xk, xv = (x.detach().requires_grad_() for x in (q, k, v))
    out = jagged_flash_attention(xq, xk, xv, qo, ko, mq, mk, causal=causal, backend=backend)
    return [out.detach(), *torch.autograd.grad(out, (xq, xk, xv), dout)]


def _assert_near_reference(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """out, dq, dk, dv finite and within 5e-5 (relative to the largest) of the fp32 reference."""
    for name, a, r in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        assert _rel(a, r) <= 5e-5, f"{name}: {_rel(a, r):.3g}"


def _fa2_fwd_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                      max_q: int, max_k: int, dropout_p: float, causal: bool, debug: bool, *,
                      scale: float) -> tuple[torch.Tensor, ...]:
    """FlashAttention-2's varlen forward in plain PyTorch, to its contract: int32 cu_seqlens,
    out `[Tq, H, D]`, natural-log lse `[H, Tq]`; a row that sees no key gets out 0 and lse
    -inf (what its split-kv path writes; the non-split path writes +inf)."""
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32 and dropout_p == 0.0 and not debug
    assert all(t.stride(-1) == 1 for t in (q, k, v))
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    for b in range(cu_q.numel() - 1):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        assert qe - qs <= max_q and ke - ks <= max_k
        if qe == qs or ke == ks:
            continue
        qb, kb, vb = (x.float().transpose(0, 1) for x in (q[qs:qe], k[ks:ke], v[ks:ke]))
        sc = qb @ kb.transpose(1, 2) * scale
        if causal:
            i = torch.arange(qe - qs, device=q.device)[:, None] + (ke - ks) - (qe - qs)
            sc = sc.masked_fill(torch.arange(ke - ks, device=q.device)[None, :] > i, float("-inf"))
        row = torch.logsumexp(sc, dim=-1)  # -inf where no key is visible
        p = torch.exp(sc - torch.where(torch.isinf(row), 0.0, row)[..., None])
        out[qs:qe] = (p @ vb).transpose(0, 1)
        lse[:, qs:qe] = row
    empty = torch.empty(0, device=q.device)
    return out.to(q.dtype), lse, empty, empty, empty


def _lognormal(n: int = 64, cap: int = 4096, seed: int = 62) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.randn(n, generator=g, dtype=torch.float64) + 6.5)
    return [int(t) for t in x.clamp(64, cap).long().tolist()]


def _ours(monkeypatch: pytest.MonkeyPatch, *args: Any) -> list[torch.Tensor]:
    """`_grads(*args)` through our two-pass backward; `GEM_JFA_BWD` is then as it was."""
    with monkeypatch.context() as mp:
        mp.setenv(BWD_ENV, "two_pass")
        return _grads(*args)


def _check_vs_ours_and_reference(got: list[torch.Tensor], base: list[torch.Tensor], qkvd: tuple[torch.Tensor, ...],
                                 lengths: list[int], causal: bool) -> None:
    """The GPU tests' checks: `got` (the default path) finite and within 1e-2 of `base` (ours),
    and the default path within 2e-2 of the fp32 reference on the first 8 samples (the padded
    reference of all of them would be large)."""
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) <= 1e-2, f"{name}: flash vs ours {_rel(a, b):.3g}"
    sub = _offsets(lengths[:8])
    q8, k8, v8, do8 = (x[:int(sub[-1])] for x in qkvd)
    got8 = _grads(q8, k8, v8, do8, sub, sub, causal)
    ref8 = _grads(q8.float(), k8.float(), v8.float(), do8.float(), sub, sub, causal, "reference")
    for name, a, r in zip(("out", "dq", "dk", "dv"), got8, ref8):
        assert _rel(a, r) <= 2e-2, f"{name}: flash vs fp32 reference {_rel(a, r):.3g}"


def _aten_ops(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _backward_graph(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """The ops of fn's AOT backward graph (compiled with fullgraph, run eagerly) and x's gradient."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def fw(gm: torch.fx.GraphModule, _: Any) -> Any:
        return make_boxed_func(gm.forward)

    def bw(gm: torch.fx.GraphModule, _: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    xg = x.detach().requires_grad_()
    (grad,) = torch.autograd.grad(torch.compile(fn, backend=aot_autograd(fw_compiler=fw, bw_compiler=bw),
                                                fullgraph=True)(xg).sum(), (xg,))
    assert len(graphs) == 1
    return _aten_ops(graphs[0]), grad
