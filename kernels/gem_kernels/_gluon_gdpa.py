# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""GDPA's forward as a warp-specialized Gluon kernel (Hopper): `_gluon_jfa`'s loader and split.

Why: issue 15's GDPA target (SiLU causal forward >= 280 TFLOP/s, 1.3x HSTU's public kernel) sits
at the edge on an H100 (255-279 eager, kernels/BENCHMARKS.md 2026-12-07). GDPA's loop is JFA's
without the online softmax: S = Q·Kᵀ, P = act(S·scale) (zero where a key is not visible),
O += P·V, out = O / divisor. Its SFU work (the sigmoid) and its MMAs run one after the other in
the Triton kernel's single instruction stream. `_gdpa_fwd_ws_kernel` runs it on
`_gluon_jfa._jfa_fwd_ws_kernel`'s partitions: the same loader (`_fwd_ws_loader`: q tile, K/V
slots by `cp.async` with zero-filled rows past a sample's end, `ready` / `empty` mbarriers) and
two consumer warpgroups owning a 128-row q tile's halves, S_j issued with O += P_{j-1}·V_{j-1}
and act(S_j) computed under the second; optional ping-pong.

**Not yet run on a GPU** (written in a session without one): reached only through `forward`
here (tests, `bench.gluon --fwd-only`), never by `gem_kernels.gdpa`. Contract: the Triton
forward's (`_gdpa.gdpa_forward_triton`), without a window; bf16/fp16, head dim 64 or 128, on a
Hopper GPU (`_gluon_jfa.problem`). Checked on any machine: its sm_90a build
(`tests/test_sm90_builds.py`); the barrier protocol is the JFA kernel's
(`tests/test_gluon_schedule.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from gem_kernels import _gluon_jfa
from gem_kernels._gluon_jfa import HAVE_GLUON

ACTIVATIONS = ("silu", "gelu", "relu", "relu2", "sigmoid", "identity")  # `_triton_gdpa._act`'s

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from gem_kernels._gluon_jfa import _acc_layout, _fwd_ws_loader, _sample

    @gluon.jit
    def _sigmoid(x, TANH: gl.constexpr):
        """`_triton_gdpa._sigmoid`: 1/2 + tanh(x/2)/2 by `tanh.approx.f32` (one MUFU op), or exp2
        and an approximate division."""
        if TANH:
            t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x * 0.5], dtype=gl.float32,
                                          is_pure=True, pack=1)
            return 0.5 + 0.5 * t
        return gl.fdiv(1.0, 1.0 + gl.exp2(x * -1.4426950408889634), ieee_rounding=False)

    @gluon.jit
    def _act(x, ACT: gl.constexpr, TANH: gl.constexpr):
        """`_triton_gdpa._act` (keep in sync)."""
        if ACT == "silu":
            y = x * _sigmoid(x, TANH)
        elif ACT == "gelu":
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            y = x * _sigmoid(2.0 * u, TANH)
        elif ACT == "relu":
            y = gl.maximum(x, 0.0)
        elif ACT == "relu2":
            r = gl.maximum(x, 0.0)
            y = r * r
        elif ACT == "sigmoid":
            y = _sigmoid(x, TANH)
        else:
            gl.static_assert(ACT == "identity", "unknown activation")
            y = x
        return y

    @gluon.jit
    def _gdpa_fwd_ws_kernel(
        Q, K, V, O, QO, KO,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        B, scale, inv_div,
        CAUSAL: gl.constexpr, ACT: gl.constexpr, TANH: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr, LOG2B: gl.constexpr, STAGES: gl.constexpr, LOAD_WARPS: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, PINGPONG: gl.constexpr, q_sl: gl.constexpr,
        kv_sl: gl.constexpr, num_warps: gl.constexpr,
    ):
        """GDPA's forward, one program per (q tile of BLOCK_M = 128 rows, head) in batch order, on
        `_jfa_fwd_ws_kernel`'s three partitions (see there)."""
        ok, m_start, q_start, lq, kv_start, lk = _sample(QO, QO, KO, B, BLOCK_M, LOG2B, num_warps)
        if not ok:
            return
        h = gl.program_id(1)
        shift = lk - lq
        hi = lk
        if CAUSAL:
            hi = gl.minimum(lk, gl.maximum(m_start + BLOCK_M + shift, 0))
        n_tiles = (hi + BLOCK_N - 1) // BLOCK_N

        HALF: gl.constexpr = BLOCK_M // 2
        dtype: gl.constexpr = Q.dtype.element_ty
        q_smem = gl.allocate_shared_memory(dtype, [2, HALF, D], q_sl)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=LOAD_WARPS * 32)
            mbarrier.init(empty.index(i), count=2)
        mbarrier.init(q_bar.index(0), count=LOAD_WARPS * 32)

        q_base = Q + q_start * stride_qt + h * stride_qh
        o_base = O + q_start * stride_ot + h * stride_oh
        k_base = K + kv_start * stride_kt + h * stride_kh
        v_base = V + kv_start * stride_vt + h * stride_vh
        gl.warp_specialize([
            (_gdpa_fwd_ws_consumer, (q_smem, k_smem, v_smem, ready, empty, q_bar, turn, o_base, m_start, lq, lk,
                                     shift, n_tiles, stride_ot, scale, inv_div, 0, CAUSAL, ACT, TANH, D, HALF,
                                     BLOCK_N, STAGES, PINGPONG)),
            (_gdpa_fwd_ws_consumer, (q_smem, k_smem, v_smem, ready, empty, q_bar, turn, o_base, m_start, lq, lk,
                                     shift, n_tiles, stride_ot, scale, inv_div, 1, CAUSAL, ACT, TANH, D, HALF,
                                     BLOCK_N, STAGES, PINGPONG)),
            (_fwd_ws_loader, (q_smem, k_smem, v_smem, ready, empty, q_bar, q_base, k_base, v_base, m_start, lq, lk,
                              n_tiles, stride_qt, stride_kt, stride_vt, D, HALF, BLOCK_N, STAGES, LOAD_WARPS)),
        ], [4, LOAD_WARPS], [CONSUMER_REGS, LOAD_REGS])

    @gluon.jit
    def _gdpa_scores(s, scale, rows, offs_n, start_n, f_hi, lk, shift, CAUSAL: gl.constexpr, ACT: gl.constexpr,
                     TANH: gl.constexpr, BLOCK_N: gl.constexpr):
        """P = act(S·scale) of one kv tile; a tile reaching past f_hi zeroes the keys a row does not
        see (past the sample's end, or past the row's causal bound)."""
        p = _act(s * scale, ACT, TANH)
        if start_n + BLOCK_N > f_hi:
            cols = start_n + offs_n
            ok = (cols < lk)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + shift)
            p = gl.where(ok, p, 0.0)
        return p

    @gluon.jit
    def _gdpa_fwd_ws_consumer(q_smem, k_smem, v_smem, ready, empty, q_bar, turn, o_base, m_start, lq, lk, shift,
                              n_tiles, stride_ot, scale, inv_div, HALF_ID: gl.constexpr, CAUSAL: gl.constexpr,
                              ACT: gl.constexpr, TANH: gl.constexpr, D: gl.constexpr, HALF: gl.constexpr,
                              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
        """A consumer warpgroup: rows [HALF_ID * HALF, +HALF) of the q tile over the streamed kv
        tiles, with `_gluon_jfa._fwd_ws_consumer`'s barriers and turns; writes out = O / divisor."""
        s_layout: gl.constexpr = _acc_layout(4, BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(4, D)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = q_smem.dtype

        m0 = m_start + HALF_ID * HALF
        f_hi = lk
        if CAUSAL:
            f_hi = gl.minimum(lk, m0 + shift + 1)
        my_q = q_smem.index(HALF_ID)
        rows = m0 + gl.arange(0, HALF, layout=row_s)
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero_s = gl.zeros([HALF, BLOCK_N], dtype=gl.float32, layout=s_layout)
        acc = gl.zeros([HALF, D], dtype=gl.float32, layout=o_layout)
        mbarrier.wait(q_bar.index(0), 0)
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)
            fence_async_shared()
            if PINGPONG:
                mbarrier.wait(turn.index(HALF_ID), 1 - HALF_ID)
            s_tok = warpgroup_mma(my_q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - HALF_ID), count=1)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            p = _gdpa_scores(s, scale, rows, offs_n, 0, f_hi, lk, shift, CAUSAL, ACT, TANH, BLOCK_N)
            p_op = gl.convert_layout(p.to(dtype), a_layout)
            for j in range(1, n_tiles):
                slot = j % STAGES
                mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
                fence_async_shared()
                if PINGPONG:
                    mbarrier.wait(turn.index(HALF_ID), (j + 1 - HALF_ID) & 1)
                s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                o_tok = warpgroup_mma(p_op, v_smem.index((j - 1) % STAGES), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn.index(1 - HALF_ID), count=1)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # O += P·V still runs
                p = _gdpa_scores(s, scale, rows, offs_n, j * BLOCK_N, f_hi, lk, shift, CAUSAL, ACT, TANH, BLOCK_N)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)
                p_op = gl.convert_layout(p.to(dtype), a_layout)
            acc = warpgroup_mma(p_op, v_smem.index((n_tiles - 1) % STAGES), acc)
        out = acc * inv_div
        out_rows = m0 + gl.arange(0, HALF, layout=row_o)
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        gl.store(o_base + out_rows[:, None] * stride_ot + out_cols[None, :], out.to(o_base.dtype.element_ty),
                 mask=(out_rows < lq)[:, None])


def fwd_plan(
    tiles: tuple[Any, ...], rows: int, offsets: torch.Tensor, max_len: int, h: int, d: int, causal: bool,
    activation: str, tanh: bool = True,
) -> tuple[Any, tuple[int, int], int, dict[str, Any]]:
    """(kernel, grid, B, constexprs and launch options) of the forward at `tiles`, a
    warp-specialized tile set of `_gluon_jfa.fwd_plan` ((128, BLOCK_N, 12, STAGES, True[,
    PINGPONG])), checked as it checks; `activation` one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: must be one of {ACTIVATIONS}")
    if not (len(tiles) > 4 and tiles[4]):
        raise ValueError(f"tiles={tiles}: GDPA's Gluon forward is the warp-specialized one "
                         f"(128, BLOCK_N, {_gluon_jfa.WS_WARPS}, STAGES, True[, PINGPONG])")
    _, grid, b, consts = _gluon_jfa.fwd_plan(tiles, rows, offsets, max_len, h, d, causal)
    consts.update(ACT=activation, TANH=tanh)
    return _gdpa_fwd_ws_kernel, grid, b, consts


DEFAULT_TILES = (128, 128, 12, 3, True, True)  # not measured yet (no GPU has run this kernel)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, activation: str, scale: float, divisor: float, causal: bool,
    tiles: tuple[Any, ...] | None = None,
) -> torch.Tensor:
    """GDPA's forward `[Tq, H, D]` (`_gdpa.gdpa_forward_triton`'s contract without a window) by the
    warp-specialized kernel: `_gluon_jfa.problem(q, k, None)` must be None; q/k/v with unit stride
    on D, offsets int64 `[B + 1]`."""
    if divisor <= 0:
        raise ValueError(f"divisor={divisor}: must be > 0")
    tq, h, d = q.shape
    kern, grid, b, consts = fwd_plan(DEFAULT_TILES if tiles is None else tiles, tq, q_offsets, max_q_len, h, d,
                                     causal, activation)
    out = torch.empty((tq, h, d), dtype=q.dtype, device=q.device)
    if grid[0] == 0 or grid[1] == 0:
        return out.zero_()
    kern[grid](q, k, v, out, q_offsets, kv_offsets,
               q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
               out.stride(1), b, scale, 1.0 / divisor, **consts)
    return out
