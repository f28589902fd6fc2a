"""The one-pass JFA backward (`JfaConfig.one_pass`, `GEM_JFA_BWD=one_pass`) vs the reference and
the two-pass backward.

One pass: the dK/dV kernel also adds dS·K into an fp32 dQ workspace with atomics, so its dQ
is a sum in a different order than the two-pass dQ kernel's (and dK/dV too: each kv block
walks its q blocks from a rotated start); everything else is the same arithmetic. CPU:
Triton's interpreter with 16×16 tiles on lengths that hit the tile edges (0, 1, 15, 16, 17,
33), fresh random inputs per test. GPU (skipped without CUDA): 64 log-normal lengths up to
4,096, H=8, D=128, bf16, with the heuristic tiles.

Hopper TMA (`JfaConfig.tma`: dQ by TMA bulk reduce; `tma_loads`: q/dO through tensor
descriptors): the interpreter has no descriptor reduce, so there `tma` runs the atomic path
(checked: the host picks DQ_TMA=False) while `tma_loads` runs the descriptor loads (the
interpreter emulates them); the SM90 GPU test runs both for real and finds the bulk reduce in
the compiled kernel's PTX.
"""

import contextlib
import dataclasses
import os
import re
from typing import Any

import pytest
import torch

from gem_kernels import jagged_flash_attention
from gem_kernels import _triton_jfa
from gem_kernels._triton_jfa import (BWD_ENV, ONE_PASS_DEFAULT, ONE_PASS_MAX_Q_LEN, JfaConfig, JfaTiles,
                                     bwd_one_pass_from_env, force_config, pick_config)

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"

_T16 = JfaTiles(block_m=16, block_n=16)
TWO = JfaConfig(fwd=_T16, dkdv=_T16, dq=_T16)
ONE = dataclasses.replace(TWO, one_pass=True)
TMA = dataclasses.replace(ONE, tma=True)
TMA_LOADS = dataclasses.replace(ONE, tma=True, tma_loads=True)
HOPPER = CUDA and not INTERPRET and torch.cuda.get_device_capability()[0] >= 9
# Max gradient error relative to max(1, max |want|): vs the fp32 reference, and one-pass vs
# two-pass (both Triton: only dQ's summation order differs, plus the final rounding to dtype).
TOL = {
    torch.float32: {"ref": 5e-5, "two": 1e-5},
    torch.bfloat16: {"ref": 2e-2, "two": 1e-2},
    torch.float16: {"ref": 4e-3, "two": 2e-3},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "full": dict(causal=False, window=None),
    "causal": dict(causal=True, window=None),
    "causal_window": dict(causal=True, window=5),
    "band": dict(causal=False, window=3),
}
EDGE_Q = [17, 0, 1, 16, 15, 33]
EDGE_K = [33, 15, 16, 0, 3, 17]  # cross: longer and shorter kv than q, empty on either side


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    if want.numel() == 0:
        return 0.0
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.float().abs().max()))


def _grads(cfg: JfaConfig | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
           qo: torch.Tensor, ko: torch.Tensor, *, backend: str = "triton", causal: bool = False,
           window: int | None = None) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of one call; q, k, v keep their strides (detach() is a view)."""
    mq, mk = int((qo[1:] - qo[:-1]).max()), int((ko[1:] - ko[:-1]).max())
    xq, xk, xv = (x.detach().requires_grad_() for x in (q, k, v))
    # The config must hold for the backward too: pick_config runs again inside it.
    with force_config(cfg) if cfg is not None else contextlib.nullcontext():
        out = jagged_flash_attention(xq, xk, xv, qo, ko, mq, mk, causal=causal, window=window, backend=backend)
        return [out.detach(), *torch.autograd.grad(out, (xq, xk, xv), dout)]


def _compare(lq: list[int], lk: list[int], *, dtype: torch.dtype = torch.float32, d: int = 16, h: int = 2,
             one: JfaConfig = ONE, two: JfaConfig = TWO, seed: int = 0, **vis: Any) -> None:
    """One-pass grads vs the fp32 reference (on the same rounded inputs) and vs two-pass."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qo, ko = _offsets(lq), _offsets(lk)
    q, k, v = (torch.randn(sum(n), h, d, generator=g, device=DEVICE).to(dtype) for n in (lq, lk, lk))
    dout = torch.randn(sum(lq), h, d, generator=g, device=DEVICE).to(dtype)
    got = _grads(one, q, k, v, dout, qo, ko, **vis)
    base = _grads(two, q, k, v, dout, qo, ko, **vis)
    ref = _grads(None, q.float(), k.float(), v.float(), dout.float(), qo, ko, backend="reference", **vis)
    for name, a, b, r in zip(("out", "dq", "dk", "dv"), got, base, ref):
        assert a.dtype == dtype and a.shape == r.shape, name
        assert torch.isfinite(a).all(), name
        assert _rel(a, r) <= TOL[dtype]["ref"], f"{name}: one-pass vs reference {_rel(a, r):.3g}"
        assert _rel(a, b) <= TOL[dtype]["two"], f"{name}: one-pass vs two-pass {_rel(a, b):.3g}"
    if dtype == torch.float32:  # dk/dv: the same arithmetic (one-pass walks the q blocks rotated)
        torch.testing.assert_close(got[2], base[2], atol=1e-6, rtol=1e-6)


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_self_attention_fp32(variant: str) -> None:
    _compare(EDGE_Q, EDGE_Q, seed=1, **VARIANTS[variant])


@needs_triton
@pytest.mark.parametrize("variant", ["full", "causal", "causal_window"])
def test_cross_and_empty_sequences_fp32(variant: str) -> None:
    # Separate q/kv offsets, bottom-right alignment both ways, empty q and empty kv samples.
    _compare(EDGE_Q, EDGE_K, seed=2, **VARIANTS[variant])


@needs_triton
@pytest.mark.parametrize("dtype,variant", [(torch.bfloat16, "full"), (torch.bfloat16, "causal"),
                                           (torch.float16, "causal")])
def test_low_precision(dtype: torch.dtype, variant: str) -> None:
    _compare(EDGE_Q, EDGE_Q, dtype=dtype, d=32, seed=3, **VARIANTS[variant])


@needs_triton
def test_bf16_cross_window() -> None:
    _compare(EDGE_Q, EDGE_K, dtype=torch.bfloat16, d=64, seed=4, causal=True, window=20)


@needs_triton
@pytest.mark.parametrize("d,variant", [(128, "causal"), (32, "band")])
def test_head_dims(d: int, variant: str) -> None:
    _compare([17, 1, 33], [17, 1, 33], d=d, h=1, seed=5, **VARIANTS[variant])


@needs_triton
@pytest.mark.parametrize("schedule", ["list", "grid", "in_order", "in_order_rev"])
def test_tile_list_schedule(schedule: str) -> None:
    # Long-tailed batch: the heaviest-first tile list, the plain grid and batch order (q-side
    # tiles first to last or last to first), one-pass vs both.
    batch = schedule.startswith("in_order")
    one, two = (dataclasses.replace(c, tile_list=schedule == "list", in_order=batch, fwd_in_order=batch,
                                    reverse_q=schedule == "in_order_rev") for c in (ONE, TWO))
    _compare([40, 0, 3, 17, 1, 16], [33, 5, 0, 17, 40, 16], one=one, two=two, seed=6, causal=True, window=20)


@needs_triton
def test_wider_tiles_mixed_blocks() -> None:
    # BLOCK_M != BLOCK_N and a band wider than a tile: unmasked interior q blocks take the
    # atomic add without the row mask; the masked edges with it.
    one = dataclasses.replace(ONE, dkdv=JfaTiles(block_m=16, block_n=32))
    _compare([50, 33, 64], [50, 40, 64], one=one, seed=7, causal=False, window=40)


@needs_triton
@pytest.mark.parametrize("variant", ["full", "causal", "band"])
def test_rotated_q_walk_wraps_around(variant: str) -> None:
    # Many q blocks per sequence (up to 10 with 16-row blocks, lengths off the tile edges): each
    # kv block starts its full q blocks at a different, evenly spread index and wraps around, so
    # the walk crosses [rot, f_hi) -> masked edges -> [f_lo, rot); kv 16 and 32 wide.
    lq = [150, 97, 5]
    for bn in (16, 32):
        one = dataclasses.replace(ONE, dkdv=JfaTiles(block_m=16, block_n=bn))
        vis = dict(VARIANTS[variant], window=40) if variant == "band" else VARIANTS[variant]
        _compare(lq, lq, one=one, h=1, seed=10 + bn, **vis)


def _fused_qkv(seed: int) -> tuple[list[int], torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """Lengths [17, 0, 33, 16], their offsets, q/k/v as views of one fused [T, 3, H=2, D=16]
    projection (last dim contiguous) and dout, drawn from `seed`."""
    lq = [17, 0, 33, 16]
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(sum(lq), 3, 2, 16, generator=g, device=DEVICE)
    dout = torch.randn(sum(lq), 2, 16, generator=g, device=DEVICE)
    return lq, _offsets(lq), qkv.unbind(1), dout


@needs_triton
def test_strided_qkv_views() -> None:
    # q, k, v as views of one fused [T, 3, H, D] projection (last dim contiguous).
    lq, qo, (q, k, v), dout = _fused_qkv(8)
    assert not q.is_contiguous() and q.stride(2) == 1
    strided = _grads(ONE, q, k, v, dout, qo, qo, causal=True)
    dense = _grads(ONE, q.contiguous(), k.contiguous(), v.contiguous(), dout, qo, qo, causal=True)
    for a, b in zip(strided, dense):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@needs_triton
def test_no_visible_key_gives_zero_dq() -> None:
    # Every kv empty: no kv block exists, so no atomic reaches dQ; the zeroed workspace is the answer.
    qo, ko = _offsets([3, 2]), _offsets([0, 1])
    q = torch.randn(5, 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 2, 16, device=DEVICE, requires_grad=True)
    with force_config(ONE):
        out = jagged_flash_attention(q, k, v, qo, ko, 3, 1, causal=True, backend="triton")
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.count_nonzero(dq[:3]) == 0  # sample 0 has no keys
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_config_and_env_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BWD_ENV, raising=False)
    assert not bwd_one_pass_from_env()  # query length not known: two-pass
    # the default rule: one-pass where every query sequence has at most ONE_PASS_MAX_Q_LEN rows
    # (pooling seeds over long key sequences), two-pass above it whatever the keys' length, and
    # whenever torch's deterministic algorithms are on (one-pass's dQ atomics are order-dependent)
    assert ONE_PASS_DEFAULT and ONE_PASS_MAX_Q_LEN >= 12  # the h200 model's last-layer query slots
    assert not pick_config(2048, 2048, 128, torch.bfloat16).one_pass
    assert not pick_config(13613, 13613, 128, torch.bfloat16).one_pass  # long self-attention: two-pass
    assert pick_config(ONE_PASS_MAX_Q_LEN, 13613, 128, torch.bfloat16).one_pass
    assert not pick_config(ONE_PASS_MAX_Q_LEN + 1, 13613, 128, torch.bfloat16).one_pass
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not pick_config(32, 13613, 128, torch.bfloat16).one_pass
        monkeypatch.setenv(BWD_ENV, "one_pass")  # an explicit choice wins over determinism
        assert pick_config(13613, 13613, 128, torch.bfloat16).one_pass
        monkeypatch.delenv(BWD_ENV)
    finally:
        torch.use_deterministic_algorithms(was)
    assert pick_config(32, 13613, 128, torch.bfloat16).one_pass
    monkeypatch.setenv(BWD_ENV, "one_pass")
    cfg = pick_config(2048, 2048, 128, torch.bfloat16)
    assert cfg.one_pass and (cfg.dkdv.block_m, cfg.dkdv.block_n, cfg.dkdv.num_warps) == (32, 128, 8)
    with force_config(TWO):  # a forced config is used as is, whatever the environment says
        assert not pick_config(2048, 2048, 128, torch.bfloat16).one_pass
    monkeypatch.setenv(BWD_ENV, "two_pass")
    assert not pick_config(2048, 2048, 128, torch.bfloat16).one_pass
    with force_config(ONE):
        assert pick_config(2048, 2048, 128, torch.bfloat16).one_pass
    monkeypatch.setenv(BWD_ENV, "fused")
    with pytest.raises(ValueError, match="GEM_JFA_BWD='fused' must be one of"):
        pick_config(2048, 2048, 128, torch.bfloat16)


class _Forbidden:
    arg_names: list[str] = []  # (the launchers wrap kernels in a CachedLaunch, which reads them)

    def __getitem__(self, grid: object) -> object:
        raise AssertionError("the two-pass dQ kernel ran under GEM_JFA_BWD=one_pass")


@needs_triton
def test_env_switches_the_heuristic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BWD_ENV, "one_pass")
    monkeypatch.setattr(_triton_jfa, "_jfa_bwd_dq_kernel", _Forbidden())
    lq = [9, 0, 20]
    qo = _offsets(lq)
    q, k, v = (torch.randn(sum(lq), 1, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = jagged_flash_attention(q, k, v, qo, qo, 20, 20, causal=True, backend="triton")
    got = torch.autograd.grad(out.sum(), (q, k, v))
    ref = jagged_flash_attention(q, k, v, qo, qo, 20, 20, causal=True, backend="reference")
    want = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


class _Spy:
    """Stands in for `_jfa_bwd_dkdv_kernel`: launches it and records (kwargs, compiled kernel)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.arg_names = kernel.arg_names  # (the launchers' CachedLaunch reads them)
        self.launches: list[tuple[dict[str, Any], Any]] = []

    def __getitem__(self, grid: object) -> Any:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            compiled = launch(*args, **kwargs)
            self.launches.append((kwargs, compiled))
            return compiled
        return run


@needs_triton
@pytest.mark.parametrize("name,variant", [("tma", "full"), ("tma", "causal"), ("tma+loads", "full"),
                                          ("tma+loads", "causal"), ("tma+loads", "causal_window")])
def test_tma_configs_match_reference_and_two_pass(name: str, variant: str) -> None:
    # Cross offsets with empty q and kv samples; lengths off the 16-row tile edges, so masked
    # q tiles read rows of the next sample through the descriptors (zeroed in the kernel).
    _compare(EDGE_Q, EDGE_K, one=TMA if name == "tma" else TMA_LOADS, seed=20, **VARIANTS[variant])


@needs_triton
def test_tma_loads_bf16_rotated_wide_tiles() -> None:
    one = dataclasses.replace(TMA_LOADS, dkdv=JfaTiles(block_m=16, block_n=32))
    _compare([50, 0, 33, 64], [50, 0, 33, 64], dtype=torch.bfloat16, d=32, one=one, seed=21, causal=True)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's fallback (TRITON_INTERPRET=1)")
def test_tma_host_choice_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(_triton_jfa._jfa_bwd_dkdv_kernel)
    monkeypatch.setattr(_triton_jfa, "_jfa_bwd_dkdv_kernel", spy)
    lq = [9, 0, 20]
    qo = _offsets(lq)
    q, k, v, dout = (torch.randn(sum(lq), 2, 16, device=DEVICE) for _ in range(4))
    for cfg in (TMA, TMA_LOADS, dataclasses.replace(TWO, tma=True, tma_loads=True)):
        _grads(cfg, q, k, v, dout, qo, qo, causal=True)
    # No descriptor reduce in the interpreter: `tma` runs the atomic path; loads go through
    # descriptors; the two-pass backward ignores both flags.
    got = [(kw["DQ_ATOMIC"], kw["DQ_TMA"], kw["TMA_LOADS"]) for kw, _ in spy.launches]
    assert got == [(True, False, False), (True, False, True), (False, False, False)]
    # TMA's rules for the 2-D [T, H*D] views: a fused projection's q passes; a view whose
    # heads are not adjacent, or whose base or row stride is not 16-byte aligned, does not.
    qkv = torch.randn(8, 3, 2, 16)
    assert _triton_jfa._tma_modes(TMA_LOADS, qkv[:, 0], qkv[:, 1], q) == (False, True)
    odd_base = torch.randn(8 * 2 * 16 + 1)[1:].view(8, 2, 16)  # contiguous, base 4 bytes off
    odd_rows = torch.randn(8, 33)[:, :32].view(8, 2, 16)  # row stride 33 floats = 132 bytes
    heads_apart = torch.randn(8, 2, 32)[:, :, :16]  # stride(1) = 32 != D
    last_strided = torch.randn(8, 16, 2).transpose(1, 2)  # stride(2) = 2
    for bad in (odd_base, odd_rows, heads_apart, last_strided):
        assert _triton_jfa._tma_modes(TMA_LOADS, bad, qkv[:, 1], q) == (False, False)
    assert not _triton_jfa._tma_view_ok(torch.randn(8, 2, 2))  # a row of a head is 8 bytes < 16


@needs_triton
def test_tma_loads_strided_and_fallback_views() -> None:
    # q, k, v as views of one fused [T, 3, H, D] projection: q's descriptor has row stride 3·H·D;
    # and a q whose base is not 16-byte aligned takes the pointer loads: all equal the dense run.
    lq, qo, (q, k, v), dout = _fused_qkv(22)
    odd = torch.empty(sum(lq) * 2 * 16 + 1, device=DEVICE)[1:].view(sum(lq), 2, 16)  # base 4 bytes off
    odd.copy_(q)
    assert _triton_jfa._tma_modes(TMA_LOADS, q, dout, dout)[1] == (INTERPRET or HOPPER)
    assert not _triton_jfa._tma_modes(TMA_LOADS, odd, dout, dout)[1]
    dense = _grads(ONE, q.contiguous(), k.contiguous(), v.contiguous(), dout, qo, qo, causal=True)
    for qv in (q, odd):
        got = _grads(TMA_LOADS, qv, k, v, dout, qo, qo, causal=True)
        for a, b in zip(got, dense):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def _trainer_like_lengths(n: int = 64, cap: int = 4096) -> list[int]:
    g = torch.Generator().manual_seed(62)
    x = torch.exp(torch.randn(n, generator=g, dtype=torch.float64) + 6.5)  # LogNormal(6.5, 1.0)
    return [int(v) for v in x.clamp(64, cap).long().tolist()]


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("variant", ["full", "causal"])
def test_gpu_real_size_one_pass(variant: str) -> None:
    lengths = _trainer_like_lengths()
    vis = VARIANTS[variant]
    h, d, mx = 8, 128, max(lengths)
    one = _triton_jfa._heuristic_config(mx, mx, d, torch.bfloat16, True)
    two = _triton_jfa._heuristic_config(mx, mx, d, torch.bfloat16, False)
    g = torch.Generator(device=DEVICE).manual_seed(9)
    off = _offsets(lengths)
    q, k, v, dout = (torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(torch.bfloat16)
                     for _ in range(4))
    got = _grads(one, q, k, v, dout, off, off, **vis)
    _check_vs_two_pass_and_reference(got, one, two, (q, k, v, dout), off, lengths, vis, "one-pass")


def _check_vs_two_pass_and_reference(got: list[torch.Tensor], one: JfaConfig, two: JfaConfig,
                                     qkvd: tuple[torch.Tensor, ...], off: torch.Tensor, lengths: list[int],
                                     vis: dict[str, Any], label: str) -> None:
    """The GPU tests' checks: `got` (config `one`) within 1e-2 of the two-pass path and finite,
    then `one` within 2e-2 of the fp32 reference on the first 8 samples (the padded reference
    of all of them would be large)."""
    q, k, v, dout = qkvd
    base = _grads(two, q, k, v, dout, off, off, **vis)
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, base):
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) <= 1e-2, f"{name}: {label} vs two-pass {_rel(a, b):.3g}"
    n = int(off[8])
    sub = _offsets(lengths[:8])
    q8, k8, v8, do8 = (x[:n] for x in (q, k, v, dout))
    got8 = _grads(one, q8, k8, v8, do8, sub, sub, **vis)
    ref8 = _grads(None, q8.float(), k8.float(), v8.float(), do8.float(), sub, sub, backend="reference", **vis)
    for name, a, r in zip(("out", "dq", "dk", "dv"), got8, ref8):
        assert _rel(a, r) <= 2e-2, f"{name}: {label} vs fp32 reference {_rel(a, r):.3g}"


@pytest.mark.skipif(not HOPPER, reason="needs an SM90 (Hopper) GPU")
@pytest.mark.parametrize("loads", [False, True])
@pytest.mark.parametrize("variant", ["full", "causal"])
def test_gpu_tma_one_pass(variant: str, loads: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # `test_gpu_real_size_one_pass`'s shapes with the heuristic one-pass tiles plus `tma`
    # (and `tma_loads`), q/k/v as views of one fused projection (q's descriptor has row stride
    # 3·H·D), vs the two-pass path; the bulk reduce (and bulk tensor loads) must be in the PTX.
    lengths = _trainer_like_lengths()
    vis = VARIANTS[variant]
    h, d, mx = 8, 128, max(lengths)
    one = dataclasses.replace(_triton_jfa._heuristic_config(mx, mx, d, torch.bfloat16, True), tma=True,
                              tma_loads=loads)
    two = _triton_jfa._heuristic_config(mx, mx, d, torch.bfloat16, False)
    g = torch.Generator(device=DEVICE).manual_seed(9)
    off = _offsets(lengths)
    qkv = torch.randn(sum(lengths), 3, h, d, generator=g, device=DEVICE).to(torch.bfloat16)
    q, k, v = qkv.unbind(1)
    dout = torch.randn(sum(lengths), h, d, generator=g, device=DEVICE).to(torch.bfloat16)
    spy = _Spy(_triton_jfa._jfa_bwd_dkdv_kernel)
    monkeypatch.setattr(_triton_jfa, "_jfa_bwd_dkdv_kernel", spy)
    got = _grads(one, q, k, v, dout, off, off, **vis)
    torch.cuda.synchronize()
    kw, compiled = spy.launches[-1]
    assert kw["DQ_TMA"] and kw["TMA_LOADS"] == loads
    ptx = compiled.asm["ptx"]
    assert "cp.reduce.async.bulk.tensor" in ptx
    assert not re.search(r"\b(red|atom)\.global", ptx)  # no element-wise dQ atomics left ("shared.global" is no atomic)
    if loads:
        assert "cp.async.bulk.tensor" in ptx
    _check_vs_two_pass_and_reference(got, one, two, (q, k, v, dout), off, lengths, vis, "one-pass tma")


def test_tma_env_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """`GEM_JFA_TMA` sets the heuristic one-pass config's TMA flags (never a two-pass one's), and
    `GEM_JFA_FWD` picks the forward implementation; bad values name the variable and the rule."""
    from gem_kernels import _jfa, _triton_jfa_tma

    monkeypatch.setenv(BWD_ENV, "one_pass")
    monkeypatch.delenv(_triton_jfa.TMA_ENV, raising=False)
    cfg = pick_config(13613, 13613, 128, torch.bfloat16)
    assert cfg.one_pass and not cfg.tma and not cfg.tma_loads
    for value, want in (("off", (False, False)), ("reduce", (True, False)), ("loads", (True, True))):
        monkeypatch.setenv(_triton_jfa.TMA_ENV, value)
        cfg = pick_config(13613, 13613, 128, torch.bfloat16)
        assert (cfg.tma, cfg.tma_loads) == want
    monkeypatch.setenv(BWD_ENV, "two_pass")
    assert not pick_config(13613, 13613, 128, torch.bfloat16).tma
    monkeypatch.setenv(_triton_jfa.TMA_ENV, "on")
    with pytest.raises(ValueError, match="GEM_JFA_TMA='on' must be one of"):
        pick_config(13613, 13613, 128, torch.bfloat16)
    monkeypatch.delenv(_triton_jfa.TMA_ENV)
    monkeypatch.delenv(_jfa.FWD_ENV, raising=False)
    assert _jfa._forward_impl() is _triton_jfa.jfa_forward
    monkeypatch.setenv(_jfa.FWD_ENV, "tma")
    assert _jfa._forward_impl() is _triton_jfa_tma.jfa_forward_tma
    monkeypatch.setenv(_jfa.FWD_ENV, "fast")
    with pytest.raises(ValueError, match="GEM_JFA_FWD='fast' must be one of"):
        _jfa._forward_impl()


@needs_triton
def test_fwd_env_tma_runs_the_tma_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `GEM_JFA_FWD=tma` the public op's forward goes through `jfa_forward_tma` (the
    interpreter runs its kernel) and still matches the reference, gradients included."""
    from gem_kernels import _triton_jfa_tma

    calls: list[int] = []
    real = _triton_jfa_tma.jfa_forward_tma

    def spy(*a: object, **kw: object) -> object:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_triton_jfa_tma, "jfa_forward_tma", spy)
    monkeypatch.setenv("GEM_JFA_FWD", "tma")
    lq = [9, 0, 20]
    qo = _offsets(lq)
    q, k, v = (torch.randn(sum(lq), 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = jagged_flash_attention(q, k, v, qo, qo, 20, 20, causal=True, backend="triton")
    got = torch.autograd.grad(out.sum(), (q, k, v))
    assert calls
    ref = jagged_flash_attention(q, k, v, qo, qo, 20, 20, causal=True, backend="reference")
    want = torch.autograd.grad(ref.sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_backward_rule_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_kernels import jfa_backward_rule

    monkeypatch.delenv(BWD_ENV, raising=False)
    ours = f"one_pass up to {ONE_PASS_MAX_Q_LEN} queries per sequence, two_pass above"
    flash = "flash (torch's FlashAttention-2 backward) on CUDA fp16/bf16 without a window; else "
    from gem_kernels import _flash4

    here = "imports here" if _flash4._import_error() is None else "does not import here"
    flash4 = ("flash4 (FlashAttention-4's backward) on CUDA fp16/bf16 SM90/SM100 without a window where "
              f"flash-attn-4 imports (it {here}); else ")
    # torch's FlashAttention-2 backward only when asked for (FLASH_DEFAULT off since 0.3.9)
    assert _triton_jfa.FLASH4_DEFAULT and not _triton_jfa.FLASH_DEFAULT
    assert jfa_backward_rule() == flash4 + ours
    monkeypatch.setattr(_triton_jfa, "FLASH_DEFAULT", True)
    assert jfa_backward_rule() == flash4 + flash + ours
    monkeypatch.setattr(_triton_jfa, "FLASH4_DEFAULT", False)
    assert jfa_backward_rule() == flash + ours
    monkeypatch.setattr(_triton_jfa, "FLASH_DEFAULT", False)
    assert jfa_backward_rule() == ours
    monkeypatch.setenv(BWD_ENV, "flash")
    assert jfa_backward_rule() == flash.replace("flash (", "flash (GEM_JFA_BWD, flash) (", 1) + ours
    monkeypatch.delenv(BWD_ENV)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert jfa_backward_rule() == "two_pass (deterministic algorithms on)"
    finally:
        torch.use_deterministic_algorithms(was)
    monkeypatch.setenv(BWD_ENV, "one_pass")
    assert jfa_backward_rule() == "one_pass (GEM_JFA_BWD, one_pass)"
    monkeypatch.setenv(BWD_ENV, "both")
    with pytest.raises(ValueError, match="GEM_JFA_BWD='both' must be one of"):
        jfa_backward_rule()
