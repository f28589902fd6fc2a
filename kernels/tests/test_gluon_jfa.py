"""The Gluon backward kernels (`_gluon_jfa`, `GEM_JFA_GLUON`) against the Triton kernels and the reference.

Gluon kernels run only on a Hopper GPU (no CPU interpreter): the GPU tests compare their dK,
dV and dQ with the Triton two-pass kernels' on the same inputs and, through the whole
backward, with the fp32 PyTorch reference. The CPU tests check the switch: its parsing, the reasons it
cannot serve, and that asking for it where it cannot run still gives the right gradients.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from gem_kernels import _gluon_jfa, jagged_flash_attention
from gem_kernels import _triton_jfa as tj

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] == 9
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_hopper = pytest.mark.skipif(not (HOPPER and _gluon_jfa.HAVE_GLUON), reason="Gluon kernels need a Hopper GPU")
DEVICE = "cuda" if CUDA else "cpu"


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.float().abs().max()))


def test_switch_parses_and_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, want in (("", ()), ("off", ()), ("dkdv", ("dkdv",)), (" DQ ", ("dq",)), ("fwd, dq", ("fwd", "dq")),
                        ("all", ("fwd", "dkdv", "dq"))):
        monkeypatch.setenv(_gluon_jfa.ENV, value)
        assert tuple(k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)) == want, value
    monkeypatch.delenv(_gluon_jfa.ENV)
    assert not any(_gluon_jfa.requested(k) for k in _gluon_jfa.KERNELS)
    for bad in ("gluon", "fwd,bwd"):
        monkeypatch.setenv(_gluon_jfa.ENV, bad)
        with pytest.raises(ValueError, match=f"GEM_JFA_GLUON='{bad}' must be 'all', 'off' or a comma-separated"):
            _gluon_jfa.requested("dq")


def test_use_gluon_jfa_sets_the_default_and_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    import gem_kernels

    monkeypatch.setattr(_gluon_jfa, "_default", ())  # restored after the test
    monkeypatch.delenv(_gluon_jfa.ENV, raising=False)
    assert gem_kernels.use_gluon_jfa("dkdv,dq") == ("dkdv", "dq")
    assert [k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)] == ["dkdv", "dq"]
    monkeypatch.setenv(_gluon_jfa.ENV, "off")  # set: the variable decides
    assert not any(_gluon_jfa.requested(k) for k in _gluon_jfa.KERNELS)
    assert gem_kernels.use_gluon_jfa("all") == ()  # and use_gluon_jfa says so
    gem_kernels.use_gluon_jfa("dkdv,dq")
    monkeypatch.setenv(_gluon_jfa.ENV, "fwd")
    assert [k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)] == ["fwd"]
    monkeypatch.setenv(_gluon_jfa.ENV, "")  # empty: as unset
    assert [k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)] == ["dkdv", "dq"]
    with pytest.raises(ValueError, match=r"use_gluon_jfa\(value\)='dkdv,bwd' must be 'all', 'off' or a comma"):
        gem_kernels.use_gluon_jfa("dkdv,bwd")
    assert [k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)] == ["dkdv", "dq"]  # a bad value changes nothing
    gem_kernels.use_gluon_jfa("off")
    assert not any(_gluon_jfa.requested(k) for k in _gluon_jfa.KERNELS)


def test_problem_names_why_it_cannot_serve() -> None:
    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16, device=DEVICE)
    if not (HOPPER and _gluon_jfa.HAVE_GLUON and not INTERPRET):
        assert _gluon_jfa.problem(q, q, None, False) is not None
        return
    assert _gluon_jfa.problem(q, q, None, False) is None
    assert "window" in str(_gluon_jfa.problem(q, q, 8, False))
    assert "one-pass" in str(_gluon_jfa.problem(q, q, None, True))
    assert _gluon_jfa.problem(q, q, None) is None  # the forward's question
    assert "dtype" in str(_gluon_jfa.problem(q.float(), q.float(), None, False))
    assert "head dim" in str(_gluon_jfa.problem(q[..., :32], q[..., :32], None, False))


def test_tiles_past_an_sms_shared_memory_are_refused_before_launch() -> None:
    # dQ 128x128 w8 s3: 2 x 128 x (2 x 128 + 2 x 3 x 128) = 262,144 bytes at D=128, over 227 KB.
    q = torch.zeros(300, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(300, 2)
    offsets = torch.tensor([0, 100, 300])
    args = (q, q, q, q, lse, lse, q.clone(), offsets, offsets, 200, True, 0.1)
    with pytest.raises(ValueError, match=r"tiles=\(128, 128, 8, 3, True\): need 262144 bytes of shared memory .*227 KB"):
        _gluon_jfa.dq(*args, tiles=(128, 128, 8, 3, True))
    with pytest.raises(ValueError, match=r"tiles=\(128, 128, 8, 4\): need 294912 bytes"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(128, 128, 8, 4))
    # The warp-specialized forward's shape rule (two consumer warpgroups of 64 rows, a loader).
    with pytest.raises(ValueError, match=r"tiles=\(64, 64, 12, 3, True\): the warp-specialized forward needs "
                                         r"BLOCK_M 128 .* num_warps 12"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(64, 64, 12, 3, True))
    with pytest.raises(ValueError, match=r"num_warps 12"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(128, 64, 8, 3, True))
    with pytest.raises(ValueError, match=r"STAGES >= 2"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(128, 64, 12, 1, True))
    # The persistent kernel double-buffers q: 3 slots of 128 keys no longer fit.
    with pytest.raises(ValueError, match=r"need 262144 bytes"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(128, 128, 12, 3, True, False, True))
    with pytest.raises(ValueError, match=r"the persistent forward is the warp-specialized one"):
        _gluon_jfa.forward(q, q, q, offsets, offsets, 200, True, 0.1, tiles=(128, 128, 8, 3, False, False, True))
    assert q.abs().max() == 0 and lse.abs().max() == 0  # nothing written
    # Every tile set the GPU tests run (and the defaults) fits at D=128.
    for tiles, by_m, resident in ([*TILES, _gluon_jfa.DEFAULT_TILES], False, 2), \
            ([*DQ_TILES, _gluon_jfa.DEFAULT_DQ_TILES], True, 2), ([*FWD_TILES, *WS_TILES, _gluon_jfa.DEFAULT_FWD_TILES], True, 1):
        for t in tiles:
            persistent = len(t) > 6 and bool(t[6])  # (two q tiles resident)
            assert _gluon_jfa.smem_bytes(t, by_m, 128, 2 if persistent else resident) <= _gluon_jfa.SMEM_LIMIT, t


@pytest.mark.skipif(not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)")
@pytest.mark.parametrize("causal", [False, True])
def test_asking_for_gluon_keeps_gradients_right_everywhere(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # On the CPU (interpreter) the switch falls back to the Triton kernel; on a Hopper GPU the
    # Gluon kernel runs. Either way the gradients match the fp32 reference.
    monkeypatch.setenv(_gluon_jfa.ENV, "all")
    monkeypatch.setenv("GEM_JFA_BWD", "two_pass")
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")
    lengths = [37, 0, 1, 64, 20] if not CUDA else [300, 0, 1, 64, 129, 1000]
    h, d = 2, (16 if not CUDA else 128)
    dtype = torch.float32 if not CUDA else torch.bfloat16
    _check_against_reference(lengths, lengths, h, d, dtype, causal, seed=3)


def _check_against_reference(lq: list[int], lk: list[int], h: int, d: int, dtype: torch.dtype, causal: bool,
                             seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)

    def rnd(t: int) -> torch.Tensor:
        return torch.randn(t, h, d, generator=g, device=DEVICE).to(dtype).requires_grad_()

    q, k, v = rnd(sum(lq)), rnd(sum(lk)), rnd(sum(lk))
    out = jagged_flash_attention(q, k, v, qo, ko, max(lq), max(lk), causal=causal, backend="triton")
    dout = torch.randn(out.shape, generator=g, device=DEVICE).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = jagged_flash_attention(q32, k32, v32, qo, ko, max(lq), max(lk), causal=causal, backend="reference")
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    tol = 5e-5 if dtype == torch.float32 else 2e-2
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        err = _rel_err(got, want)
        assert err <= tol, f"{name}: max error {err:.3g} (relative to max |ref|) > {tol}"
    return grads


def _both_kernels(lq: list[int], lk: list[int], h: int, d: int, causal: bool, seed: int,
                  tiles: tuple[int, int, int, int, bool] | None = None,
                  dq_tiles: tuple[int, int, int, int, bool] | None = None,
                  poison: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
    """dK, dV, dQ of the Gluon kernels and of the Triton two-pass kernels on the same inputs (bf16):
    (dk, dv, dq, dk_t, dv_t, dq_t). `tiles` go to the kernel under test (`dq_tiles`: dQ's)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)
    q, k, v, = (torch.randn(t, h, d, generator=g, device=DEVICE).bfloat16() for t in (sum(lq), sum(lk), sum(lk)))
    scale = 1.0 / math.sqrt(d)
    out, lse = tj.jfa_forward(q, k, v, qo, ko, max(lq), max(lk), causal, None, scale)
    dout = torch.randn(out.shape, generator=g, device=DEVICE).bfloat16()
    if poison is not None:  # rows [a, b) of q and dO (another sample's) turn NaN after the forward
        q[poison[0]:poison[1]] = float("nan")
        dout[poison[0]:poison[1]] = float("nan")
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    _gluon_jfa.dkdv(q, k, v, dout, lse, delta, dk, dv, qo, ko, max(lk), causal, scale, tiles)
    dq = torch.full_like(q, float("nan"))
    _gluon_jfa.dq(q, k, v, dout, lse, delta, dq, qo, ko, max(lq), causal, scale, dq_tiles)
    two_pass = dataclasses.replace(tj.pick_config(max(lq), max(lk), d, q.dtype), one_pass=False)
    with tj.force_config(two_pass):  # the Triton kernels (GEM_JFA_GLUON is unset here)
        dq_t, dk_t, dv_t = tj.jfa_backward(dout, q, k, v, out, lse, qo, ko, max(lq), max(lk), causal, None, scale)
    return dk, dv, dq, dk_t, dv_t, dq_t


TILES = [(32, 128, 8, 4, True), (32, 128, 8, 3, False), (32, 64, 4, 4, True), (64, 128, 8, 4, True)]
# (dQ 128x128 w8 s3 would need 256 KB of shared memory, more than an SM has: not a tile set to test.)
# The defaults (dK/dV 32x64 w4 s4, dQ 128x64 w8 s3) are among them; the whole-backward test
# below runs the defaults too.
DQ_TILES = [(128, 64, 8, 3, True), (128, 32, 8, 3, False), (64, 64, 4, 4, True), (64, 32, 4, 4, True)]


@needs_hopper
@pytest.mark.parametrize("tiles", range(len(TILES)), ids=lambda i: "x".join(map(str, TILES[i])))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_matches_triton_kernels(tiles: int, causal: bool, d: int) -> None:
    g = torch.Generator().manual_seed(d + causal)
    lengths = torch.randint(0, 1500, (10,), generator=g).tolist() + [0, 1, 31, 32, 33, 127, 128, 129]
    got = _both_kernels(lengths, lengths, 4, d, causal, seed=d, tiles=TILES[tiles], dq_tiles=DQ_TILES[tiles])
    for name, mine, theirs in zip(("dk", "dv", "dq"), got[:3], got[3:]):
        assert torch.isfinite(mine).all(), name  # every row written (the buffers started NaN)
        err = _rel_err(mine, theirs)
        assert err <= 1e-2, f"{name}: {err:.3g}"


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_cross_attention_and_empty_sides(causal: bool) -> None:
    lq = [0, 5, 700, 64, 1, 300, 0]
    lk = [9, 0, 650, 200, 129, 40, 3]  # rows of a sample whose other side is empty get 0
    got = _both_kernels(lq, lk, 2, 128, causal, seed=5)
    for mine, theirs in zip(got[:3], got[3:]):
        assert torch.isfinite(mine).all()
        assert _rel_err(mine, theirs) <= 1e-2
    dk, dv, dq = got[:3]
    assert dk[:9].abs().max() == 0 and dv[:9].abs().max() == 0  # sample 0 has no queries
    assert dq[0:5].abs().max() == 0  # sample 1 has no keys


FWD_TILES: list[tuple[int | bool, ...]] = [(128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)]
# The warp-specialized forward (two consumer warpgroups and a loader): 3 and 2 K/V slots of 128
# keys, 4 of 64; the consumers taking turns (ping-pong) at 128 and 64 keys; the persistent kernel
# (a seventh field) at 2 x 128 with ping-pong and 4 x 64 without.
WS_TILES: list[tuple[int | bool, ...]] = [(128, 128, 12, 3, True), (128, 128, 12, 2, True), (128, 64, 12, 4, True),
                                          (128, 128, 12, 3, True, True), (128, 64, 12, 4, True, True),
                                          (128, 128, 12, 2, True, True, True), (128, 64, 12, 4, True, False, True)]


def _both_forwards(lq: list[int], lk: list[int], h: int, d: int, causal: bool, seed: int,
                   tiles: tuple[int | bool, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """(out, lse2) of the Gluon forward and of the Triton forward on the same bf16 inputs."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)
    q, k, v = (torch.randn(t, h, d, generator=g, device=DEVICE).bfloat16() for t in (sum(lq), sum(lk), sum(lk)))
    scale = 1.0 / math.sqrt(d)
    out, lse = _gluon_jfa.forward(q, k, v, qo, ko, max(lq), causal, scale, tiles)
    out_t, lse_t = tj.jfa_forward(q, k, v, qo, ko, max(lq), max(lk), causal, None, scale)
    return out, lse, out_t, lse_t


def _forwards_agree(out: torch.Tensor, lse: torch.Tensor, out_t: torch.Tensor, lse_t: torch.Tensor) -> None:
    assert torch.isfinite(out).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))  # the same (row, head)s see no key: +inf
    seen = torch.isfinite(lse_t)
    if seen.any():
        assert float((lse - lse_t)[seen].abs().max()) <= 1e-3
    if (~seen).any():
        assert out[~seen].abs().max() == 0  # and their output is 0
    assert _rel_err(out, out_t) <= 1e-2


@needs_hopper
@pytest.mark.parametrize("tiles", FWD_TILES + WS_TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_forward_matches_triton_kernel(tiles: tuple[int | bool, ...], causal: bool, d: int) -> None:
    g = torch.Generator().manual_seed(d + 2 * causal)
    lengths = torch.randint(0, 1500, (10,), generator=g).tolist() + [0, 1, 63, 64, 65, 127, 128, 129]
    _forwards_agree(*_both_forwards(lengths, lengths, 4, d, causal, seed=d, tiles=tiles))


@needs_hopper
@pytest.mark.parametrize("tiles", [None, WS_TILES[0], WS_TILES[3], WS_TILES[5]],
                         ids=["default", "ws", "ws-pingpong", "ws-persistent"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_cross_attention_and_empty_sides(causal: bool, tiles: tuple[int | bool, ...] | None) -> None:
    # More queries than keys (causal: the first rows see no key), fewer, and empty sides.
    lq = [0, 5, 700, 64, 300, 129, 7]
    lk = [9, 0, 650, 200, 40, 129, 0]
    out, lse, out_t, lse_t = _both_forwards(lq, lk, 2, 128, causal, seed=5, tiles=tiles)
    _forwards_agree(out, lse, out_t, lse_t)
    assert torch.isinf(lse[0:5]).all() and out[0:5].abs().max() == 0  # sample 1 has no keys


@needs_hopper
def test_gpu_nan_neighbour_does_not_leak() -> None:
    # Sample 1's q and dO are NaN: sample 0's last tiles read past its end (masked, zero-filled),
    # so its dK/dV/dQ stay finite and equal to the run without the NaN.
    lq = [100, 300]
    clean = _both_kernels(lq, lq, 2, 128, False, seed=7)
    dirty = _both_kernels(lq, lq, 2, 128, False, seed=7, poison=(100, 400))
    for got, want in zip(dirty[:3], clean[:3]):
        assert torch.isfinite(got[:100]).all()
        assert torch.equal(got[:100], want[:100])
    # The forward: sample 1's keys and values NaN; sample 0's rows read past its end (masked).
    g = torch.Generator(device=DEVICE).manual_seed(8)
    q, k, v = (torch.randn(400, 2, 128, generator=g, device=DEVICE).bfloat16() for _ in range(3))
    off = _offsets(lq)
    for tiles in (None, WS_TILES[0], WS_TILES[3], WS_TILES[5]):
        kk, vv = k.clone(), v.clone()
        clean_f = _gluon_jfa.forward(q, kk, vv, off, off, 300, False, 0.1, tiles)
        kk[100:], vv[100:] = float("nan"), float("nan")
        dirty_f = _gluon_jfa.forward(q, kk, vv, off, off, 300, False, 0.1, tiles)
        for got, want in zip(dirty_f, clean_f):
            assert torch.isfinite(got[:100]).all() and torch.equal(got[:100], want[:100]), tiles


def _count_calls(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    """Wraps each `_gluon_jfa.<name>` launcher so every call is recorded (by name) in the list
    returned, then runs the real one."""
    calls: list[str] = []
    for name in names:
        real = getattr(_gluon_jfa, name)

        def counted(*a: object, _real: object = real, _name: str = name, **kw: object) -> object:
            calls.append(_name)
            return _real(*a, **kw)  # type: ignore[operator]

        monkeypatch.setattr(_gluon_jfa, name, counted)
    return calls


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_whole_backward_with_the_switch(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_JFA_BWD", "two_pass")
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")
    monkeypatch.setenv(_gluon_jfa.ENV, "all")
    calls = _count_calls(monkeypatch, "forward", "dkdv", "dq")
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(0, 2500, (12,), generator=g).tolist() + [0, 1, 128]
    _check_against_reference(lengths, lengths, 4, 128, torch.bfloat16, causal, seed=11)
    assert sorted(set(calls)) == ["dkdv", "dq", "forward"], f"the Gluon kernels that ran: {calls}"


@needs_hopper
@pytest.mark.parametrize("tiles", [None, WS_TILES[3], WS_TILES[5]], ids=["default", "ws-pingpong", "ws-persistent"])
def test_gpu_eager_plan_launches_the_gluon_forward(tiles: tuple[int | bool, ...] | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # With the switch naming fwd, the first eager call runs `_gluon_jfa.forward` and keeps a plan
    # holding its binary; later calls with the signature launch it directly (no second
    # `forward`), bitwise equal to `forward` itself on the same inputs, with and without gradients.
    from gem_kernels import _jfa

    monkeypatch.setenv("GEM_JFA_FWD", "pointer")
    monkeypatch.setenv(_gluon_jfa.ENV, "fwd")
    monkeypatch.setattr(_jfa, "_PLANS", {})
    if tiles is not None:
        monkeypatch.setattr(_gluon_jfa, "DEFAULT_FWD_TILES", tiles)
    real = _gluon_jfa.forward
    calls = _count_calls(monkeypatch, "forward")
    g = torch.Generator().manual_seed(21)
    lengths = torch.randint(1, 1500, (9,), generator=g).tolist()
    off, mx = _offsets(lengths), max(lengths)
    for seed in range(3):
        gg = torch.Generator(device=DEVICE).manual_seed(seed)
        q, k, v = (torch.randn(sum(lengths), 4, 128, generator=gg, device=DEVICE).bfloat16() for _ in range(3))
        out = jagged_flash_attention(q, k, v, off, off, mx, mx, causal=True)
        want, _ = real(q, k, v, off, off, mx, True, 1.0 / math.sqrt(128), tiles)
        assert torch.equal(out, want), seed
    assert len(calls) == 1, "later calls did not take the plan"
    plan = next(iter(_jfa._PLANS.values()))
    assert plan.op.gluon is not None
    # Through autograd too: the planned forward, then the backward (Triton's, the switch names fwd only).
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = jagged_flash_attention(qg, kg, vg, off, off, mx, mx, causal=True)
    assert torch.equal(out.detach(), want) and len(calls) == 1
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), torch.randn_like(out))
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_eager_backward_plan_launches_the_gluon_kernels(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # With the switch naming dkdv,dq, the first eager backward runs `_gluon_jfa.dkdv` / `dq` and
    # its forward's plan keeps their binaries; the next backward with the signature launches them
    # directly, bitwise equal to the first on the same inputs (no atomics in either kernel).
    from gem_kernels import _jfa

    monkeypatch.setenv("GEM_JFA_BWD", "two_pass")
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")
    monkeypatch.setenv(_gluon_jfa.ENV, "dkdv,dq")
    monkeypatch.setattr(_jfa, "_PLANS", {})
    calls = _count_calls(monkeypatch, "dkdv", "dq")
    g = torch.Generator().manual_seed(23)
    lengths = torch.randint(1, 1500, (9,), generator=g).tolist()
    off, mx = _offsets(lengths), max(lengths)
    gg = torch.Generator(device=DEVICE).manual_seed(4)
    q, k, v, dout = (torch.randn(sum(lengths), 4, 128, generator=gg, device=DEVICE).bfloat16() for _ in range(4))
    grads = []
    for _ in range(3):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = jagged_flash_attention(*xs, off, off, mx, mx, causal=causal)
        grads.append(torch.autograd.grad(out, xs, dout))
    assert sorted(calls) == ["dkdv", "dq"], f"the ordinary Gluon launches: {calls} (later backwards: the plan)"
    bwd = next(iter(_jfa._PLANS.values())).op.bwd
    assert any(p.gluon_dkdv and p.gluon_dq for p in bwd.values())
    for later in grads[1:]:
        for got, want in zip(later, grads[0]):
            assert torch.equal(got, want)
    # And right: the planned backward's gradients against the fp32 reference.
    x32 = [x.float().requires_grad_() for x in (q, k, v)]
    ref = jagged_flash_attention(*x32, off, off, mx, mx, causal=causal, backend="reference")
    for got, want in zip(grads[2], torch.autograd.grad(ref, x32, dout.float())):
        assert _rel_err(got, want) <= 2e-2
