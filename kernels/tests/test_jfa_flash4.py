"""JFA through FlashAttention-4's CuTe kernels (`gem_kernels._flash4`, the optional flash-attn-4).

CPU (Triton's interpreter): plain-PyTorch stand-ins written to FlashAttention-4's varlen
contracts (keyword arguments, int32 cu_seqlens, natural-log lse `[H, Tq]`, -inf for a row that
sees no key) replace the package's functions, so a wrong conversion (log base, layout, offsets,
the causal flag, the scale, the empty rows) gives wrong outputs or gradients against the fp32
reference; the switches (`GEM_JFA_FWD` / `GEM_JFA_BWD` = flash4) and the reasons it cannot run
are checked without a GPU. GPU (skipped without CUDA; on a GPU without the package the test
fails naming the reason, so a GPU run cannot pass silently without it): the real kernels at
real sizes against our Triton path and the fp32 reference, strided q/k/v, cross attention with
empty sequences, the pooling shape, and the compiled path.
"""

import os
from typing import Any

import pytest
import torch

from gem_kernels import _flash4, _jfa, _triton_jfa, jagged_flash_attention
from gem_kernels._triton_jfa import BWD_ENV

from _flash_ref import (CUDA, DEVICE, _assert_near_reference, _case, _check_vs_ours_and_reference, _fa2_fwd_stand_in,
                        _fa4_bwd_stand_in, _grads, _lognormal, _offsets, _ours, _rel)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(not CUDA, reason="GPU test")


def _fa4_fwd_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                      causal: bool, return_lse: bool) -> tuple[Any, ...]:
    """`_flash_attn_fwd`'s varlen contract: (out, lse `[H, Tq]` natural log, -inf rows, ...)."""
    assert return_lse
    out, lse = _fa2_fwd_stand_in(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, causal,
                                 False, scale=softmax_scale)[:2]
    return out, lse, None, None, None


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Both package functions replaced by stand-ins that record their calls; runnable anywhere."""
    calls: list[str] = []

    def fwd(*a: Any, **kw: Any) -> Any:
        calls.append("fwd")
        return _fa4_fwd_stand_in(*a, **kw)

    def bwd(*a: Any, **kw: Any) -> Any:
        calls.append("bwd")
        return _fa4_bwd_stand_in(*a, **kw)

    monkeypatch.setattr(_flash4, "_fa4_forward", fwd)
    monkeypatch.setattr(_flash4, "_fa4_backward", bwd)
    monkeypatch.setattr(_flash4, "unavailable_reason", lambda *a, **kw: None)
    return calls


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fwd", ["flash4", "pointer"])
def test_conversions_against_fa4_contract(monkeypatch: pytest.MonkeyPatch, causal: bool, fwd: str) -> None:
    """GEM_JFA_BWD=flash4 with FlashAttention-4's forward (or ours): out and every gradient vs the
    fp32 reference through jagged_flash_attention's autograd: lengths on the tile edges, cross
    attention, empty sequences on either side, and (causal, lq > lk) rows that see no key."""
    calls = _stand_ins(monkeypatch)
    monkeypatch.setenv(_jfa.FWD_ENV, fwd)
    monkeypatch.setenv(BWD_ENV, "flash4")
    lq, lk = [17, 0, 1, 16, 15, 33], [33, 15, 16, 0, 3, 17]
    q, k, v, dout, qo, ko = _case(lq, lk, seed=int(torch.randint(0, 10**6, ())))
    got = _grads(q, k, v, dout, qo, ko, causal)
    assert calls.count("bwd") == 1 and calls.count("fwd") == (1 if fwd == "flash4" else 0)
    want = _grads(q, k, v, dout, qo, ko, causal, backend="reference")
    _assert_near_reference(got, want)
    rows = slice(int(qo[4]), int(qo[4]) + 12) if causal else slice(int(qo[3]), int(qo[4]))  # no visible key
    assert torch.count_nonzero(got[0][rows]) == 0 and torch.count_nonzero(got[1][rows]) == 0


def test_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """flash4 only when asked (or its default is on), never under a forced config, only where it
    runs; where it cannot run the other rules decide."""
    q = torch.zeros(4, 2, 16)
    off1 = torch.tensor([0, 4])
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", False)
    monkeypatch.delenv(BWD_ENV, raising=False)
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    assert not _triton_jfa.bwd_uses_flash4(q, q, None) and not _jfa.fwd_uses_flash4(q, q, off1, None)
    monkeypatch.setenv(BWD_ENV, "flash4")
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
    assert not _triton_jfa.bwd_uses_flash4(q, q, None)  # CPU: cannot run
    monkeypatch.setattr(_flash4, "unavailable_reason", lambda *a, **kw: None)
    assert _triton_jfa.bwd_uses_flash4(q, q, None) and _jfa.fwd_uses_flash4(q, q, off1, None)
    assert not _jfa.fwd_uses_flash(q, q, torch.zeros(2, dtype=torch.int64), None)  # flash4 asked: not FA2
    assert "flash4" in _triton_jfa.bwd_rule()
    t16 = _triton_jfa.JfaTiles(block_m=16, block_n=16)
    with _triton_jfa.force_config(_triton_jfa.JfaConfig(fwd=t16, dkdv=t16, dq=t16)):
        assert not _triton_jfa.bwd_uses_flash4(q, q, None) and not _jfa.fwd_uses_flash4(q, q, off1, None)
    monkeypatch.setenv(BWD_ENV, "two_pass")
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    assert not _triton_jfa.bwd_uses_flash4(q, q, None) and not _jfa.fwd_uses_flash4(q, q, off1, None)
    monkeypatch.delenv(BWD_ENV)
    monkeypatch.delenv(_jfa.FWD_ENV)
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", True)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", True)
    assert _triton_jfa.bwd_uses_flash4(q, q, None)
    n = _jfa.FLASH4_FWD_MIN_MEAN  # the default forward goes by the mean query length
    long_q, short_q, off2 = torch.zeros(2 * n, 2, 16), torch.zeros(2 * n - 1, 2, 16), torch.tensor([0, n, 2 * n])
    assert _jfa.fwd_uses_flash4(long_q, q, off2, None) and not _jfa.fwd_uses_flash4(short_q, q, off2, None)
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")  # asked for: whatever the length
    assert _jfa.fwd_uses_flash4(short_q, q, off2, None)
    monkeypatch.setenv(BWD_ENV, "flash7")
    with pytest.raises(ValueError, match="GEM_JFA_BWD"):
        _triton_jfa.bwd_uses_flash4(q, q, None)


def test_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.zeros(4, 2, 16, dtype=torch.bfloat16)
    assert "CUDA" in (_flash4.unavailable_reason(q, None) or "")
    _flash4._import_error.cache_clear()
    monkeypatch.setitem(__import__("sys").modules, "flash_attn.cute.interface", None)  # import fails
    assert "does not import" in (_flash4._import_error() or "")
    _flash4._import_error.cache_clear()
    if CUDA:
        qc = q.cuda()
        assert "dtype" in (_flash4.unavailable_reason(qc.float(), None) or "")
        assert "head dim" in (_flash4.unavailable_reason(qc[..., :12], None) or "")
        assert _flash4.unavailable_reason(qc, 8) == "a sliding window"
        assert "no queries" in (_flash4.unavailable_reason(qc[:0], None) or "")


# --- GPU: the package's real kernels ------------------------------------------------------------


def _require_fa4() -> None:
    why = _flash4.unavailable_reason(torch.zeros(1, 1, 128, dtype=torch.bfloat16, device="cuda"), None)
    assert why is None, f"FlashAttention-4 cannot run on this GPU machine: {why} (tools/fa4_setup.sh)"


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_real_size(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """64 log-normal lengths up to 4,096, H=8, D=128, bf16, FlashAttention-4 forward and backward:
    within 1e-2 of our Triton forward + two-pass backward, 2e-2 of the fp32 reference (8 samples)."""
    _require_fa4()
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
    monkeypatch.setenv(BWD_ENV, "flash4")
    lengths = _lognormal()
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=3)
    got = _grads(q, k, v, dout, off, off, causal)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    base = _ours(monkeypatch, q, k, v, dout, off, off, causal)
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
    monkeypatch.setenv(BWD_ENV, "flash4")
    _check_vs_ours_and_reference(got, base, (q, k, v, dout), lengths, causal)


@needs_gpu
def test_gpu_strided_cross_empty_and_pooling(monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v as views of one fused [T, 3, H, D] projection; cross attention with empty sequences
    on either side and (causal) rows that see no key (out 0, dQ 0); the pooling shape (32 seed
    queries per sample over long histories): FlashAttention-4 vs our two-pass path."""
    _require_fa4()
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
    monkeypatch.setenv(BWD_ENV, "flash4")

    def vs_ours(args: tuple[Any, ...], causal: bool, what: str) -> list[torch.Tensor]:
        got = _grads(*args, causal)
        monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
        base = _ours(monkeypatch, *args, causal)
        monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
        monkeypatch.setenv(BWD_ENV, "flash4")
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
            assert torch.isfinite(a).all() and _rel(a, b) <= 1e-2, f"{what} causal={causal} {name}: {_rel(a, b):.3g}"
        return got

    lengths = _lognormal(16, 2048, seed=5)
    off = _offsets(lengths)
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    qkv = torch.randn(sum(lengths), 3, 8, 128, generator=g, device=DEVICE).to(torch.bfloat16)
    dout = torch.randn(sum(lengths), 8, 128, generator=g, device=DEVICE).to(torch.bfloat16)
    q, k, v = qkv.unbind(1)
    vs_ours((q, k, v, dout, off, off), True, "strided")
    lq, lk = [300, 0, 129, 64, 1000], [200, 50, 0, 64, 1500]
    q, k, v, dout, qo, ko = _case(lq, lk, h=8, d=128, dtype=torch.bfloat16, seed=7)
    for causal in (False, True):
        got = vs_ours((q, k, v, dout, qo, ko), causal, "cross")
        assert torch.count_nonzero(got[0][300:429]) == 0 and torch.count_nonzero(got[1][300:429]) == 0
    assert torch.count_nonzero(got[1][:100]) == 0  # causal, 300 queries on 200 keys: 100 see none
    lk = _lognormal(32, 8192, seed=9)
    lk[3] = 0  # an empty history: its seeds see no key
    q, k, v, dout, qo, ko = _case([32] * len(lk), lk, h=8, d=128, dtype=torch.bfloat16, seed=8)
    got = vs_ours((q, k, v, dout, qo, ko), False, "pooling")
    assert torch.count_nonzero(got[0][96:128]) == 0


@needs_gpu
def test_gpu_compiled_and_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (the custom-op path) takes FlashAttention-4 with the same gradients; with
    torch's deterministic algorithms on, two backward runs are bitwise equal."""
    _require_fa4()
    monkeypatch.setenv(_jfa.FWD_ENV, "flash4")
    monkeypatch.setenv(BWD_ENV, "flash4")
    lengths = _lognormal(8, 1024, seed=11)
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=2)
    mx = max(lengths)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention(q, k, v, off, off, mx, mx)

    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    got = torch.autograd.grad(torch.compile(f, fullgraph=True)(*xs), xs, dout)
    want = _grads(q, k, v, dout, off, off, False)[1:]
    for a, b in zip(got, want):
        assert _rel(a, b) <= 1e-2
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        one, two = (_grads(q, k, v, dout, off, off, False) for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
