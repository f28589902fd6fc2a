"""JFA through torch's FlashAttention-2 varlen kernels (`gem_kernels._flash2`).

Backward: our Triton forward's output and log2-domain lse `[Tq, H]` go to
`aten._flash_attention_backward`, which wants int32 cu_seqlens and a natural-log lse `[H, Tq]`.
Forward (short mixes): `aten._flash_attention_forward`'s output and lse come back in our
contract (log2 lse `[Tq, H]`, +inf for a row that sees no key). CPU (Triton's interpreter for
our kernels): plain-PyTorch stand-ins written to FlashAttention-2's varlen contracts (they
assert the dtypes and shapes; the backward recomputes P from the lse it is given; the forward
writes -inf, as FlashAttention-2's split path does, for rows that see no key) replace torch's
ops, so a wrong conversion (log base, layout, offsets, the causal flag, the scale, the empty
rows) gives wrong outputs or gradients against the fp32 reference. The rules (when flash runs,
when ours does) are checked without a GPU. GPU (skipped without CUDA): torch's real kernels at
real sizes, strided q/k/v, cross attention with empty sequences and rows that see no key, and
the compiled path.
"""

import os

import pytest
import torch

from gem_kernels import _flash2, _jfa, _triton_jfa, jagged_flash_attention
from gem_kernels._triton_jfa import BWD_ENV, JfaConfig, JfaTiles, force_config

from _flash_ref import (CUDA, DEVICE, _assert_near_reference, _case, _check_vs_ours_and_reference, _count_calls,
                        _fa2_fwd_stand_in, _fa2_stand_in, _grads, _lognormal, _offsets, _ours, _rel)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
_T16 = JfaTiles(block_m=16, block_n=16)


@pytest.fixture(autouse=True)
def _no_flash4_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about FlashAttention-2's path: FlashAttention-4, first where it runs
    (a GPU with flash-attn-4), is off here unless a test names it (test_jfa_flash4.py)."""
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", False)
TWO = JfaConfig(fwd=_T16, dkdv=_T16, dq=_T16)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_conversions_against_fa2_contract(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """Our forward + flash_backward (torch's op replaced by the contract stand-in) vs the fp32
    reference, through jagged_flash_attention's own autograd: lengths on the tile edges, cross
    attention, empty sequences on either side, and (causal, lq > lk) rows that see no key."""
    monkeypatch.setattr(_flash2, "_fa2_backward", _fa2_stand_in)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.setenv(BWD_ENV, "flash")  # torch's FlashAttention-2 backward (asked for: not the default)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")  # our forward (the lengths are short)
    calls = _count_calls(monkeypatch, _flash2, "flash_backward")
    lq, lk = [17, 0, 1, 16, 15, 33], [33, 15, 16, 0, 3, 17]
    q, k, v, dout, qo, ko = _case(lq, lk, seed=int(torch.randint(0, 10**6, ())))
    got = _grads(q, k, v, dout, qo, ko, causal)
    assert calls, "jfa_backward did not hand the call to flash_backward"
    want = _grads(q, k, v, dout, qo, ko, causal, backend="reference")
    _assert_near_reference(got, want)
    if causal:  # sample 4: 15 queries, 3 keys, bottom-right aligned: the first 12 see none
        s = int(qo[4])
        assert torch.count_nonzero(got[1][s:s + 12]) == 0


def test_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.zeros(4, 2, 16, dtype=torch.bfloat16)
    assert "CUDA" in (_flash2.unavailable_reason(q, None) or "")
    if CUDA:
        qc = q.cuda()
        assert "dtype" in (_flash2.unavailable_reason(qc.float(), None) or "")
        assert "head dim" in (_flash2.unavailable_reason(torch.zeros(4, 2, 12, device="cuda",
                                                                         dtype=torch.bfloat16), None) or "")
        assert _flash2.unavailable_reason(qc, 8) == "a sliding window"
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            assert _flash2.unavailable_reason(qc, None) == "deterministic algorithms on"
            assert _flash2.unavailable_reason(qc, None, backward=False) is None  # its forward is deterministic
        finally:
            torch.use_deterministic_algorithms(was)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_forward_conversions_against_fa2_contract(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """Short sequences: the default forward is FlashAttention-2's (here its contract stand-in);
    its output and converted lse feed our Triton backward (two-pass, under the interpreter):
    out and every gradient vs the fp32 reference, and rows that see no key give out 0 and zero
    dQ (a -inf lse left unconverted would give NaN)."""
    monkeypatch.setattr(_flash2, "_fa2_forward", _fa2_fwd_stand_in)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    monkeypatch.setenv(BWD_ENV, "two_pass")
    calls = _count_calls(monkeypatch, _flash2, "flash_forward")
    lq, lk = [17, 0, 1, 16, 15, 33], [33, 15, 16, 0, 3, 17]
    q, k, v, dout, qo, ko = _case(lq, lk, seed=int(torch.randint(0, 10**6, ())))
    got = _grads(q, k, v, dout, qo, ko, causal)
    assert calls, "the forward did not go to flash_forward"
    want = _grads(q, k, v, dout, qo, ko, causal, backend="reference")
    _assert_near_reference(got, want)
    s4 = int(qo[4])
    rows = slice(s4, s4 + 12) if causal else slice(int(qo[3]), int(qo[4]))  # no visible key
    assert torch.count_nonzero(got[0][rows]) == 0 and torch.count_nonzero(got[1][rows]) == 0


@needs_triton
def test_forward_stand_in_vs_ours_self_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine self-attention sequences through the GPU tests' check: FlashAttention-2's path on
    short sequences (the default forward, the backward asked for; both stand-ins) vs our
    Triton forward + two-pass backward, and vs the fp32 reference on the first 8 samples."""
    monkeypatch.setattr(_flash2, "_fa2_forward", _fa2_fwd_stand_in)
    monkeypatch.setattr(_flash2, "_fa2_backward", _fa2_stand_in)
    monkeypatch.setenv(BWD_ENV, "flash")  # torch's FlashAttention-2 backward (asked for: not the default)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    lengths = [5, 17, 0, 33, 1, 16, 9, 20, 3]
    q, k, v, dout, off, _ = _case(lengths, lengths, seed=int(torch.randint(0, 10**6, ())))
    assert _jfa.fwd_uses_flash(q, k, off, None) and _triton_jfa.bwd_uses_flash(q, None)
    got = _grads(q, k, v, dout, off, off, True)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    base = _ours(monkeypatch, q, k, v, dout, off, off, True)
    monkeypatch.delenv(_jfa.FWD_ENV)
    _check_vs_ours_and_reference(got, base, (q, k, v, dout), lengths, True)


def test_when_flash_forward_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """By mean length (queries and keys per sequence, host ints), unless GEM_JFA_FWD says
    otherwise, a config is forced, or it cannot run."""
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    n = _jfa.FLASH_FWD_MAX_MEAN
    off4 = torch.zeros(5, dtype=torch.int64)
    short, long_ = torch.zeros(4 * (n - 1), 2, 16), torch.zeros(4 * n, 2, 16)
    assert not _jfa.fwd_uses_flash(short, short, off4, None)  # CPU: cannot run
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    assert _jfa.FLASH_FWD_DEFAULT and _jfa.fwd_uses_flash(short, short, off4, None)
    assert not _jfa.fwd_uses_flash(long_, short, off4, None)
    assert not _jfa.fwd_uses_flash(short, long_, off4, None)  # e.g. pooling seeds over long histories
    with force_config(TWO):
        assert not _jfa.fwd_uses_flash(short, short, off4, None)
    for ours in ("pointer", "tma"):
        monkeypatch.setenv(_jfa.FWD_ENV, ours)
        assert not _jfa.fwd_uses_flash(short, short, off4, None)
    monkeypatch.setenv(_jfa.FWD_ENV, "flash")
    assert _jfa.fwd_uses_flash(long_, long_, off4, None)
    monkeypatch.delenv(_jfa.FWD_ENV)
    monkeypatch.setattr(_jfa, "FLASH_FWD_DEFAULT", False)
    assert not _jfa.fwd_uses_flash(short, short, off4, None)


def test_when_flash_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash where it can run when asked for (`GEM_JFA_BWD=flash`, or unset with FLASH_DEFAULT,
    off since gem-kernels 0.3.9), unless GEM_JFA_BWD names one of ours or a config is forced."""
    q = torch.zeros(4, 2, 16)
    monkeypatch.delenv(BWD_ENV, raising=False)
    assert not _triton_jfa.bwd_uses_flash(q, None)  # CPU: cannot run
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **kw: None)
    assert not _triton_jfa.FLASH_DEFAULT and not _triton_jfa.bwd_uses_flash(q, None)
    monkeypatch.setattr(_triton_jfa, "FLASH_DEFAULT", True)
    assert _triton_jfa.bwd_uses_flash(q, None)
    with force_config(TWO):
        assert not _triton_jfa.bwd_uses_flash(q, None)
    for ours in ("one_pass", "two_pass"):
        monkeypatch.setenv(BWD_ENV, ours)
        assert not _triton_jfa.bwd_uses_flash(q, None)
    monkeypatch.setenv(BWD_ENV, "flash")
    monkeypatch.setattr(_triton_jfa, "FLASH_DEFAULT", False)
    assert _triton_jfa.bwd_uses_flash(q, None)
    monkeypatch.delenv(BWD_ENV)
    assert not _triton_jfa.bwd_uses_flash(q, None)
    # flash in the environment where it cannot run: our rule's pick (by the queries' length)
    monkeypatch.setenv(BWD_ENV, "flash")
    assert _triton_jfa.bwd_one_pass_from_env(_triton_jfa.ONE_PASS_MAX_Q_LEN)
    assert not _triton_jfa.bwd_one_pass_from_env(_triton_jfa.ONE_PASS_MAX_Q_LEN + 1)


# --- GPU: torch's real kernel ---------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="GPU test")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_real_size_flash_backward(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """64 log-normal lengths up to 4,096, H=8, D=128, bf16: GEM_JFA_BWD=flash runs torch's
    backward, within 1e-2 of our two-pass backward and 2e-2 of the fp32 reference on the first
    8 samples."""
    monkeypatch.setenv(BWD_ENV, "flash")
    lengths = _lognormal()
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=3)
    assert _triton_jfa.bwd_uses_flash(q, None)
    got = _grads(q, k, v, dout, off, off, causal)
    base = _ours(monkeypatch, q, k, v, dout, off, off, causal)
    _check_vs_ours_and_reference(got, base, (q, k, v, dout), lengths, causal)


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_default_backward_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset GEM_JFA_BWD where torch's FlashAttention-2 backward could run (a GPU, bf16, no
    window): ours runs (faster since gem-kernels 0.3.8, kernels/BENCHMARKS.md), two-pass for
    long query sequences (the same bits as asking for it: no atomics) and one-pass for short
    ones (a pooling's 32 seeds), never flash_backward."""
    monkeypatch.delenv(BWD_ENV, raising=False)
    calls = _count_calls(monkeypatch, _flash2, "flash_backward")
    lengths = _lognormal(16, 2048, seed=int(torch.randint(0, 10**6, ())))
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=6)
    assert _flash2.unavailable_reason(q, None) is None and not _triton_jfa.bwd_uses_flash(q, None)
    got = _grads(q, k, v, dout, off, off, True)
    base = _ours(monkeypatch, q, k, v, dout, off, off, True)
    for a, b in zip(got, base):
        assert torch.equal(a, b)
    seeds = [32] * len(lengths)
    q, _, _, dout, qo, _ = _case(seeds, seeds, h=8, d=128, dtype=torch.bfloat16, seed=7)
    got = _grads(q, k, v, dout, qo, off, False)
    base = _ours(monkeypatch, q, k, v, dout, qo, off, False)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):  # one-pass: dQ by atomics
        assert _rel(a, b) <= 1e-2, f"pooling {name}: {_rel(a, b):.3g}"
    assert not calls


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_strided_cross_and_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v as views of one fused [T, 3, H, D] projection (the model's layout), and cross
    attention with empty sequences and (causal) rows that see no key: flash vs two-pass."""
    monkeypatch.setenv(BWD_ENV, "flash")
    lengths = _lognormal(16, 2048, seed=5)
    off = _offsets(lengths)
    g = torch.Generator(device=DEVICE).manual_seed(int(torch.randint(0, 10**6, ())))
    qkv = torch.randn(sum(lengths), 3, 8, 128, generator=g, device=DEVICE).to(torch.bfloat16)
    dout = torch.randn(sum(lengths), 8, 128, generator=g, device=DEVICE).to(torch.bfloat16)
    q, k, v = qkv.unbind(1)
    assert not q.is_contiguous() and q.stride(2) == 1
    got = _grads(q, k, v, dout, off, off, True)
    base = _ours(monkeypatch, q, k, v, dout, off, off, True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
        assert _rel(a, b) <= 1e-2, f"strided {name}: {_rel(a, b):.3g}"
    lq, lk = [300, 0, 129, 64, 1000], [200, 50, 0, 64, 1500]
    q, k, v, dout, qo, ko = _case(lq, lk, h=8, d=128, dtype=torch.bfloat16, seed=7)
    for causal in (False, True):
        got = _grads(q, k, v, dout, qo, ko, causal)
        base = _ours(monkeypatch, q, k, v, dout, qo, ko, causal)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
            assert torch.isfinite(a).all() and _rel(a, b) <= 1e-2, f"cross causal={causal} {name}: {_rel(a, b):.3g}"
        assert torch.count_nonzero(got[1][300:429]) == 0  # sample 2: no keys
    # causal, 300 queries on 200 keys (bottom-right aligned): the first 100 see no key
    assert torch.count_nonzero(got[1][:100]) == 0


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_compiled_step_uses_flash(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (the custom op path) takes the backward asked for, with the same gradients."""
    monkeypatch.setenv(BWD_ENV, "flash")
    calls = _count_calls(monkeypatch, _flash2, "flash_backward")
    lengths = _lognormal(8, 1024, seed=11)
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=2)
    mx = max(lengths)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention(q, k, v, off, off, mx, mx)

    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = torch.compile(f, fullgraph=True)(*xs)
    got = torch.autograd.grad(out, xs, dout)
    assert calls
    want = _grads(q, k, v, dout, off, off, False)[1:]
    for a, b in zip(got, want):  # dQ is summed with atomics: equal up to the order of the sums
        assert _rel(a, b) <= 1e-2


@pytest.mark.skipif(not CUDA, reason="GPU test")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_short_mix_forward_is_flash(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """A short mix (log-normal, mean ~100, 400 sequences, H=8, D=128, bf16): the default forward
    is FlashAttention-2's; out and gradients within 1e-2 of our Triton forward + two-pass
    backward, and within 2e-2 of the fp32 reference on the first 8 samples."""
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    monkeypatch.delenv(BWD_ENV, raising=False)
    g = torch.Generator().manual_seed(int(torch.randint(0, 10**6, ())))
    lengths = [int(t) for t in torch.exp(torch.randn(400, generator=g, dtype=torch.float64) + 4.1).clamp(1, 2048)]
    q, k, v, dout, off, _ = _case(lengths, lengths, h=8, d=128, dtype=torch.bfloat16, seed=4)
    assert _jfa.fwd_uses_flash(q, k, off, None)
    got = _grads(q, k, v, dout, off, off, causal)
    monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
    base = _ours(monkeypatch, q, k, v, dout, off, off, causal)
    monkeypatch.delenv(_jfa.FWD_ENV)
    _check_vs_ours_and_reference(got, base, (q, k, v, dout), lengths, causal)


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_flash_forward_cross_empty_and_strided(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEM_JFA_FWD=flash: cross attention with empty sequences and (causal) rows that see no
    key (out 0, finite gradients), and q/k/v strided out of one fused projection."""
    monkeypatch.setenv(_jfa.FWD_ENV, "flash")
    monkeypatch.delenv(BWD_ENV, raising=False)
    lq, lk = [300, 0, 129, 64, 1000], [200, 50, 0, 64, 1500]
    q, k, v, dout, qo, ko = _case(lq, lk, h=8, d=128, dtype=torch.bfloat16, seed=8)
    for causal in (False, True):
        got = _grads(q, k, v, dout, qo, ko, causal)
        monkeypatch.setenv(_jfa.FWD_ENV, "pointer")
        base = _ours(monkeypatch, q, k, v, dout, qo, ko, causal)
        monkeypatch.setenv(_jfa.FWD_ENV, "flash")
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
            assert torch.isfinite(a).all() and _rel(a, b) <= 1e-2, f"cross causal={causal} {name}: {_rel(a, b):.3g}"
        assert torch.count_nonzero(got[0][300:429]) == 0  # sample 2: no keys
    assert torch.count_nonzero(got[0][:100]) == 0  # causal, 300 queries on 200 keys
    lengths = [37, 250, 1, 600, 90]
    off = _offsets(lengths)
    qkv = torch.randn(sum(lengths), 3, 8, 128, device=DEVICE).to(torch.bfloat16)
    qs, ks, vs = qkv.unbind(1)
    do = torch.randn(sum(lengths), 8, 128, device=DEVICE).to(torch.bfloat16)
    strided = _grads(qs, ks, vs, do, off, off, False)
    dense = _grads(qs.contiguous(), ks.contiguous(), vs.contiguous(), do, off, off, False)
    for a, b in zip(strided, dense):
        assert _rel(a, b) <= 1e-2
