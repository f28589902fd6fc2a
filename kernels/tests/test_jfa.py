"""Triton JFA vs the plain-PyTorch reference: forward and dq/dk/dv.

CPU: Triton's interpreter (TRITON_INTERPRET=1) at tiny sizes with 16×16 tiles, so lengths
0, 1, 15, 16, 17, 33 hit the block edges. GPU (skipped without CUDA): real sizes and the
heuristic tiles.
"""

import dataclasses
import os
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_kernels import jagged_flash_attention
from gem_kernels._triton_jfa import JfaConfig, JfaTiles, _heuristic_config, force_config, pick_config
from _respecialize import check_respecializes
from _strided import every_other

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"

# Tolerances vs the fp32 reference on the same (rounded) inputs: out (atol, rtol);
# grad (max error relative to max(1, max |ref grad|), unused).
TOL = {
    torch.float32: {"out": (2e-5, 1e-4), "grad": (5e-5, 0.0)},
    torch.bfloat16: {"out": (2e-2, 2e-2), "grad": (2e-2, 0.0)},
    torch.float16: {"out": (4e-3, 4e-3), "grad": (4e-3, 0.0)},
}
TINY = JfaConfig(
    fwd=JfaTiles(block_m=16, block_n=16),
    dkdv=JfaTiles(block_m=16, block_n=16),
    dq=JfaTiles(block_m=16, block_n=16),
)


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)


def _check(
    lq: list[int],
    lk: list[int],
    *,
    h: int = 2,
    d: int = 16,
    dtype: torch.dtype = torch.float32,
    causal: bool = False,
    window: int | None = None,
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
    out = jagged_flash_attention(q, k, v, tqo, tko, mq, mk, causal=causal, window=window, backend="triton")
    dout = torch.randn(out.shape, generator=g, device=DEVICE).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # Reference in fp32 on the same rounded inputs.
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = jagged_flash_attention(q32, k32, v32, qo, ko, mq, mk, causal=causal, window=window, backend="reference")
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    assert out.dtype == dtype and out.shape == q.shape
    atol, rtol = TOL[dtype]["out"]
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)
    # Gradients sum over up to thousands of terms: compare relative to the largest entry.
    tol = TOL[dtype]["grad"][0]
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        if want.numel():
            err = float((got.float() - want).abs().max()) / max(1.0, float(want.abs().max()))
            assert err <= tol, f"{name}: max error {err:.3g} (relative to max |ref|) > {tol}"


EDGE_Q = [17, 0, 1, 16, 15, 33]
EDGE_K = [17, 3, 0, 16, 15, 33]
VARIANTS = {
    "full": dict(causal=False, window=None),
    "causal": dict(causal=True, window=None),
    "causal_window": dict(causal=True, window=5),
    "band": dict(causal=False, window=3),
}


@needs_triton
@pytest.mark.parametrize("bwd", ["two_pass", "one_pass"])
def test_strided_offsets(bwd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets passed as strided views give the contiguous offsets' results, forward and both
    backwards (the kernels read them with a unit stride: the public call makes them contiguous)."""
    monkeypatch.setenv("GEM_JFA_BWD", bwd)
    _check(EDGE_Q, EDGE_K, causal=True, strided_offsets=True)


@needs_triton
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_self_attention_edges_fp32(variant: str) -> None:
    with force_config(TINY):
        _check(EDGE_Q, EDGE_Q, **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("variant", ["full", "causal_window"])
def test_unequal_lengths_bottom_right(variant: str) -> None:
    # Longer q than kv and vice versa in one batch: bottom-right alignment is exercised both ways.
    with force_config(TINY):
        _check(EDGE_Q, EDGE_K[::-1], **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("schedule", ["list", "grid", "in_order", "in_order_rev"])
@pytest.mark.parametrize("variant", ["full", "causal_window"])
def test_tile_list_grid_and_in_order_schedules(schedule: str, variant: str) -> None:
    # The launch schedules (tile list: binary search over per-sample tile counts, heaviest
    # first; plain grid with early exits; batch order located in-kernel, the q-side kernels'
    # tiles first to last or last to first) on the same long-tailed batch.
    batch = schedule.startswith("in_order")
    cfg = dataclasses.replace(TINY, tile_list=schedule == "list", in_order=batch, fwd_in_order=batch,
                              reverse_q=schedule == "in_order_rev")
    with force_config(cfg):
        _check([40, 0, 3, 17, 1, 16], [33, 5, 0, 17, 40, 16], **VARIANTS[variant])  # type: ignore[arg-type]


@needs_triton
@pytest.mark.parametrize("causal,window", [(True, 20), (False, 18)])
def test_wide_window_full_tiles(causal: bool, window: int) -> None:
    # Windows wider than a tile: interior tiles take the unmasked path, edges the masked one.
    with force_config(TINY):
        _check([50, 33], [50, 40], causal=causal, window=window)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_causal(dtype: torch.dtype) -> None:
    with force_config(TINY):
        _check(EDGE_Q, EDGE_Q, dtype=dtype, causal=True, d=32)


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
def test_cross_long_q_short_kv(causal: bool) -> None:
    # Heuristic tiles: BLOCK_N shrinks to the short kv side.
    _check([40, 3, 0, 17], [4, 8, 2, 0], causal=causal, dtype=torch.bfloat16)


@needs_triton
def test_pooling_few_q_long_kv() -> None:
    _check([2, 1, 0, 4], [70, 0, 33, 5], dtype=torch.bfloat16, d=32)


@needs_triton
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 20)])
def test_split_kv_pooling(causal: bool, window: int | None) -> None:
    # Split-kv: 32-key chunks combined by log-sum-exp; fwd and dq go through the workspace.
    split = dataclasses.replace(TINY, kv_split=32)
    with force_config(split):
        _check([2, 1, 0, 5], [70, 0, 33, 31], causal=causal, window=window)


@needs_triton
def test_all_empty_kv_gives_zeros_and_zero_grads() -> None:
    qo, ko = _offsets([3, 2]), _offsets([0, 0])
    q = torch.randn(5, 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    out = jagged_flash_attention(q, k, v, qo, ko, 3, 0, backend="triton")
    assert torch.count_nonzero(out) == 0
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.count_nonzero(dq) == 0


@needs_triton
def test_empty_batch() -> None:
    off = _offsets([])
    x = torch.randn(0, 2, 16, device=DEVICE, requires_grad=True)
    out = jagged_flash_attention(x, x, x, off, off, 0, 0, causal=True, backend="triton")
    assert out.shape == (0, 2, 16)


@needs_triton
@settings(max_examples=5, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=3),
    causal=st.booleans(),
    window=st.one_of(st.none(), st.integers(1, 24)),
    seed=st.integers(0, 2**16),
)
def test_hypothesis(lengths: list[tuple[int, int]], causal: bool, window: int | None, seed: int) -> None:
    with force_config(TINY):
        _check([a for a, _ in lengths], [b for _, b in lengths], causal=causal, window=window, seed=seed)


def test_pick_config_per_shape() -> None:
    self_attn = pick_config(4500, 4500, 128, torch.bfloat16)
    cross = pick_config(4500, 16, 128, torch.bfloat16)
    pool = pick_config(8, 4500, 128, torch.bfloat16)
    assert self_attn.fwd.block_m == 128 and self_attn.fwd.block_n >= 64
    assert cross.fwd.block_n == 16 and cross.fwd.block_m == 128
    assert pool.fwd.block_m == 16 and pool.fwd.block_n == 128


@needs_triton
def test_opcheck_custom_op() -> None:
    qo = _offsets([3, 0, 5])
    ko = _offsets([4, 2, 5])
    q = torch.randn(8, 1, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(11, 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(11, 1, 16, device=DEVICE, requires_grad=True)
    torch.library.opcheck(
        torch.ops.gem_kernels.jfa_fwd.default,
        (q, k, v, qo, ko, 5, 5, True, None, 0.25),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


@needs_triton
def test_torch_compile_fullgraph() -> None:
    qo = _offsets([3, 4])
    q = torch.randn(7, 1, 16, device=DEVICE, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return jagged_flash_attention(x, x, x, qo, qo, 4, 4, causal=True, backend="triton").sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    (g1,) = torch.autograd.grad(compiled(q), (q,))
    (g2,) = torch.autograd.grad(f(q), (q,))
    torch.testing.assert_close(g1, g2)


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_real_sizes(d: int, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")  # our Triton forward, whatever the mean length
    g = torch.Generator().manual_seed(d)
    lq = torch.randint(0, 1500, (12,), generator=g).tolist() + [0, 1, 127, 128, 129]
    _check(lq, lq, h=4, d=d, dtype=torch.bfloat16, **VARIANTS[variant])  # type: ignore[arg-type]


@pytest.mark.skipif(not CUDA, reason="GPU-size test")
@pytest.mark.parametrize("shape", ["cross", "pooling"])
def test_gpu_cross_and_pooling(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_JFA_FWD", "pointer")  # our Triton forward, whatever the mean length
    g = torch.Generator().manual_seed(1)
    long = torch.randint(0, 3000, (16,), generator=g).tolist()
    short = torch.randint(0, 33, (16,), generator=g).tolist()
    lq, lk = (long, short) if shape == "cross" else (short, long)
    _check(lq, lk, h=4, d=128, dtype=torch.bfloat16)


@pytest.mark.skipif(not CUDA, reason="the cached launch runs Triton's binder only on the GPU")
def test_gpu_forward_cached_launch_respecializes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The forward launches through gem_kernels._launch.CachedLaunch: it must pick a new binary
    # whenever Triton would (a misaligned view, another dtype, another head count) and give
    # the reference's values each time, with a second call of one specialization adding none.
    from gem_kernels._triton_jfa import _fwd_launch

    monkeypatch.setenv("GEM_JFA_FWD", "pointer")  # our Triton forward, whatever the mean length
    lengths = [700, 1, 64, 900, 0, 129]
    off = _offsets(lengths)

    def run_and_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        with torch.no_grad():
            out = jagged_flash_attention(q, k, v, off, off, 900, 900, causal=True)
            ref = jagged_flash_attention(q.float(), k.float(), v.float(), off, off, 900, 900, causal=True,
                                         backend="reference")
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)

    check_respecializes(_fwd_launch(), sum(lengths), DEVICE, 9, run_and_check)


def test_default_schedule_batch_order_except_one_tile_queries() -> None:
    # The heuristic's launch order (measured on the H200, kernels/BENCHMARKS.md 2026-12-04):
    # the two-pass backward in batch order; the forward too when a sample has more than one
    # q tile, the plain grid for the pooling's one-tile queries (0.80x in batch order); the
    # one-pass backward in batch order too (1.03x on the trainer batch, 2026-12-04).
    rng = random.Random(11)
    for _ in range(20):
        mq, mk = rng.randint(1, 5000), rng.randint(1, 5000)
        for one_pass in (False, True):
            cfg = _heuristic_config(mq, mk, 128, torch.bfloat16, one_pass)
            assert cfg.fwd_in_order == (mq > cfg.fwd.block_m), (mq, cfg)
            assert cfg.in_order
            assert not cfg.reverse_q and cfg.tile_list is False
    assert not _heuristic_config(32, 13613, 128, torch.bfloat16).fwd_in_order  # the pooling shape
    assert _heuristic_config(4787, 4787, 128, torch.bfloat16).fwd_in_order  # issue 15's batch


@needs_triton
def test_rows_past_32_bit_offsets_are_refused() -> None:
    # The kernels address a sample's rows with 32-bit offsets from its first row: a max length
    # whose rows could pass 2**31 elements is refused before launch, naming the bound and the
    # stride (here a packed [T, 3, H, D] view: row stride 3·H·D). Just under the bound it runs.
    qkv = torch.randn(5, 3, 2, 16, device=DEVICE)
    q, k, v = (x.requires_grad_() for x in qkv.unbind(1))
    off = torch.tensor([0, 2, 5], device=DEVICE)
    big = 2**31 // 96
    with pytest.raises(ValueError, match=r"max_q_len=22369622 rows x row stride 96 must be < 2\*\*31"):
        jagged_flash_attention(q, k, v, off, off, big + 1, 3, backend="triton")
    with pytest.raises(ValueError, match=r"max_kv_len=22369622 rows"):
        jagged_flash_attention(q, k, v, off, off, 3, big + 1, backend="triton")
    out = jagged_flash_attention(q, k, v, off, off, big, big, backend="triton")
    ref = jagged_flash_attention(q.detach(), k.detach(), v.detach(), off, off, 3, 3, backend="reference")
    torch.testing.assert_close(out.detach(), ref, atol=2e-5, rtol=1e-4)
