"""The eager fast path of JFA and GDPA (one plan per call signature, gem_kernels._attn_plan).

A plan must change host time and nothing else: the second call with a signature skips the
checks and still matches the plain-PyTorch reference on fresh data (forward and gradients);
any change of signature, switch or path rule takes the ordinary path again; bad values still
raise the ordinary errors. CPU: Triton's interpreter (TRITON_INTERPRET=1, set by Bazel) at
tiny sizes. GPU (skipped without CUDA): issue 15's shape, through the plan's direct launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from _launch_hook import under_launch_hook
from gem_kernels import _gdpa, _jfa, _triton_jfa, generalized_dot_product_attention, jagged_flash_attention

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"
# On the GPU the lengths are 5x: GDPA's plan holds its long-kv kernel, which takes over from the
# short-kv one past one kv tile (128 keys at D = 32 there, 16 under the interpreter).
SCALE = 5 if CUDA else 1
TOL = {torch.float32: (2e-4, 1e-3), torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}
GRAD_TOL = {torch.float32: (5e-4, 1e-3), torch.bfloat16: (6e-2, 6e-2), torch.float16: (1e-2, 1e-2)}


def jfa(q: Any, k: Any, v: Any, off: Any, mq: Any, mk: Any, backend: str = "triton", **kw: Any) -> torch.Tensor:
    return jagged_flash_attention(q, k, v, off, off, mq, mk, backend=backend, **kw)


def gdpa(q: Any, k: Any, v: Any, off: Any, mq: Any, mk: Any, backend: str = "triton", **kw: Any) -> torch.Tensor:
    kw.setdefault("activation", "silu")
    return generalized_dot_product_attention(q, k, v, off, off, mq, mk, backend=backend, **kw)


OPS = {"jfa": (jfa, _jfa), "gdpa": (gdpa, _gdpa)}


class _Ordinary:
    """Counts the Triton calls of one op that take the ordinary (checking) path: the ones that
    call check_triton_device from the op's module (the reference path does not); and gives the
    op a fresh plan table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        from gem_kernels._jagged import check_triton_device as real

        self.calls = 0

        def counted(device: torch.device) -> None:
            self.calls += 1
            real(device)

        monkeypatch.setattr(module, "check_triton_device", counted)
        monkeypatch.setattr(module, "_PLANS", {})
        self.plans = module._PLANS


def _lengths(*lengths: int) -> list[int]:
    return [n * SCALE for n in lengths]


def _ours_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No FlashAttention forward for short batches (its length rules have a test of their own)."""
    monkeypatch.setattr(_jfa, "FLASH_FWD_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", False)


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _fresh(lengths: list[int], *, h: int = 2, d: int = 32, dtype: torch.dtype = torch.float32, seed: int = 0,
           grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(dtype).requires_grad_(grad)
               for _ in range(3))
    return q, k, v


def _check(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, off: torch.Tensor,
           mx: int, dout_of: Callable[[torch.Tensor], torch.Tensor] = torch.randn_like, **kw: Any) -> torch.Tensor:
    """Runs the Triton path, compares with the reference (outputs, and gradients for the upstream
    gradient `dout_of(out)` where q wants one); returns the Triton output."""
    out = fn(q, k, v, off, mx, mx, **kw)
    q32, k32, v32 = (x.detach().float().requires_grad_(x.requires_grad) for x in (q, k, v))
    ref = fn(q32, k32, v32, off, mx, mx, backend="reference", **kw)
    atol, rtol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    if q.requires_grad:
        dout = dout_of(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        atol, rtol = GRAD_TOL[q.dtype]
        for got, want in zip(grads, torch.autograd.grad(ref, (q32, k32, v32), dout.float())):
            torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol)
    else:
        assert out.grad_fn is None
    return out


@needs_triton
@pytest.mark.parametrize("op", list(OPS))
def test_plan_serves_repeat_calls_on_fresh_data(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    # The first call checks and keeps a plan; later calls with the same signature (other T
    # and max lengths, same B) skip the checks and still match the reference, with and
    # without gradients. (T·H is never a multiple of 16 here: JFA's signature holds Triton's
    # specialization of T-dependent strides, so such a T would be a plan of its own.)
    fn, module = OPS[op]
    _ours_only(monkeypatch)
    ordinary = _Ordinary(monkeypatch, module)
    batches = (_lengths(20, 33, 5), _lengths(40, 3, 17), _lengths(9, 50, 22), _lengths(17, 17, 34))
    for seed, lengths in enumerate(batches):
        for grad in (False, True):
            q, k, v = _fresh(lengths, seed=seed, grad=grad)
            _check(fn, q, k, v, _offsets(lengths), max(lengths), causal=True)
    assert ordinary.calls == 1 and len(ordinary.plans) == 1


@needs_triton
@pytest.mark.parametrize("op", list(OPS))
def test_plan_not_served_for_another_signature(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    # Every change the signature holds runs the checks again (and is right); a misaligned view
    # never gets a plan; nor does a q that is not unit-stride on D, nor offsets that are a
    # strided view.
    fn, module = OPS[op]
    _ours_only(monkeypatch)
    ordinary = _Ordinary(monkeypatch, module)
    lengths = _lengths(20, 33, 5)
    off, n = _offsets(lengths), sum(lengths)
    base = torch.randn(3 * n * 64 + 4, device=DEVICE)
    q_, k_, v_ = (base[1 + i * n * 64:][: n * 64].view(n, 2, 32) for i in range(3))
    misaligned = (q_, k_, v_)
    assert misaligned[0].data_ptr() % 16
    qkv = torch.randn(n, 3, 2, 32, device=DEVICE)  # q, k, v: strided views of one fused projection
    q_, k_, v_ = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in _fresh(lengths, seed=5))
    transposed = (q_, k_, v_)
    wide = torch.zeros(2 * len(off), dtype=torch.int64, device=DEVICE)
    wide[::2] = off
    cases: list[tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, dict[str, Any], bool]] = [
        (_fresh(lengths), off, {}, True),
        (_fresh(lengths, dtype=torch.bfloat16), off, {}, True),
        (_fresh(lengths, h=3), off, {}, True),
        (_fresh(lengths), off, {"causal": True}, True),
        (_fresh(lengths), off, {"window": 4}, True),
        (_fresh(lengths), off, {"scale": 0.3}, True),
        # JFA's kernel reads strided q/k/v; GDPA's launcher makes them contiguous (no plan)
        ((qkv[:, 0], qkv[:, 1], qkv[:, 2]), off, {}, op == "jfa"),
        (misaligned, off, {}, False),
        (misaligned, off, {}, False),
        (_fresh(lengths), wide[::2], {}, False),
        (_fresh(lengths), wide[::2], {}, False),
    ]
    if op == "gdpa":
        cases += [((qkv[:, 0], qkv[:, 1], qkv[:, 2]), off, {}, False),  # again: still not planned
                  (_fresh(lengths), off, {"activation": "gelu"}, True),
                  (_fresh(lengths), off, {"divisor": 3.0}, True)]
    else:
        cases += [(transposed, off, {}, False), (transposed, off, {}, False)]
    for i, ((q, k, v), o, kw, planned) in enumerate(cases):
        before = len(ordinary.plans)
        _check(fn, q, k, v, o, max(lengths), **kw)
        assert ordinary.calls == i + 1, f"case {i} was served from another signature's plan"
        assert len(ordinary.plans) == before + planned, f"case {i}"
    # Each planned case is served on fresh data now.
    for i, ((q, k, v), o, kw, planned) in enumerate(cases):
        if planned:
            _check(fn, torch.randn_like(q), torch.randn_like(k), torch.randn_like(v), o, max(lengths), **kw)
    assert ordinary.calls == len(cases)


@needs_triton
def test_jfa_plan_follows_the_switches_and_length_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    # GEM_JFA_FWD, force_config and the mean-length rule that hands short batches to
    # FlashAttention-2 are read per call: a plan made under one setting serves no call under
    # another. FlashAttention-2 stands in here as a recording stand-in (it needs CUDA).
    from gem_kernels import _flash2
    from gem_kernels._triton_jfa import JfaConfig, JfaTiles, force_config

    ordinary = _Ordinary(monkeypatch, _jfa)
    lengths = [20, 33, 5]
    off, mx = _offsets(lengths), 33
    _check(jfa, *_fresh(lengths), off, mx)
    assert ordinary.calls == 1 and len(ordinary.plans) == 1
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")  # the same kernel, another setting: checked again
    _check(jfa, *_fresh(lengths, seed=1), off, mx)
    _check(jfa, *_fresh(lengths, seed=2), off, mx)
    assert ordinary.calls == 2 and len(ordinary.plans) == 1  # replaced: one per signature
    tiles = JfaTiles(block_m=16, block_n=16, num_warps=4, num_stages=1)
    with force_config(JfaConfig(fwd=tiles, dkdv=tiles, dq=tiles)):
        _check(jfa, *_fresh(lengths, seed=3), off, mx)
    assert ordinary.calls == 3
    monkeypatch.delenv("GEM_JFA_FWD")
    _check(jfa, *_fresh(lengths, seed=4), off, mx)
    assert ordinary.calls == 4

    # The length rule: FlashAttention-2 takes batches whose mean length is below
    # FLASH_FWD_MAX_MEAN where it can run. A plan made on a long batch must not serve a short one.
    ran: list[int] = []

    def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor,
                      mq: int, mk: int, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        ran.append(q.shape[0])
        out = jfa(q, k, v, qo, mq, mk, backend="reference", causal=causal, scale=scale)
        return out, torch.zeros(q.shape[:2], device=q.device)

    monkeypatch.setattr(_jfa, "FLASH_FWD_MAX_MEAN", 16)
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(_flash2, "flash_forward", flash_forward)
    long_, short = [20, 33, 5], [10, 20, 5]  # mean 19.3 (ours) and 11.7 (FlashAttention-2), B = 3
    _check(jfa, *_fresh(long_, seed=5), _offsets(long_), 33)
    _check(jfa, *_fresh(long_, seed=6), _offsets(long_), 33)
    assert ordinary.calls == 5 and not ran
    _check(jfa, *_fresh(short, seed=7), _offsets(short), 20)
    assert ordinary.calls == 6 and ran == [35]


@needs_triton
def test_gdpa_plan_only_for_long_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plan holds the long-kv kernel: a batch of the same signature whose keys fit one tile
    # takes the ordinary path (the short-kv kernel), as does a call under force_tiles.
    ordinary = _Ordinary(monkeypatch, _gdpa)
    block_n = _gdpa.gdpa_tiles(10_000, 32).block_n
    long_, short = [block_n + 3, 5, 9], [block_n, 5, 9]
    _check(gdpa, *_fresh(long_), _offsets(long_), max(long_))
    _check(gdpa, *_fresh(long_, seed=1), _offsets(long_), max(long_))
    assert ordinary.calls == 1 and len(ordinary.plans) == 1
    _check(gdpa, *_fresh(short, seed=2), _offsets(short), max(short))
    assert ordinary.calls == 2
    with _gdpa.force_tiles(fwd=_gdpa.GdpaTiles(block_m=16, block_n=16, num_warps=4, num_stages=1)):
        _check(gdpa, *_fresh(long_, seed=3), _offsets(long_), max(long_))
    assert ordinary.calls == 3


@needs_triton
@pytest.mark.parametrize("op", list(OPS))
def test_plan_keeps_the_errors(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    # With a plan for the signature, bad values still raise the ordinary path's errors: the
    # offsets' contents (read where the ordinary path reads them: CPU tensors), T of k and v,
    # the max lengths' values and types, and the interpreter's environment on CPU tensors.
    fn, module = OPS[op]
    _ours_only(monkeypatch)
    ordinary = _Ordinary(monkeypatch, module)
    lengths = [20, 33, 5]
    q, k, v = _fresh(lengths)
    off = _offsets(lengths)
    fn(q, k, v, off, 33, 33)
    fn(q, k, v, off, 33, 33)
    assert len(ordinary.plans) == (not CUDA or op == "jfa")  # (GDPA's short kv on the GPU: no plan)
    if not CUDA:
        with pytest.raises(ValueError, match="max_q_len=30 is smaller than the longest"):
            fn(q, k, v, off, 30, 33)
        bad = off.clone()
        bad[2] = bad[1] - 1
        with pytest.raises(ValueError, match="q_offsets must be non-decreasing"):
            fn(q, k, v, bad, 33, 33)
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
            fn(q, k, v, off, 33, 33)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="must be equal"):
        fn(q, k, v[1:], off, 33, 33)
    with pytest.raises(ValueError, match="max_q_len=-1 must be >= 0"):
        fn(q, k, v, off, -1, 33)
    with pytest.raises(TypeError, match="max_kv_len=True must be a host int"):
        fn(q, k, v, off, 33, True)
    with pytest.raises(ValueError, match=r"max_q_len=\d+ rows x row stride 64 must be < 2\*\*31"):
        fn(q, k, v, off, 2**26, 33)


@pytest.mark.skipif(not CUDA, reason="the plan's direct launch runs only on CUDA")
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_plan_direct_launch_matches_reference(monkeypatch: pytest.MonkeyPatch, op: str, causal: bool) -> None:
    # Issue 15's shape (H=4, D=128, bf16, lengths up to thousands): later calls go through the
    # plan's DirectLaunch, batches with other T too, with and without gradients; with a launch
    # hook set, the plan hands the launch to Triton's own path, which calls the hook.
    fn, module = OPS[op]
    ordinary = _Ordinary(monkeypatch, module)
    g = torch.Generator().manual_seed(15)
    lengths = torch.randint(600, 3000, (24,), generator=g).tolist()
    for seed in range(4):
        if seed == 2:
            lengths = lengths[::-1][:23] + [700]
        q, k, v = _fresh(lengths, h=4, d=128, dtype=torch.bfloat16, seed=seed, grad=seed == 3)
        off, mx = _offsets(lengths), max(lengths)
        _check(fn, q, k, v, off, mx, causal=causal)
    assert ordinary.calls == 1
    (plan,) = ordinary.plans.values()
    assert plan.direct is not None
    q, k, v = _fresh(lengths, h=4, d=128, dtype=torch.bfloat16, seed=9)
    _, seen = under_launch_hook(lambda: _check(fn, q, k, v, off, mx, causal=causal))
    assert seen and ordinary.calls == 1


@needs_triton
def test_jfa_plan_follows_the_flash4_length_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where FlashAttention-4 can run, it takes batches whose mean query length reaches
    # FLASH4_FWD_MIN_MEAN: a plan made on a shorter batch must not serve such a one. A
    # recording stand-in plays FlashAttention-4 (it needs the optional package and a Hopper GPU).
    from gem_kernels import _flash4

    ran: list[int] = []

    def flash4_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor,
                       mq: int, mk: int, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        ran.append(q.shape[0])
        out = jfa(q, k, v, qo, mq, mk, backend="reference", causal=causal, scale=scale)
        return out, torch.zeros(q.shape[:2], device=q.device)

    monkeypatch.setattr(_jfa, "FLASH_FWD_DEFAULT", False)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_DEFAULT", True)
    monkeypatch.setattr(_jfa, "FLASH4_FWD_MIN_MEAN", 16)
    monkeypatch.setattr(_flash4, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(_flash4, "flash4_forward", flash4_forward)
    ordinary = _Ordinary(monkeypatch, _jfa)
    # One signature (the same max length, so the same tiles): mean 11.7 (ours) and 19.3
    # (FlashAttention-4), B = 3.
    short, long_ = [10, 20, 5], [20, 33, 5]
    _check(jfa, *_fresh(short), _offsets(short), 33)
    _check(jfa, *_fresh(short, seed=1), _offsets(short), 33)
    assert ordinary.calls == 1 and len(ordinary.plans) == 1 and not ran
    _check(jfa, *_fresh(long_, seed=2), _offsets(long_), 33)
    assert ordinary.calls == 2 and ran == [58]
    _check(jfa, *_fresh(long_, seed=3), _offsets(long_), 33)  # no plan made from a FlashAttention-4 call
    assert ordinary.calls == 3 and ran == [58, 58] and len(ordinary.plans) == 1


class _OrdinaryBackward:
    """Counts the backwards of one op that take the ordinary path (its launcher), and those
    the backward's plan serves (the planned launcher returning a result)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, op: str) -> None:
        self.calls, self.served = 0, 0
        module, planned = OPS[op][1], "_plan_backward"
        launcher, ordinary = BACKWARDS[op]
        real, real_planned = getattr(launcher, ordinary), getattr(module, planned)

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls += 1
            return real(*a, **kw)

        def counted_planned(*a: Any, **kw: Any) -> Any:
            got = real_planned(*a, **kw)
            self.served += got is not None
            return got

        monkeypatch.setattr(launcher, ordinary, counted)
        monkeypatch.setattr(module, planned, counted_planned)


# op -> (the module whose launcher the ordinary backward calls, its name)
BACKWARDS = {"gdpa": (_gdpa, "gdpa_backward_triton"), "jfa": (_triton_jfa, "jfa_backward")}


@needs_triton
@pytest.mark.parametrize("op", list(BACKWARDS))
def test_backward_plan_serves_repeat_calls_on_fresh_data(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    # The first call's forward checks and keeps the forward's plan; the second (planned)
    # call's backward runs the ordinary launcher and keeps the backward's plan; every later
    # backward of the signature is served by it (other T and max lengths), and matches the
    # reference on fresh data, whatever the upstream gradient's layout.
    fn, module = OPS[op]
    _ours_only(monkeypatch)
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)  # our backward, where flash-attn-4 is installed too
    ordinary = _Ordinary(monkeypatch, module)
    backward = _OrdinaryBackward(monkeypatch, op)
    batches = (_lengths(20, 33, 5), _lengths(40, 3, 17), _lengths(9, 50, 22), _lengths(17, 17, 34),
               _lengths(30, 36, 9))
    for seed, lengths in enumerate(batches):
        q, k, v = _fresh(lengths, seed=seed, grad=True)
        _check(fn, q, k, v, _offsets(lengths), max(lengths), causal=True)
    assert ordinary.calls == 1 and backward.calls == 2 and backward.served == 3
    # An upstream gradient that is a transposed view (made contiguous, then served) and one
    # whose data is not 16-byte aligned (not served: the ordinary path, still right).
    lengths = _lengths(21, 40, 7)
    transposed = lambda out: torch.randn(out.shape[2], out.shape[1], out.shape[0], device=DEVICE).to(out.dtype).T
    _check(fn, *_fresh(lengths, seed=7, grad=True), _offsets(lengths), max(lengths), transposed, causal=True)
    assert backward.calls == 2 and backward.served == 4

    def misaligned(out: torch.Tensor) -> torch.Tensor:
        base = torch.randn(out.numel() + 1, device=DEVICE).to(out.dtype)
        dout = base[1:].view(out.shape)
        assert dout.data_ptr() % 16
        return dout

    _check(fn, *_fresh(lengths, seed=8, grad=True), _offsets(lengths), max(lengths), misaligned, causal=True)
    assert backward.calls == 3 and backward.served == 4
    assert ordinary.calls == 1


@needs_triton
def test_gdpa_backward_plan_follows_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    # force_tiles and GEM_GDPA_BWD (the one-pass backward) are read per call: a backward plan
    # made under the defaults serves no backward under either, and each such one is right.
    ordinary = _Ordinary(monkeypatch, _gdpa)
    backward = _OrdinaryBackward(monkeypatch, "gdpa")
    lengths = _lengths(20, 33, 5)
    off, mx = _offsets(lengths), max(lengths)
    for seed in range(3):
        _check(gdpa, *_fresh(lengths, seed=seed, grad=True), off, mx)
    assert backward.calls == 2 and backward.served == 1
    monkeypatch.setenv("GEM_GDPA_BWD", "one_pass")
    _check(gdpa, *_fresh(lengths, seed=3, grad=True), off, mx)
    assert backward.calls == 3 and backward.served == 1
    monkeypatch.delenv("GEM_GDPA_BWD")
    tiles = _gdpa.gdpa_tiles(mx, 32, kind="dkdv")
    with _gdpa.force_tiles(dkdv=tiles):  # (the forward takes its ordinary path too)
        _check(gdpa, *_fresh(lengths, seed=4, grad=True), off, mx)
    assert backward.calls == 4 and backward.served == 1 and ordinary.calls == 2
    _check(gdpa, *_fresh(lengths, seed=5, grad=True), off, mx)
    assert backward.calls == 4 and backward.served == 2 and ordinary.calls == 2


@needs_triton
def test_jfa_backward_plan_follows_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    # The backward config is read per call: GEM_JFA_BWD's one- and two-pass backwards each get
    # a plan of their own (and each serves only its own); force_config and the FlashAttention-2
    # backward's switch (a recording stand-in: it needs CUDA) take the ordinary path.
    from gem_kernels import _flash2
    from gem_kernels._triton_jfa import JfaConfig, JfaTiles, force_config

    _ours_only(monkeypatch)
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    ordinary = _Ordinary(monkeypatch, _jfa)
    backward = _OrdinaryBackward(monkeypatch, "jfa")
    lengths = _lengths(20, 33, 5)
    off, mx = _offsets(lengths), max(lengths)
    for mode, seeds in (("two_pass", (0, 1, 2)), ("one_pass", (3, 4, 5)), ("two_pass", (6,))):
        monkeypatch.setenv("GEM_JFA_BWD", mode)
        for seed in seeds:
            _check(jfa, *_fresh(lengths, seed=seed, grad=True), off, mx)
    # two-pass: ordinary, ordinary (kept), served; one-pass: ordinary (kept), served, served;
    # two-pass again: served by its own plan.
    assert ordinary.calls == 1 and backward.calls == 3 and backward.served == 4
    tiles = JfaTiles(block_m=16, block_n=16, num_warps=4, num_stages=1)
    with force_config(JfaConfig(fwd=tiles, dkdv=tiles, dq=tiles)):  # (the forward takes its ordinary path too)
        _check(jfa, *_fresh(lengths, seed=7, grad=True), off, mx)
    assert backward.calls == 4 and backward.served == 4
    ran: list[int] = []

    def flash_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor, mq: int, mk: int, causal: bool,
                       scale: float) -> tuple[torch.Tensor, ...]:
        ran.append(q.shape[0])
        with torch.enable_grad():
            xs = [x.detach().requires_grad_(True) for x in (q, k, v)]
            ref = jfa(xs[0], xs[1], xs[2], qo, mq, mk, backend="reference", causal=causal, scale=scale)
            return torch.autograd.grad(ref, xs, dout)

    monkeypatch.setenv("GEM_JFA_BWD", "flash")
    monkeypatch.setattr(_flash2, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(_flash2, "flash_backward", flash_backward)
    _check(jfa, *_fresh(lengths, seed=8, grad=True), off, mx)
    assert ran == [sum(lengths)] and backward.calls == 5 and backward.served == 4


@needs_triton
def test_jfa_plan_is_keyed_by_the_gluon_forward_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    # With GEM_JFA_GLUON naming fwd, calls keep and use plans too (0.3.16; before, the switch
    # turned them off). The switch and the Gluon forward's tiles are part of the signature:
    # a plan made under one setting serves no call under another. Off a Hopper GPU the Gluon
    # forward falls back to the Triton kernel, whose plan is kept.
    from gem_kernels import _gluon_jfa

    _ours_only(monkeypatch)
    ordinary = _Ordinary(monkeypatch, _jfa)
    lengths = _lengths(20, 33, 5)
    off, mx = _offsets(lengths), max(lengths)
    _check(jfa, *_fresh(lengths), off, mx)
    assert ordinary.calls == 1 and len(ordinary.plans) == 1
    monkeypatch.setenv(_gluon_jfa.ENV, "fwd")
    for seed in (1, 2, 3):  # the first checks again; the next two are served
        _check(jfa, *_fresh(lengths, seed=seed, grad=seed == 3), off, mx)
    assert ordinary.calls == 2 and len(ordinary.plans) == 2
    monkeypatch.setattr(_gluon_jfa, "DEFAULT_FWD_TILES", (128, 128, 12, 2, True, True, True))
    _check(jfa, *_fresh(lengths, seed=4), off, mx)
    assert ordinary.calls == 3 and len(ordinary.plans) == 3
    monkeypatch.setenv(_gluon_jfa.ENV, "dkdv,dq")  # the forward is not asked for: the first plan's key
    _check(jfa, *_fresh(lengths, seed=5), off, mx)
    assert ordinary.calls == 3
    # The backward's plans too (they stepped aside for the switch before 0.3.16): off a Hopper GPU
    # the backward runs the Triton kernels, whose plan serves the next backward.
    backwards: list[int] = []
    real = _triton_jfa.jfa_backward

    def counted(*a: Any, **kw: Any) -> Any:
        backwards.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(_triton_jfa, "jfa_backward", counted)
    for seed in (6, 7, 8):
        _check(jfa, *_fresh(lengths, seed=seed, grad=True), off, mx)
    assert ordinary.calls == 3 and len(backwards) == 1
