"""Triton GDPA vs the plain-PyTorch reference: every activation, forward and dq/dk/dv.

CPU: Triton's interpreter (TRITON_INTERPRET=1, set by Bazel) at tiny sizes with 16x16 tiles,
so lengths 0, 1, 15, 16, 17, 33 hit the tile edges. GPU (skipped without CUDA): real sizes
and the heuristic tiles.
"""

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_kernels import generalized_dot_product_attention as gdpa
from gem_kernels import _gdpa as gdpa_module
from gem_kernels import jagged_flash_attention
from gem_kernels._gdpa import ACTIVATION_NAMES, ACTIVATIONS, gdpa_tiles
from gem_kernels._jagged import visible_mask
from _strided import every_other

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"

# Tolerances vs the fp32 reference on the same (rounded) inputs: (atol, rtol). Elementwise
# activations have no row normalisation, so outputs scale with sum |act| / divisor ~ O(1).
TOL = {
    torch.float32: {"out": (2e-5, 1e-4), "grad": (5e-5, 1e-4)},
    torch.bfloat16: {"out": (3e-2, 3e-2), "grad": (6e-2, 6e-2)},
    torch.float16: {"out": (5e-3, 5e-3), "grad": (1e-2, 1e-2)},
}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _check(
    lq: list[int],
    lk: list[int],
    *,
    activation: str = "silu",
    h: int = 1,
    d: int = 16,
    dtype: torch.dtype = torch.float32,
    causal: bool = False,
    window: int | None = None,
    divisor: float | None = None,
    seed: int = 0,
    strided_offsets: bool = False,
) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)
    mq, mk = max(lq, default=0), max(lk, default=0)
    # The Triton call may get the offsets as strided views (every other element of a buffer).
    tqo, tko = (every_other(qo), every_other(ko)) if strided_offsets else (qo, ko)

    def rnd(t: int) -> torch.Tensor:
        return torch.randn(t, h, d, generator=g, device=DEVICE).to(dtype).requires_grad_()

    q, k, v = rnd(sum(lq)), rnd(sum(lk)), rnd(sum(lk))
    kw = dict(activation=activation, causal=causal, window=window, divisor=divisor)
    out = gdpa(q, k, v, tqo, tko, mq, mk, backend="triton", **kw)  # type: ignore[arg-type]
    dout = torch.randn(out.shape, generator=g, device=DEVICE).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout, allow_unused=True)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = gdpa(q32, k32, v32, qo, ko, mq, mk, backend="reference", **kw)  # type: ignore[arg-type]
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float(), allow_unused=True)
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    atol, rtol = TOL[dtype]["out"]
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    atol, rtol = TOL[dtype]["grad"]
    for name, got, want, x in zip(("dq", "dk", "dv"), grads, ref_grads, (q, k, v)):
        got = torch.zeros_like(x) if got is None else got
        want = torch.zeros_like(x, dtype=torch.float32) if want is None else want
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.float(), want, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


EDGE = [17, 0, 1, 16, 15, 33]
VARIANTS = {
    "full": dict(causal=False, window=None),
    "causal": dict(causal=True, window=None),
    "causal_window": dict(causal=True, window=5),
    "band": dict(causal=False, window=3),
}


@needs_triton
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_activation_self_attention_edges(activation: str) -> None:
    _check(EDGE, EDGE, activation=activation, causal=True, h=2)


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_visibility_variants(variant: str) -> None:
    _check(EDGE, EDGE, activation="gelu", **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_unequal_lengths_bottom_right(activation: str) -> None:
    _check(EDGE, [17, 3, 0, 16, 15, 33][::-1], activation=activation, causal=True, window=6)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_cross_long_q_short_kv(causal: bool) -> None:
    # The personalized-FFN shape: long jagged queries over 0..9 keys per sample.
    _check([40, 3, 0, 17, 1], [4, 8, 2, 0, 9], activation="silu", causal=causal, divisor=7.0)


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("q_tiles", [1, 3])
def test_short_kv_programs_walk_several_q_tiles(variant: str, q_tiles: int) -> None:
    # Short kv: one program walks `q_tiles` q tiles of a sample (dK/dV summed in registers, one
    # atomic add per program); query lengths put chunk ends before, on and after tile edges.
    lq, lk = [49, 3, 0, 16, 33, 1, 48], [5, 16, 2, 0, 9, 1, 12]
    tiles = {kind: dataclasses.replace(gdpa_tiles(16, 16, kind=kind), q_tiles=q_tiles) for kind in ("fwd", "dq")}
    with gdpa_module.force_tiles(**tiles):
        _check(lq, lk, activation="gelu", h=2, seed=q_tiles, **VARIANTS[variant])  # type: ignore[arg-type]


def _fwd_bwd_bits(lq: list[int], lk: list[int], schedule: str, seed: int, **kw: object) -> list[torch.Tensor]:
    """out, dq, dk, dv of one bf16 call with every long-kv kernel in `schedule`'s order."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    h, d = 2, 16
    q, k, v = (torch.randn(sum(n), h, d, generator=g, device=DEVICE).to(torch.bfloat16).requires_grad_()
               for n in (lq, lk, lk))
    dout = torch.randn(q.shape, generator=g, device=DEVICE).to(torch.bfloat16)
    tiles = {kind: dataclasses.replace(gdpa_tiles(64, d, kind=kind), schedule=schedule) for kind in ("fwd", "dq", "dkdv")}
    with gdpa_module.force_tiles(**tiles):
        out = gdpa(q, k, v, _offsets(lq), _offsets(lk), max(lq), max(lk), backend="triton", **kw)  # type: ignore[arg-type]
        grads = torch.autograd.grad(out, (q, k, v), dout)
    return [out.detach(), *grads]


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_schedule_gives_the_same_bits(variant: str) -> None:
    # The tile order (heaviest first by list or grid, or batch order) changes only which
    # program runs when: each tile's sums are the same, so the results are bitwise equal,
    # and equal the reference (checked for one order by _check; here all against in_order).
    import random

    rng = random.Random(hash(variant) & 0xFFFF)
    lq = [rng.choice([0, 1, 15, 16, 17, 40, 70]) for _ in range(7)]
    lk = lq if variant != "band" else [rng.choice([0, 5, 33, 64]) for _ in lq]
    kw = dict(VARIANTS[variant], activation="silu")
    want = _fwd_bwd_bits(lq, lk, "in_order", 3, **kw)
    for schedule in ("list", "grid", "auto", "in_order_rev"):
        got = _fwd_bwd_bits(lq, lk, schedule, 3, **kw)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert torch.equal(a, b), f"{schedule} {name}"
    with gdpa_module.force_tiles(**{kind: dataclasses.replace(gdpa_tiles(64, 16, kind=kind), schedule="list")
                                     for kind in ("fwd", "dq", "dkdv")}):
        _check(lq, lk, activation="silu", h=2, seed=5, **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("lk", [EDGE, [4, 0, 2, 3, 1, 4]], ids=["self", "short_kv"])
def test_strided_offsets(lk: list[int]) -> None:
    """Offsets passed as strided views give the contiguous offsets' results (the kernels read
    them with a unit stride: the launchers make them contiguous)."""
    _check(EDGE, lk, causal=lk is EDGE, h=2, strided_offsets=True)


def test_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="GdpaTiles.schedule must be one of"):
        gdpa_module.GdpaTiles(schedule="fastest")


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """torch's deterministic algorithms on inside the block (restored after)."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


class _Refuse:
    """Stands in for a Triton kernel: launching it (`kernel[grid]`) raises "<what> was launched"."""

    arg_names: list[str] = []  # (the launchers wrap kernels in a CachedLaunch, which reads them)

    def __init__(self, what: str) -> None:
        self.what = what

    def __getitem__(self, grid: object) -> None:
        raise RuntimeError(f"{self.what} was launched")


@needs_triton
def test_short_kv_deterministic_takes_the_two_kernel_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under torch's deterministic algorithms the short-kv backward (dK/dV by fp32 atomics)
    # gives way to the dQ + dK/dV kernels, whose sums do not depend on arrival order.
    from gem_kernels import _triton_gdpa

    monkeypatch.setattr(_triton_gdpa, "_gdpa_bwd_short_kernel", _Refuse("the short-kv atomics kernel"))
    with _deterministic():
        _check([40, 3, 0, 17, 1], [4, 8, 2, 0, 9], activation="silu", causal=True, divisor=7.0)
    with pytest.raises(RuntimeError, match="short-kv atomics kernel was launched"):  # the default
        _check([40, 3], [4, 8], activation="silu")


@needs_triton
def test_cross_short_kv_two_kernel_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # Short kv normally takes dK/dV from the dQ kernel (fp32 atomics); the split path too.
    monkeypatch.setattr(gdpa_module, "_FORCE_SPLIT_BWD", True)
    _check([40, 3, 0, 17, 1], [4, 8, 2, 0, 9], activation="relu2", causal=True, window=4)


def _one_pass_tiles(one_pass: bool, max_kv: int = 64, d: int = 16) -> dict[str, gdpa_module.GdpaTiles]:
    return {"dkdv": dataclasses.replace(gdpa_tiles(max_kv, d, kind="dkdv"), one_pass=one_pass)}


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("activation", ["silu", "gelu", "relu2"])
def test_one_pass_backward_matches_the_reference(variant: str, activation: str) -> None:
    # The long-kv one-pass backward (dQ added by the dK/dV kernel with atomics, no dQ kernel)
    # against the fp32 reference: self-attention with lengths on the 16-row tile edges, and
    # unequal q / kv lengths (bottom-right aligned; empty q or kv samples).
    with gdpa_module.force_tiles(**_one_pass_tiles(True)):
        _check(EDGE, EDGE, activation=activation, h=2, **VARIANTS[variant])  # type: ignore[arg-type]
        _check([17, 3, 0, 40, 16, 1], [33, 0, 5, 40, 16, 18], activation=activation, seed=1,
               **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
def test_one_pass_backward_equals_two_pass_and_skips_the_dq_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    # Same inputs, both backwards: dK and dV come from the same kernel and sums, bit for bit; dQ
    # differs by the atomics' rounding only. The one-pass run never launches the dQ kernel, and
    # `GEM_GDPA_BWD` picks the path for the heuristic's tiles.
    from gem_kernels import _triton_gdpa

    lq = [40, 3, 0, 17, 33]
    g = torch.Generator(device=DEVICE).manual_seed(11)
    q, k, v = (torch.randn(sum(lq), 2, 16, generator=g, device=DEVICE).requires_grad_() for _ in range(3))
    dout = torch.randn(q.shape, generator=g, device=DEVICE)
    off = _offsets(lq)

    def grads() -> tuple[torch.Tensor, ...]:
        out = gdpa(q, k, v, off, off, max(lq), max(lq), activation="silu", causal=True, backend="triton")
        return torch.autograd.grad(out, (q, k, v), dout)

    monkeypatch.delenv(gdpa_module.BWD_ENV, raising=False)
    two = grads()
    real_dq = _triton_gdpa._gdpa_bwd_dq_kernel

    monkeypatch.setattr(_triton_gdpa, "_gdpa_bwd_dq_kernel", _Refuse("the dQ kernel"))
    monkeypatch.setenv(gdpa_module.BWD_ENV, "one_pass")
    one = grads()
    assert torch.equal(one[1], two[1]) and torch.equal(one[2], two[2])
    torch.testing.assert_close(one[0], two[0], atol=1e-5, rtol=1e-5)
    with gdpa_module.force_tiles(**_one_pass_tiles(False)), pytest.raises(RuntimeError, match="dQ kernel"):
        grads()  # forced tiles win over the variable
    monkeypatch.setattr(_triton_gdpa, "_gdpa_bwd_dq_kernel", real_dq)
    monkeypatch.setenv(gdpa_module.BWD_ENV, "two_pass")
    assert all(torch.equal(a, b) for a, b in zip(grads(), two))
    monkeypatch.setenv(gdpa_module.BWD_ENV, "onepass")
    with pytest.raises(ValueError, match="GEM_GDPA_BWD='onepass' must be one of"):
        grads()


@needs_triton
def test_one_pass_backward_is_off_under_deterministic_algorithms(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_kernels import _triton_gdpa

    monkeypatch.setattr(_triton_gdpa, "_gdpa_bwd_dq_kernel", _Refuse("the dQ kernel"))
    with _deterministic(), gdpa_module.force_tiles(**_one_pass_tiles(True)):
        with pytest.raises(RuntimeError, match="dQ kernel"):
            _check(EDGE, EDGE, activation="silu", causal=True)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype: torch.dtype) -> None:
    _check([17, 1, 16], [17, 1, 16], activation="silu", dtype=dtype, d=32)


@needs_triton
def test_all_empty_kv_gives_zeros_and_zero_grads() -> None:
    qo, ko = _offsets([3, 2]), _offsets([0, 0])
    q = torch.randn(5, 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    for backend in ("triton", "reference"):
        out = gdpa(q, k, v, qo, ko, 3, 0, activation="sigmoid", backend=backend)
        assert torch.count_nonzero(out) == 0 and torch.isfinite(out).all()
        (dq,) = torch.autograd.grad(out.sum(), (q,), allow_unused=True)
        assert dq is None or torch.count_nonzero(dq) == 0


@needs_triton
def test_empty_batch() -> None:
    off = _offsets([])
    x = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    out = gdpa(x, x, x, off, off, 0, 0, causal=True, backend="triton")
    assert out.shape == (0, 2, 16)


def test_divisor_and_scale_follow_the_formula() -> None:
    # One sample, written out by hand: out_i = sum_j act(scale q_i.k_j) v_j / divisor.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 1, 8, generator=g) for n in (3, 4, 4))
    off_q, off_k = torch.tensor([0, 3]), torch.tensor([0, 4])
    out = gdpa(q, k, v, off_q, off_k, 3, 4, activation="silu", scale=0.5, divisor=2.0, backend="reference")
    s = 0.5 * q[:, 0] @ k[:, 0].T
    want = torch.nn.functional.silu(s) @ v[:, 0] / 2.0
    torch.testing.assert_close(out[:, 0], want)
    # Default divisor = max_kv_len, default scale = 1/sqrt(D).
    out = gdpa(q, k, v, off_q, off_k, 3, 10, activation="identity", backend="reference")
    torch.testing.assert_close(out[:, 0], (q[:, 0] @ k[:, 0].T / math.sqrt(8)) @ v[:, 0] / 10.0)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_table_derivatives_match_autograd(name: str) -> None:
    x = torch.randn(257, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    x = x[x.abs() > 1e-3].requires_grad_()  # relu's kink
    (auto,) = torch.autograd.grad(ACTIVATIONS[name].fn(x).sum(), (x,))
    torch.testing.assert_close(ACTIVATIONS[name].grad(x.detach()), auto)


def test_gelu_is_the_tanh_approximation() -> None:
    x = torch.linspace(-6, 6, 101)
    torch.testing.assert_close(ACTIVATIONS["gelu"].fn(x), torch.nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("backend", ["reference"] + (["triton"] if (CUDA or INTERPRET) else []))
def test_softmax_is_jagged_flash_attention(backend: str) -> None:
    g = torch.Generator(device=DEVICE).manual_seed(5)
    lq, lk = [5, 0, 9], [7, 3, 9]
    qo, ko = _offsets(lq), _offsets(lk)
    q, k, v = (torch.randn(n, 2, 16, generator=g, device=DEVICE) for n in (14, 19, 19))
    out = gdpa(q, k, v, qo, ko, 9, 9, activation="softmax", divisor=123.0, causal=True, backend=backend)
    want = jagged_flash_attention(q, k, v, qo, ko, 9, 9, causal=True, backend=backend)
    torch.testing.assert_close(out, want)
    # And independently of JFA: a per-sample masked softmax.
    rows = []
    for b in range(3):
        qb, kb, vb = q[qo[b] : qo[b + 1], 0], k[ko[b] : ko[b + 1], 0], v[ko[b] : ko[b + 1], 0]
        m = visible_mask(lq[b], lk[b], causal=True, window=None, device=DEVICE)
        s = (qb @ kb.T / 4.0).masked_fill(~m, -math.inf)
        rows.append(torch.nan_to_num(torch.softmax(s, -1)) @ vb)
    torch.testing.assert_close(out[:, 0], torch.cat(rows), atol=1e-5, rtol=1e-4)


@needs_triton
@settings(max_examples=4, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=3),
    activation=st.sampled_from(list(ACTIVATIONS)),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 8)),
    seed=st.integers(0, 2**16),
)
def test_hypothesis(
    lengths: list[tuple[int, int]], activation: str, causal: bool, window: int | None, seed: int
) -> None:
    _check([a for a, _ in lengths], [b for _, b in lengths], activation=activation, causal=causal,
           window=window, seed=seed)


@needs_triton
def test_opcheck_custom_op() -> None:
    qo, ko = _offsets([3, 0, 5]), _offsets([4, 2, 5])
    q = torch.randn(8, 1, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(11, 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(11, 1, 16, device=DEVICE, requires_grad=True)
    torch.library.opcheck(
        torch.ops.gem_kernels.gdpa_fwd.default,
        (q, k, v, qo, ko, 5, 5, "silu", 0.25, 5.0, True, None),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


@needs_triton
def test_torch_compile_fullgraph() -> None:
    qo = _offsets([3, 4])
    q = torch.randn(7, 1, 16, device=DEVICE, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return gdpa(x, x, x, qo, qo, 4, 4, activation="gelu", causal=True, backend="triton").sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    (g1,) = torch.autograd.grad(compiled(q), (q,))
    (g2,) = torch.autograd.grad(f(q), (q,))
    torch.testing.assert_close(g1, g2)


def test_tiles_short_kv_is_one_tile() -> None:
    if INTERPRET:
        pytest.skip("interpreter forces 16x16 tiles")  # only the GPU heuristic is tested here
    for kv in (4, 16, 33, 64):
        for kind in ("fwd", "dq"):
            assert gdpa_tiles(kv, 128, kind=kind).block_n >= kv


# --- bad inputs ------------------------------------------------------------------------------


def _args() -> tuple[torch.Tensor, ...]:
    x = torch.randn(5, 2, 16)
    return x, x, x, torch.tensor([0, 2, 5]), torch.tensor([0, 2, 5])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(activation="tanh"), ValueError, "activation='tanh' must be one of"),
        (dict(divisor=0.0), ValueError, "divisor=0.0 must be"),
        (dict(divisor=float("nan")), ValueError, "divisor=nan must be"),
        (dict(window=0), ValueError, "window=0 must be"),
        (dict(scale=float("inf")), ValueError, "scale=inf must be"),
        (dict(backend="cuda"), ValueError, "backend='cuda' must be one of"),
    ],
)
def test_bad_keywords(kwargs: dict[str, object], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        gdpa(*_args(), 3, 3, **kwargs)  # type: ignore[arg-type, call-arg]


@needs_triton
def test_rows_past_32_bit_offsets_are_refused() -> None:
    # The kernels address a sample's rows with 32-bit offsets; a max length whose rows could
    # pass 2**31 elements is refused before launch (the tensors here are small: only the bound
    # the caller passes is checked), naming it. The forward and the backward both check.
    q = torch.randn(5, 2, 16, device=DEVICE, requires_grad=True)
    off = torch.tensor([0, 2, 5], device=DEVICE)
    big = 2**31 // 32  # rows x row stride 32 = 2**31
    with pytest.raises(ValueError, match=r"max_kv_len=67108864 rows x row stride 32 must be < 2\*\*31"):
        gdpa(q, q, q, off, off, 3, big, backend="triton")
    with pytest.raises(ValueError, match=r"max_q_len=67108864 rows"):
        gdpa_module.gdpa_backward_triton(q.detach(), q.detach(), q.detach(), q.detach(), off, off, big, 3, "silu",
                                         0.25, 3.0, False, None)
    gdpa(q, q, q, off, off, 3, big - 1, backend="triton").sum().backward()  # just under: runs


def test_bad_tensors() -> None:
    q, k, v, qo, ko = _args()
    with pytest.raises(TypeError, match="q_offsets.dtype"):
        gdpa(q, k, v, qo.int(), ko, 3, 3)
    with pytest.raises(ValueError, match="max_q_len=2 is smaller"):
        gdpa(q, k, v, qo, ko, 2, 3)
    with pytest.raises(ValueError, match=r"k.shape=\(5, 2, 16\) and v.shape=\(4, 2, 16\)"):
        gdpa(q, k, v[:4], qo, ko, 3, 3)
    with pytest.raises(ValueError, match="must share"):
        gdpa(q, k[:, :1], v[:, :1], qo, ko, 3, 3)
    with pytest.raises(ValueError, match=r"q.shape=\(5, 2\) must be \[T, H, D\]"):
        gdpa(q[:, :, 0], k, v, qo, ko, 3, 3)
    with pytest.raises(TypeError, match="q.dtype=torch.int64"):
        gdpa(q.long(), k, v, qo, ko, 3, 3)
    with pytest.raises(ValueError, match="q_offsets\\[-1\\]=5 must equal"):
        gdpa(q[:4], k, v, qo, ko, 3, 3)
    with pytest.raises(ValueError, match="head dim D"):
        x = torch.randn(5, 2, 12)
        gdpa(x, x, x, qo, ko, 3, 3, backend="triton")


def test_activation_names_listed() -> None:
    assert set(ACTIVATION_NAMES) == {"softmax", "silu", "gelu", "relu", "relu2", "sigmoid", "identity"}


# --- GPU, real sizes -------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("activation", ["silu", "gelu", "relu2"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_real_sizes(activation: str, variant: str) -> None:
    g = torch.Generator().manual_seed(7)
    lq = torch.randint(0, 1200, (10,), generator=g).tolist() + [0, 1, 127, 128, 129]
    _check(lq, lq, activation=activation, h=4, d=128, dtype=torch.bfloat16, **VARIANTS[variant])  # type: ignore[arg-type]


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_one_pass_real_sizes(activation: str, variant: str) -> None:
    g = torch.Generator().manual_seed(8)
    lq = torch.randint(0, 1200, (10,), generator=g).tolist() + [0, 1, 127, 128, 129]
    with gdpa_module.force_tiles(**_one_pass_tiles(True, max(lq), 128)):
        _check(lq, lq, activation=activation, h=4, d=128, dtype=torch.bfloat16, **VARIANTS[variant])  # type: ignore[arg-type]


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("kv", [4, 16, 32, 64])
@pytest.mark.parametrize("variant", ["full", "causal_window"])
def test_gpu_cross_short_kv(kv: int, variant: str) -> None:
    g = torch.Generator().manual_seed(kv)
    lq = torch.randint(0, 1500, (12,), generator=g).tolist() + [0, 1, 129, 511, 512, 513]
    lk = torch.randint(0, kv + 1, (len(lq),), generator=g).tolist()
    _check(lq, lk, activation="silu", h=4, d=128, dtype=torch.bfloat16, **VARIANTS[variant])  # type: ignore[arg-type]
