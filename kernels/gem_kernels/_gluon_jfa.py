# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""JFA's forward and two-pass backward kernels in Gluon (Hopper): the GEMMs overlap the softmax math.

Why this file exists: the two-pass backward's dK/dV kernel is the largest item of the
trainer's step (22.7 % of GPU time, kernels/BENCHMARKS.md), dQ and the forward come next.
Triton's `tl.dot` waits for each non-accumulating wgmma right after issuing it, so in the
dK/dV kernel Kᵀ·Q, V·dOᵀ, the exp and dS run one after the other. Gluon exposes the
asynchronous wgmma (`warpgroup_mma(..., is_async=True)` and `warpgroup_mma_wait(n)`):

- dK/dV (`_jfa_bwd_dkdv_gluon_kernel`): both score GEMMs are issued at once, Pᵀ = exp2(Sᵀ - lse)
  is computed while V·dOᵀ still runs, and dV += Pᵀ·dO, dK += dSᵀ·Q stay in flight under the next
  q tile's loads and score GEMMs. One program per (kv tile of BLOCK_N rows, head) in batch order;
  K and V stay in shared memory as the MMAs' A operands, Pᵀ and dSᵀ feed the dV / dK MMAs from
  registers, q/dO tiles stream STAGES-deep.
- dQ (`_jfa_bwd_dq_gluon_kernel`): the same over kv tiles (Q and dO stay in shared memory).
- forward (`_jfa_fwd_gluon_kernel`): S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued together and
  tile j's online softmax runs under the second (FlashAttention-3's intra-warpgroup pipelining).

Same contracts as `_triton_jfa`'s kernels (self- or cross-attention, full or causal
bottom-right aligned; no window, no split-kv, the two-pass backward). Tiles come through
`cp.async` with row masks: rows past a sample's end are zero-filled, so a neighbour's
non-finite values never enter an MMA.

Gluon kernels run only on a Hopper GPU: no CPU interpreter. The Triton kernels are the
reference twins (checked on the CPU under TRITON_INTERPRET=1 and against the PyTorch
reference); the GPU tests (`tests/test_gluon_jfa.py`) compare each kernel with its twin and
with the reference at real sizes (40 passed on an H100, 2026-12-07), and a CPU test
(`tests/test_sm90_builds.py`) cross-compiles the default binaries for sm_90a (shared memory,
spills, asynchronous wgmmas). `tests/test_gluon_schedule.py` models each kernel's tile walk
(bounds, masked tiles, zero-filled rows, the order of the rescale) in float64 PyTorch against
the reference on the CPU: change a bound here, change it there. Used where the switch asks
(`use_gluon_jfa` or `GEM_JFA_GLUON`: `all`, or a list of `fwd`, `dkdv`, `dq`; off unless asked
for; the trainer asks for `dkdv,dq`, 2.5 % off its compiled step on an H100).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from gem_kernels._launch import launch_of

try:  # Gluon is experimental: absent on older Triton, and its API may move
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    # The CTA-wide barrier: `thread_barrier` in Triton 3.6, `barrier` from 3.7.
    _cta_sync = getattr(gl, "thread_barrier", None) or gl.barrier
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

ENV = "GEM_JFA_GLUON"
KERNELS = ("fwd", "dkdv", "dq")


_default: tuple[str, ...] = ()  # what `use_gluon_jfa` asked for, read when GEM_JFA_GLUON is unset


def kernels_named(value: str, name: str) -> tuple[str, ...]:
    """The kernels a switch value names: "all", "off" / "" (none) or a comma-separated list of
    KERNELS; anything else is a ValueError naming `name` (the variable, argument or field the
    value came from) and the rule."""
    value = value.strip().lower()
    if value in ("", "off"):
        return ()
    names = KERNELS if value == "all" else tuple(n.strip() for n in value.split(","))
    if any(n not in KERNELS for n in names):
        raise ValueError(f"{name}={value!r} must be 'all', 'off' or a comma-separated list of {KERNELS}")
    return names


def use_gluon_jfa(value: str) -> tuple[str, ...]:
    """Sets, for this process, which of JFA's kernels run as their Gluon twins where they can
    serve (Hopper, bf16/fp16, head dim 64/128, no window, the two-pass backward): "all", "off"
    or a comma-separated list of "fwd", "dkdv", "dq". Off unless set. The environment variable
    GEM_JFA_GLUON, when set and not empty (even to "off"), wins over this. Returns the kernels
    the switch now asks for (`requested_kernels`)."""
    global _default
    _default = kernels_named(value, "use_gluon_jfa(value)")
    return requested_kernels()


def requested_kernels() -> tuple[str, ...]:
    """The kernels the switch asks for: the environment variable `GEM_JFA_GLUON` where set and
    not empty, else `use_gluon_jfa`'s choice (default none)."""
    env = os.environ.get(ENV)
    return kernels_named(env, ENV) if env is not None and env.strip() else _default


def requested(*kernels: str) -> bool:
    """Whether the switch asks for the Gluon twin of any of `kernels` ("fwd", "dkdv", "dq")."""
    asked = requested_kernels()
    return any(k in asked for k in kernels)


def problem(q: torch.Tensor, k: torch.Tensor, window: int | None, one_pass: bool = False) -> str | None:
    """Why these kernels cannot serve this call (None: they can); `one_pass`: the backward asked
    for is the one-pass one (which adds dQ inside the dK/dV kernel: no twin)."""
    from gem_kernels._triton_jfa import interpreting

    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if interpreting():
        return "Gluon kernels do not run under TRITON_INTERPRET=1"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper (SM90) GPU"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype:
        return f"dtype {q.dtype} (needs bf16 or fp16)"
    if q.shape[2] not in (64, 128):
        return f"head dim {q.shape[2]} (needs 64 or 128)"
    if window is not None:
        return "windowed attention"
    if one_pass:
        return "the one-pass backward (this kernel adds no dQ)"
    return None


def serves(kernel: str, q: torch.Tensor, k: torch.Tensor, window: int | None, cfg: Any) -> bool:
    """Whether `kernel` ("fwd", "dkdv" or "dq") of this call runs as its Gluon twin: asked for by
    `GEM_JFA_GLUON` and possible here (`problem`; the forward and dQ also need the picked
    `_triton_jfa.JfaConfig` without split-kv); else the Triton kernel, silently where Gluon
    cannot serve (e.g. on the CPU)."""
    if not requested(kernel) or (kernel != "dkdv" and cfg.kv_split):
        return False
    return problem(q, k, window, kernel != "fwd" and cfg.one_pass) is None


if HAVE_GLUON:

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _locate(OFF, pid, B, BLOCK: gl.constexpr, BLOCK_B: gl.constexpr, layout: gl.constexpr):
        """(sample, tile within it, total tiles) of batch-order tile `pid` (`_triton_jfa._locate`)."""
        idx = gl.arange(0, BLOCK_B, layout=layout)
        m = idx < B
        lo = gl.load(OFF + idx, mask=m, other=0)
        hi = gl.load(OFF + idx + 1, mask=m, other=0)
        cnt = ((hi - lo + (BLOCK - 1)) // BLOCK).to(gl.int32)
        cum = gl.associative_scan(cnt, 0, _add)
        b = gl.sum((cum <= pid).to(gl.int32), 0)
        first = gl.sum(gl.where(idx == b, cum - cnt, 0), 0)
        return b, pid - first, gl.sum(cnt, 0)

    @gluon.constexpr_function
    def _acc_layout(num_warps, n):
        """The wgmma accumulator layout of a [rows, n] tile, warps stacked along the rows (each
        warpgroup owns 64 of them)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def _copy_layout(d, num_warps):
        """16 bytes per thread along a row of d 16-bit values: the cp.async copies' layout."""
        return gl.BlockedLayout([1, 8], [32 // (d // 8), d // 8], [num_warps, 1], [1, 0])

    @gluon.jit
    def _sample(TILED, QO, KO, B, BLOCK: gl.constexpr, LOG2B: gl.constexpr, num_warps: gl.constexpr):
        """(in range, tile start on the tiled side, q_start, lq, kv_start, lk) of this program: its
        tile is batch-order tile program_id(0) of the side whose offsets are TILED (QO or KO)."""
        ok, start, q_start, lq, kv_start, lk, _ = _sample_at(TILED, QO, KO, B, gl.program_id(0), BLOCK, LOG2B,
                                                             num_warps)
        return ok, start, q_start, lq, kv_start, lk

    @gluon.jit
    def _sample_at(TILED, QO, KO, B, tile, BLOCK: gl.constexpr, LOG2B: gl.constexpr, num_warps: gl.constexpr):
        """`_sample` of batch-order tile `tile`, plus the side's total tiles."""
        b, blk, total = _locate(TILED, tile, B, BLOCK, 1 << LOG2B, gl.BlockedLayout([1], [32], [num_warps], [0]))
        bb = gl.minimum(b, B - 1)  # b == B past the last tile (not in range then)
        q_start = gl.load(QO + bb)
        kv_start = gl.load(KO + bb)
        lq = (gl.load(QO + bb + 1) - q_start).to(gl.int32)
        lk = (gl.load(KO + bb + 1) - kv_start).to(gl.int32)
        return tile < total, blk * BLOCK, q_start, lq, kv_start, lk, total

    @gluon.jit
    def _issue_tile(q_buf, do_buf, q_base, do_base, start_m, lq, stride_qt, stride_dot,
                    BLOCK_M: gl.constexpr, D: gl.constexpr, ld_layout: gl.constexpr):
        """cp.async of one [BLOCK_M, D] tile of two row-aligned tensors (q and dO, or K and V) from
        row start_m of the sample; rows past lq (its length on that side) are zero-filled."""
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
        ok = (rows < lq)[:, None]
        cp.async_copy_global_to_shared(q_buf, q_base + rows[:, None] * stride_qt + cols[None, :], mask=ok)
        cp.async_copy_global_to_shared(do_buf, do_base + rows[:, None] * stride_dot + cols[None, :], mask=ok)

    @gluon.jit
    def _jfa_bwd_dkdv_gluon_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, QO, KO,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
        stride_dkt, stride_dkh, stride_dvt, stride_dvh,
        B, H, scale, scale_log2,
        CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        LOG2B: gl.constexpr, STAGES: gl.constexpr, OVERLAP_ACC: gl.constexpr,
        q_sl: gl.constexpr, kv_sl: gl.constexpr, num_warps: gl.constexpr,
    ):
        # Register layouts: S/dP tiles [BLOCK_N, BLOCK_M] and dK/dV [BLOCK_N, D] as wgmma
        # accumulators (warps stacked along the kv rows: each warpgroup owns 64 of them),
        # Pᵀ/dSᵀ as the dV/dK MMAs' register A operand, a 16-byte-per-thread copy layout.
        s_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_M)
        d_layout: gl.constexpr = _acc_layout(num_warps, D)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=d_layout, k_width=2)
        ld_layout: gl.constexpr = _copy_layout(D, num_warps)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # along the q rows of an Sᵀ tile
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)  # along its kv rows

        ok, n_start, q_start, lq, kv_start, lk = _sample(KO, QO, KO, B, BLOCK_N, LOG2B, num_warps)
        if not ok:
            return
        h = gl.program_id(1)
        shift = lk - lq

        dtype: gl.constexpr = K.dtype.element_ty
        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], kv_sl)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], kv_sl)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], q_sl)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], q_sl)

        krows = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
        dcols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
        kok = (krows < lk)[:, None]
        k_base = K + kv_start * stride_kt + h * stride_kh
        v_base = V + kv_start * stride_vt + h * stride_vh
        cp.async_copy_global_to_shared(k_smem, k_base + krows[:, None] * stride_kt + dcols[None, :], mask=kok)
        cp.async_copy_global_to_shared(v_smem, v_base + krows[:, None] * stride_vt + dcols[None, :], mask=kok)

        # q tiles that see keys [n_start, n_start + BLOCK_N): [lo, lq); those before f_lo
        # hold a causal diagonal (element mask), the rest see the whole kv tile.
        lo = 0
        f_lo = 0
        if CAUSAL:
            lo = gl.maximum(n_start - shift, 0)
            f_lo = gl.maximum(n_start + BLOCK_N - 1 - shift, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        hi = gl.maximum(lq, lo)
        n_tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M

        q_base = Q + q_start * stride_qt + h * stride_qh
        do_base = DO + q_start * stride_dot + h * stride_doh
        lse_base = LSE + q_start * H + h
        delta_base = DELTA + q_start * H + h

        # K, V and the first PD q/dO tiles form the first copy groups (a tile past the last
        # loads nothing: every row masked). Tile t lives in slot t % STAGES; it is refilled
        # (with tile t + STAGES) at iteration t + STAGES - PD >= t + 2, after every warpgroup
        # passed the barrier of iteration t + 1, whose MMA wait retired tile t's dV/dK MMAs.
        PD: gl.constexpr = STAGES - 2
        for i in gl.static_range(PD):
            _issue_tile(q_smem.index(i), do_smem.index(i), q_base, do_base, lo + i * BLOCK_M, lq,
                        stride_qt, stride_dot, BLOCK_M, D, ld_layout)
            cp.commit_group()

        zero_s = gl.zeros([BLOCK_N, BLOCK_M], dtype=gl.float32, layout=s_layout)
        zero_d = gl.zeros([BLOCK_N, D], dtype=gl.float32, layout=d_layout)
        offs_m = gl.arange(0, BLOCK_M, layout=col_layout)
        offs_n = n_start + gl.arange(0, BLOCK_N, layout=row_layout)
        out_rows = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, d_layout))
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, d_layout))
        ok = (out_rows < lk)[:, None]
        dk_ptrs = DK + kv_start * stride_dkt + h * stride_dkh + out_rows[:, None] * stride_dkt + out_cols[None, :]
        dv_ptrs = DV + kv_start * stride_dvt + h * stride_dvh + out_rows[:, None] * stride_dvt + out_cols[None, :]
        if n_tiles > 0:
            # The first tile is peeled: its dV/dK MMAs start the accumulators (use_acc=False),
            # so no non-MMA instruction ever writes registers of an MMA in flight (else ptxas
            # serializes every wgmma, C7515).
            dk, dv, p_op, ds_op = _dkdv_step(
                0, lo, lq, f_lo, shift, zero_d, zero_d, zero_d, zero_d, k_smem, v_smem, q_smem, do_smem,
                q_base, do_base, lse_base, delta_base, offs_m, offs_n, H, scale_log2, stride_qt, stride_dot,
                zero_s, zero_d, True, CAUSAL, BLOCK_M, D, STAGES, OVERLAP_ACC, ld_layout, a_layout)
            for it in range(1, n_tiles):
                dk, dv, p_op, ds_op = _dkdv_step(
                    it, lo, lq, f_lo, shift, dk, dv, p_op, ds_op, k_smem, v_smem, q_smem, do_smem,
                    q_base, do_base, lse_base, delta_base, offs_m, offs_n, H, scale_log2, stride_qt, stride_dot,
                    zero_s, zero_d, False, CAUSAL, BLOCK_M, D, STAGES, OVERLAP_ACC, ld_layout, a_layout)
            dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
            cp.wait_group(0)
            gl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=ok)
            gl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=ok)
        else:  # no query sees this kv tile
            cp.wait_group(0)
            gl.store(dk_ptrs, zero_d.to(DK.dtype.element_ty), mask=ok)
            gl.store(dv_ptrs, zero_d.to(DV.dtype.element_ty), mask=ok)

    @gluon.jit
    def _dkdv_step(it, lo, lq, f_lo, shift, dk, dv, p_op, ds_op, k_smem, v_smem, q_smem, do_smem,
                   q_base, do_base, lse_base, delta_base, offs_m, offs_n, H, scale_log2, stride_qt, stride_dot,
                   zero_s, zero_d, FIRST: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                   D: gl.constexpr, STAGES: gl.constexpr, OVERLAP_ACC: gl.constexpr,
                   ld_layout: gl.constexpr, a_layout: gl.constexpr):
        """One q tile: Sᵀ and dPᵀ together, Pᵀ under dPᵀ, then dV += Pᵀ·dO, dK += dSᵀ·Q left in flight
        (OVERLAP_ACC) or waited for. FIRST: the accumulators start here (dk, dv, p_op, ds_op unused)."""
        PD: gl.constexpr = STAGES - 2
        start_m = lo + it * BLOCK_M
        rows = start_m + offs_m
        r_ok = rows < lq
        lse2 = gl.load(lse_base + rows * H, mask=r_ok, other=float("inf"))
        delta = gl.load(delta_base + rows * H, mask=r_ok, other=0.0)

        cp.wait_group(PD - 1)  # this tile's group (and K, V with the first) landed
        fence_async_shared()
        _cta_sync()
        nxt = it + PD
        _issue_tile(q_smem.index(nxt % STAGES), do_smem.index(nxt % STAGES), q_base, do_base,
                    lo + nxt * BLOCK_M, lq, stride_qt, stride_dot, BLOCK_M, D, ld_layout)
        cp.commit_group()

        q_t = q_smem.index(it % STAGES)
        do_t = do_smem.index(it % STAGES)
        s_tok = warpgroup_mma(k_smem, q_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v_smem, do_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        # In order: the previous tile's dV and dK MMAs, then Sᵀ, retire; V·dOᵀ may run on.
        if FIRST:
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        else:
            s, dk, dv, p_op, ds_op = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dk, dv, p_op, ds_op))
        p = gl.exp2(s * scale_log2 - lse2[None, :])
        if CAUSAL:
            if start_m < f_lo:
                p = gl.where(offs_n[:, None] <= rows[None, :] + shift, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        ds = p * (dp - delta[None, :])
        p_op = gl.convert_layout(p.to(q_t.dtype), a_layout)
        ds_op = gl.convert_layout(ds.to(q_t.dtype), a_layout)
        if FIRST:
            dv = warpgroup_mma(p_op, do_t, zero_d, use_acc=False, is_async=True)
            dk = warpgroup_mma(ds_op, q_t, zero_d, use_acc=False, is_async=True)
        else:
            dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
            dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
        if not OVERLAP_ACC:
            dk, dv, p_op, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, p_op, ds_op))
        return dk, dv, p_op, ds_op

    @gluon.jit
    def _jfa_bwd_dq_gluon_kernel(
        Q, K, V, DO, LSE, DELTA, DQ, QO, KO,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
        stride_dqt, stride_dqh,
        B, H, scale, scale_log2,
        CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        LOG2B: gl.constexpr, STAGES: gl.constexpr, OVERLAP_ACC: gl.constexpr,
        q_sl: gl.constexpr, kv_sl: gl.constexpr, num_warps: gl.constexpr,
    ):
        """dQ of the two-pass backward (`_triton_jfa._jfa_bwd_dq_kernel`'s twin): one program per
        (q tile of BLOCK_M rows, head) in batch order, walking its kv tiles; S and dP issued
        together, P under dP, dQ += dS·K left in flight (OVERLAP_ACC). Q and dO stay in shared
        memory (A operands), K/V tiles stream through STAGES slots. Keys past the sample's end
        load as zero rows: their dS multiplies a zero K row, so no column mask is needed."""
        s_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_N)
        d_layout: gl.constexpr = _acc_layout(num_warps, D)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=d_layout, k_width=2)
        ld_layout: gl.constexpr = _copy_layout(D, num_warps)

        ok, m_start, q_start, lq, kv_start, lk = _sample(QO, QO, KO, B, BLOCK_M, LOG2B, num_warps)
        if not ok:
            return
        h = gl.program_id(1)
        shift = lk - lq

        dtype: gl.constexpr = Q.dtype.element_ty
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_sl)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_sl)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        q_base = Q + q_start * stride_qt + h * stride_qh
        do_base = DO + q_start * stride_dot + h * stride_doh
        k_base = K + kv_start * stride_kt + h * stride_kh
        v_base = V + kv_start * stride_vt + h * stride_vh
        _issue_tile(q_smem, do_smem, q_base, do_base, m_start, lq, stride_qt, stride_dot, BLOCK_M, D, ld_layout)

        # kv tiles [0, hi); from f_hi on a causal tile holds the diagonal (element mask).
        hi = lk
        f_hi = lk
        if CAUSAL:
            hi = gl.minimum(lk, gl.maximum(m_start + BLOCK_M + shift, 0))
            f_hi = gl.maximum(m_start + shift + 1, 0)
        n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
        PD: gl.constexpr = STAGES - 2
        for i in gl.static_range(PD):
            _issue_tile(k_smem.index(i), v_smem.index(i), k_base, v_base, i * BLOCK_N, lk, stride_kt, stride_vt,
                        BLOCK_N, D, ld_layout)
            cp.commit_group()

        rows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        r_ok = rows < lq
        lse2 = gl.load(LSE + q_start * H + h + rows * H, mask=r_ok, other=float("inf"))
        delta = gl.load(DELTA + q_start * H + h + rows * H, mask=r_ok, other=0.0)
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], dtype=gl.float32, layout=s_layout)
        zero_d = gl.zeros([BLOCK_M, D], dtype=gl.float32, layout=d_layout)
        out_rows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, d_layout))
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, d_layout))
        dq_ptrs = DQ + q_start * stride_dqt + h * stride_dqh + out_rows[:, None] * stride_dqt + out_cols[None, :]
        ok = (out_rows < lq)[:, None]
        if n_tiles > 0:
            dq, ds_op = _dq_step(0, lse2, delta, rows, offs_n, f_hi, shift, lk, zero_d, zero_d, q_smem, do_smem,
                                 k_smem, v_smem, k_base, v_base, stride_kt, stride_vt, scale_log2, zero_s, zero_d,
                                 True, CAUSAL, BLOCK_N, D, STAGES, OVERLAP_ACC, ld_layout, a_layout)
            for it in range(1, n_tiles):
                dq, ds_op = _dq_step(it, lse2, delta, rows, offs_n, f_hi, shift, lk, dq, ds_op, q_smem, do_smem,
                                     k_smem, v_smem, k_base, v_base, stride_kt, stride_vt, scale_log2, zero_s,
                                     zero_d, False, CAUSAL, BLOCK_N, D, STAGES, OVERLAP_ACC, ld_layout, a_layout)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            cp.wait_group(0)
            gl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=ok)
        else:  # this q tile sees no key
            cp.wait_group(0)
            gl.store(dq_ptrs, zero_d.to(DQ.dtype.element_ty), mask=ok)

    @gluon.jit
    def _dq_step(it, lse2, delta, rows, offs_n, f_hi, shift, lk, dq, ds_op, q_smem, do_smem, k_smem, v_smem,
                 k_base, v_base, stride_kt, stride_vt, scale_log2, zero_s, zero_d, FIRST: gl.constexpr,
                 CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                 OVERLAP_ACC: gl.constexpr, ld_layout: gl.constexpr, a_layout: gl.constexpr):
        """One kv tile of the dQ kernel (the dK/dV step's pattern; see `_dkdv_step`)."""
        PD: gl.constexpr = STAGES - 2
        start_n = it * BLOCK_N
        cp.wait_group(PD - 1)  # this kv tile's group (and Q, dO with the first) landed
        fence_async_shared()
        _cta_sync()
        nxt = it + PD
        _issue_tile(k_smem.index(nxt % STAGES), v_smem.index(nxt % STAGES), k_base, v_base, nxt * BLOCK_N, lk,
                    stride_kt, stride_vt, BLOCK_N, D, ld_layout)
        cp.commit_group()
        k_t = k_smem.index(it % STAGES)
        v_t = v_smem.index(it % STAGES)
        s_tok = warpgroup_mma(q_smem, k_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do_smem, v_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if FIRST:
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        else:
            s, dq, ds_op = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dq, ds_op))
        p = gl.exp2(s * scale_log2 - lse2[:, None])
        if CAUSAL:
            if start_n + BLOCK_N > f_hi:
                p = gl.where(start_n + offs_n[None, :] <= rows[:, None] + shift, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        ds = p * (dp - delta[:, None])
        ds_op = gl.convert_layout(ds.to(k_t.dtype), a_layout)
        if FIRST:
            dq = warpgroup_mma(ds_op, k_t, zero_d, use_acc=False, is_async=True)
        else:
            dq = warpgroup_mma(ds_op, k_t, dq, is_async=True)
        if not OVERLAP_ACC:
            dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
        return dq, ds_op

    @gluon.jit
    def _jfa_fwd_gluon_kernel(
        Q, K, V, O, LSE, QO, KO,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        B, H, scale_log2,
        CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        LOG2B: gl.constexpr, STAGES: gl.constexpr,
        q_sl: gl.constexpr, kv_sl: gl.constexpr, num_warps: gl.constexpr,
    ):
        """The forward (`_triton_jfa._jfa_fwd_kernel`'s twin; FlashAttention-3's intra-warpgroup
        pipelining): one program per (q tile, head) in batch order. For kv tile j it issues
        S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} together, runs tile j's online softmax while the
        second MMA runs, then rescales O. K/V tiles stream through STAGES slots (`cp.async`,
        rows past the sample's end zero-filled); masked tiles (the sample's last, a causal
        diagonal) select with -inf. Writes out `[Tq, H, D]` and the log2-domain lse2 `[Tq, H]`
        (+inf for a row that sees no key, whose out is 0), as the Triton kernel does."""
        s_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(num_warps, D)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ld_layout: gl.constexpr = _copy_layout(D, num_warps)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        ok, m_start, q_start, lq, kv_start, lk = _sample(QO, QO, KO, B, BLOCK_M, LOG2B, num_warps)
        if not ok:
            return
        h = gl.program_id(1)
        shift = lk - lq

        dtype: gl.constexpr = Q.dtype.element_ty
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_sl)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        k_base = K + kv_start * stride_kt + h * stride_kh
        v_base = V + kv_start * stride_vt + h * stride_vh
        qrows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
        dcols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
        cp.async_copy_global_to_shared(
            q_smem, Q + q_start * stride_qt + h * stride_qh + qrows[:, None] * stride_qt + dcols[None, :],
            mask=(qrows < lq)[:, None])

        # kv tiles [0, hi); a tile reaching past f_hi is masked (the sample's last partial tile,
        # and with CAUSAL those holding the diagonal: f_hi is the first row's bound).
        hi = lk
        f_hi = lk
        if CAUSAL:
            hi = gl.minimum(lk, gl.maximum(m_start + BLOCK_M + shift, 0))
            f_hi = gl.minimum(lk, m_start + shift + 1)
        n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
        PD: gl.constexpr = STAGES - 2
        for i in gl.static_range(PD):
            _issue_tile(k_smem.index(i), v_smem.index(i), k_base, v_base, i * BLOCK_N, lk, stride_kt, stride_vt,
                        BLOCK_N, D, ld_layout)
            cp.commit_group()

        rows = m_start + gl.arange(0, BLOCK_M, layout=row_s)
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], dtype=gl.float32, layout=s_layout)
        acc = gl.zeros([BLOCK_M, D], dtype=gl.float32, layout=o_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], dtype=gl.float32, layout=row_s)
        if n_tiles > 0:
            # Tile 0: its scores and softmax (nothing to rescale yet).
            s = _fwd_scores(0, q_smem, k_smem, v_smem, k_base, v_base, lk, stride_kt, stride_vt, zero_s,
                            BLOCK_N, D, STAGES, ld_layout)
            p, alpha, l_i, m_i = _online_softmax(s * scale_log2, m_i, l_i, rows, offs_n, 0, f_hi, lk, shift,
                                                 CAUSAL, BLOCK_N)
            p_op = gl.convert_layout(p.to(dtype), a_layout)
            for j in range(1, n_tiles):
                s_tok = _fwd_scores_async(j, q_smem, k_smem, v_smem, k_base, v_base, lk, stride_kt, stride_vt,
                                          zero_s, BLOCK_N, D, STAGES, ld_layout)
                o_tok = warpgroup_mma(p_op, v_smem.index((j - 1) % STAGES), acc, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # O += P·V still runs
                p, alpha, l_i, m_i = _online_softmax(s * scale_log2, m_i, l_i, rows, offs_n, j * BLOCK_N, f_hi,
                                                     lk, shift, CAUSAL, BLOCK_N)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = gl.convert_layout(p.to(dtype), a_layout)
            acc = warpgroup_mma(p_op, v_smem.index((n_tiles - 1) % STAGES), acc)
        cp.wait_group(0)
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
        lse2 = gl.where(empty, float("inf"), m_i + gl.log2(l_safe))
        out_rows = m_start + gl.arange(0, BLOCK_M, layout=row_o)
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = O + q_start * stride_ot + h * stride_oh + out_rows[:, None] * stride_ot + out_cols[None, :]
        gl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(out_rows < lq)[:, None])
        gl.store(LSE + q_start * H + h + rows * H, lse2, mask=rows < lq)

    @gluon.jit
    def _fwd_scores_async(j, q_smem, k_smem, v_smem, k_base, v_base, lk, stride_kt, stride_vt, zero_s,
                          BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, ld_layout: gl.constexpr):
        """Waits for kv tile j's copy, refills the slot of tile j - 2 with tile j + STAGES - 2 (every
        MMA that read it retired before this barrier), and issues S_j = Q·K_jᵀ (a token)."""
        PD: gl.constexpr = STAGES - 2
        cp.wait_group(PD - 1)
        fence_async_shared()
        _cta_sync()
        nxt = j + PD
        _issue_tile(k_smem.index(nxt % STAGES), v_smem.index(nxt % STAGES), k_base, v_base, nxt * BLOCK_N, lk,
                    stride_kt, stride_vt, BLOCK_N, D, ld_layout)
        cp.commit_group()
        return warpgroup_mma(q_smem, k_smem.index(j % STAGES).permute((1, 0)), zero_s, use_acc=False, is_async=True)

    @gluon.jit
    def _fwd_scores(j, q_smem, k_smem, v_smem, k_base, v_base, lk, stride_kt, stride_vt, zero_s,
                    BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, ld_layout: gl.constexpr):
        """`_fwd_scores_async`, waited for."""
        tok = _fwd_scores_async(j, q_smem, k_smem, v_smem, k_base, v_base, lk, stride_kt, stride_vt, zero_s,
                                BLOCK_N, D, STAGES, ld_layout)
        return warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

    @gluon.jit
    def _online_softmax(s, m_i, l_i, rows, offs_n, start_n, f_hi, lk, shift, CAUSAL: gl.constexpr,
                        BLOCK_N: gl.constexpr):
        """One tile's online-softmax update of log2-domain scores `s` (`_triton_jfa._softmax_step`):
        (p, alpha, l, m). A tile reaching past f_hi selects with -inf (keys past the sample's end,
        or past a row's causal bound); a row that has seen no key keeps m = -inf, and its p and
        alpha are computed against 0 (no NaN)."""
        if start_n + BLOCK_N > f_hi:
            cols = start_n + offs_n
            ok = (cols < lk)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + shift)
            s = gl.where(ok, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        return p, alpha, l_i * alpha + gl.sum(p, 1), m_new

    # ---- The warp-specialized forward (FlashAttention-3's producer / consumer split) ----

    @gluon.jit
    def _gl_sigmoid(x, TANH: gl.constexpr):
        """`_triton_gdpa._sigmoid` in Gluon: 1/2 + tanh(x/2)/2 by `tanh.approx.f32` (one MUFU op), or
        exp2 and an approximate division."""
        if TANH:
            t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x * 0.5], dtype=gl.float32,
                                          is_pure=True, pack=1)
            return 0.5 + 0.5 * t
        return gl.fdiv(1.0, 1.0 + gl.exp2(x * -1.4426950408889634), ieee_rounding=False)

    @gluon.jit
    def _gl_act(x, ACT: gl.constexpr, TANH: gl.constexpr):
        """`_triton_gdpa._act` in Gluon (keep the two in sync; `_gluon_gdpa.ACTIVATIONS`)."""
        if ACT == "silu":
            y = x * _gl_sigmoid(x, TANH)
        elif ACT == "gelu":
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            y = x * _gl_sigmoid(2.0 * u, TANH)
        elif ACT == "relu":
            y = gl.maximum(x, 0.0)
        elif ACT == "relu2":
            r = gl.maximum(x, 0.0)
            y = r * r
        elif ACT == "sigmoid":
            y = _gl_sigmoid(x, TANH)
        else:
            gl.static_assert(ACT == "identity", "unknown activation")
            y = x
        return y

    @gluon.jit
    def _attn_fwd_ws_kernel(
        Q, K, V, O, LSE, QO, KO,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        B, H, scale, inv_div,
        ACT: gl.constexpr, TANH: gl.constexpr, CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr, LOG2B: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr,
        LOAD_WARPS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, PINGPONG: gl.constexpr,
        q_sl: gl.constexpr, kv_sl: gl.constexpr, num_warps: gl.constexpr,
    ):
        """The warp-specialized forward of JFA (ACT "softmax": out and the log2-domain lse2, as
        `_jfa_fwd_gluon_kernel`; `scale` is scale·log2 e) and of GDPA (ACT an activation:
        out = Σ act(S·scale)·V · inv_div; LSE unused). Work items are (batch-order q tile of
        BLOCK_M = 128 rows, head), item = tile · H + head; program p takes items p, p + grid, ...
        (one program per item, or one per SM: persistent). Three partitions:

        - a loader (LOAD_WARPS warps) copies each item's q tile into q buffer it % Q_BUFS once
          both consumers released that buffer's previous item (`q_empty`; `q_ready` when its copies
          land), then the item's kv tiles through a ring of STAGES K/V slots counted over the
          program's kv tiles (tile c in slot c % STAGES once both consumers released tile
          c - STAGES: `empty`; `ready` when its copies land). `cp.async` with row masks: rows past
          a sample's end are zero-filled. Each loader thread arrives on a slot's barrier when its
          own copies landed (`cp.async.mbarrier.arrive.noinc`); it never waits on them.
        - two consumer warpgroups (the default partition and one worker, 4 warps each) own the
          q tile's halves: per kv tile S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued together and
          P_j (the online softmax, or the activation) is computed under the second
          (FlashAttention-3's intra-warpgroup pipelining); each releases a slot once its MMAs that
          read it retired, the q buffer after the item's last score MMA. With PINGPONG they take
          turns to issue each tile's MMAs (`turn` barriers: FlashAttention-3's inter-warpgroup
          schedule), so one's softmax runs while the other's MMAs do.
        """
        _, _, _, _, _, _, total = _sample_at(QO, QO, KO, B, 0, BLOCK_M, LOG2B, num_warps)
        n_items = total * H
        HALF: gl.constexpr = BLOCK_M // 2
        dtype: gl.constexpr = Q.dtype.element_ty
        q_smem = gl.allocate_shared_memory(dtype, [2 * Q_BUFS, HALF, D], q_sl)  # [buffer x half]
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], kv_sl)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        for i in gl.static_range(Q_BUFS):
            mbarrier.init(q_ready.index(i), count=LOAD_WARPS * 32)  # each loader thread's copies
            mbarrier.init(q_empty.index(i), count=2)  # each consumer, once
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=LOAD_WARPS * 32)
            mbarrier.init(empty.index(i), count=2)
        bufs = (q_smem, k_smem, v_smem, ready, empty, q_ready, q_empty, turn)
        gl.warp_specialize([
            (_ws_consumer, (O, LSE, QO, KO, bufs, stride_ot, stride_oh, B, H, n_items, scale, inv_div, 0, ACT, TANH,
                            CAUSAL, D, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, LOG2B, PINGPONG)),
            (_ws_consumer, (O, LSE, QO, KO, bufs, stride_ot, stride_oh, B, H, n_items, scale, inv_div, 1, ACT, TANH,
                            CAUSAL, D, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, LOG2B, PINGPONG)),
            (_ws_loader, (Q, K, V, QO, KO, bufs, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, B,
                          H, n_items, CAUSAL, D, BLOCK_M, BLOCK_N, STAGES, Q_BUFS, LOG2B, LOAD_WARPS)),
        ], [4, LOAD_WARPS], [CONSUMER_REGS, LOAD_REGS])

    @gluon.jit
    def _ws_item(QO, KO, B, H, item, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 LOG2B: gl.constexpr, NW: gl.constexpr):
        """Work item `item` (q tile item // H, head item % H): (m_start, q_start, lq, kv_start, lk,
        head, its kv tile count), as each partition decodes it (the same arithmetic in each)."""
        _, m_start, q_start, lq, kv_start, lk, _ = _sample_at(QO, QO, KO, B, item // H, BLOCK_M, LOG2B, NW)
        hi = lk
        if CAUSAL:
            hi = gl.minimum(lk, gl.maximum(m_start + BLOCK_M + lk - lq, 0))
        return m_start, q_start, lq, kv_start, lk, item % H, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _ws_loader(Q, K, V, QO, KO, bufs, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, B, H,
                   n_items, CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, Q_BUFS: gl.constexpr, LOG2B: gl.constexpr, LOAD_WARPS: gl.constexpr):
        """The loader partition (see `_attn_fwd_ws_kernel`)."""
        q_smem, k_smem, v_smem, ready, empty, q_ready, q_empty, turn = bufs
        HALF: gl.constexpr = BLOCK_M // 2
        ld_layout: gl.constexpr = _copy_layout(D, LOAD_WARPS)
        rows = gl.arange(0, HALF, layout=gl.SliceLayout(1, ld_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
        c = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            m_start, q_start, lq, kv_start, lk, h, n_tiles = _ws_item(QO, KO, B, H, item, CAUSAL, BLOCK_M, BLOCK_N,
                                                                      LOG2B, LOAD_WARPS)
            qb = it % Q_BUFS
            mbarrier.wait(q_empty.index(qb), ((it // Q_BUFS) & 1) ^ 1)  # a fresh barrier passes parity 1
            q_base = Q + q_start * stride_qt + h * stride_qh
            for half in gl.static_range(2):
                r = m_start + half * HALF + rows
                cp.async_copy_global_to_shared(q_smem.index(2 * qb + half),
                                               q_base + r[:, None] * stride_qt + cols[None, :], mask=(r < lq)[:, None])
            cp.mbarrier_arrive(q_ready.index(qb), increment_count=False)
            k_base = K + kv_start * stride_kt + h * stride_kh
            v_base = V + kv_start * stride_vt + h * stride_vh
            for t in range(n_tiles):
                slot = c % STAGES
                mbarrier.wait(empty.index(slot), ((c // STAGES) & 1) ^ 1)
                _issue_tile(k_smem.index(slot), v_smem.index(slot), k_base, v_base, t * BLOCK_N, lk, stride_kt,
                            stride_vt, BLOCK_N, D, ld_layout)
                cp.mbarrier_arrive(ready.index(slot), increment_count=False)
                c += 1
            it += 1

    @gluon.jit
    def _ws_scores(s, scale, m_i, l_i, rows, offs_n, start_n, f_hi, lk, shift, ACT: gl.constexpr,
                   TANH: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
        """One kv tile's P from its scores S: the online softmax of S·scale (log2 domain:
        `_online_softmax`'s (p, alpha, l, m)), or act(S·scale) zeroed where a key is not visible
        (alpha, l, m passed through)."""
        if ACT == "softmax":
            p, alpha, l_i, m_i = _online_softmax(s * scale, m_i, l_i, rows, offs_n, start_n, f_hi, lk, shift,
                                                 CAUSAL, BLOCK_N)
        else:
            p = _gl_act(s * scale, ACT, TANH)
            alpha = m_i
            if start_n + BLOCK_N > f_hi:
                cols = start_n + offs_n
                ok = (cols < lk)[None, :]
                if CAUSAL:
                    ok = ok & (cols[None, :] <= rows[:, None] + shift)
                p = gl.where(ok, p, 0.0)
        return p, alpha, l_i, m_i

    @gluon.jit
    def _ws_consumer(O, LSE, QO, KO, bufs, stride_ot, stride_oh, B, H, n_items, scale, inv_div,
                     HALF_ID: gl.constexpr, ACT: gl.constexpr, TANH: gl.constexpr, CAUSAL: gl.constexpr,
                     D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     Q_BUFS: gl.constexpr, LOG2B: gl.constexpr, PINGPONG: gl.constexpr):
        """A consumer partition (one warpgroup; see `_attn_fwd_ws_kernel`): rows
        [HALF_ID · BLOCK_M / 2, +BLOCK_M / 2) of each item's q tile. The ring's slot and phase and the
        ping-pong turns count the program's kv tiles (c): consumer 0's c-th turn needs consumer
        1's (c - 1)-th arrival (its first passes on the fresh barrier), consumer 1's consumer 0's
        c-th."""
        q_smem, k_smem, v_smem, ready, empty, q_ready, q_empty, turn = bufs
        HALF: gl.constexpr = BLOCK_M // 2
        s_layout: gl.constexpr = _acc_layout(4, BLOCK_N)
        o_layout: gl.constexpr = _acc_layout(4, D)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        dtype: gl.constexpr = q_smem.dtype
        offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        zero_s = gl.zeros([HALF, BLOCK_N], dtype=gl.float32, layout=s_layout)
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        c = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            m_start, q_start, lq, kv_start, lk, h, n_tiles = _ws_item(QO, KO, B, H, item, CAUSAL, BLOCK_M, BLOCK_N,
                                                                      LOG2B, 4)
            shift = lk - lq
            m0 = m_start + HALF_ID * HALF
            f_hi = lk  # tiles reaching past f_hi are masked (the last partial one; causal: the diagonal)
            if CAUSAL:
                f_hi = gl.minimum(lk, m0 + shift + 1)
            qb = it % Q_BUFS
            my_q = q_smem.index(2 * qb + HALF_ID)
            rows = m0 + gl.arange(0, HALF, layout=row_s)
            acc = gl.zeros([HALF, D], dtype=gl.float32, layout=o_layout)
            m_i = gl.full([HALF], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([HALF], dtype=gl.float32, layout=row_s)
            mbarrier.wait(q_ready.index(qb), (it // Q_BUFS) & 1)
            if n_tiles > 0:
                slot = c % STAGES
                mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
                fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads async
                if PINGPONG:
                    mbarrier.wait(turn.index(HALF_ID), (c + 1 - HALF_ID) & 1)
                s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                      is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn.index(1 - HALF_ID), count=1)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                p, alpha, l_i, m_i = _ws_scores(s, scale, m_i, l_i, rows, offs_n, 0, f_hi, lk, shift, ACT, TANH,
                                                CAUSAL, BLOCK_N)
                p_op = gl.convert_layout(p.to(dtype), a_layout)
                for j in range(1, n_tiles):
                    slot = (c + j) % STAGES
                    mbarrier.wait(ready.index(slot), ((c + j) // STAGES) & 1)
                    fence_async_shared()
                    if PINGPONG:
                        mbarrier.wait(turn.index(HALF_ID), (c + j + 1 - HALF_ID) & 1)
                    s_tok = warpgroup_mma(my_q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                          is_async=True)
                    o_tok = warpgroup_mma(p_op, v_smem.index((c + j - 1) % STAGES), acc, is_async=True)
                    if PINGPONG:
                        mbarrier.arrive(turn.index(1 - HALF_ID), count=1)
                    s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # O += P·V still runs
                    p, alpha, l_i, m_i = _ws_scores(s, scale, m_i, l_i, rows, offs_n, j * BLOCK_N, f_hi, lk, shift,
                                                    ACT, TANH, CAUSAL, BLOCK_N)
                    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                    mbarrier.arrive(empty.index((c + j - 1) % STAGES), count=1)  # K, V of tile j - 1 read
                    if ACT == "softmax":
                        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                    p_op = gl.convert_layout(p.to(dtype), a_layout)
                mbarrier.arrive(q_empty.index(qb), count=1)  # every score MMA of the item retired
                acc = warpgroup_mma(p_op, v_smem.index((c + n_tiles - 1) % STAGES), acc)
                mbarrier.arrive(empty.index((c + n_tiles - 1) % STAGES), count=1)
            else:
                mbarrier.arrive(q_empty.index(qb), count=1)
            c += n_tiles
            it += 1
            out_rows = m0 + gl.arange(0, HALF, layout=row_o)
            o_ptrs = O + q_start * stride_ot + h * stride_oh + out_rows[:, None] * stride_ot + out_cols[None, :]
            if ACT == "softmax":
                empty_row = l_i == 0.0
                l_safe = gl.where(empty_row, 1.0, l_i)
                out = acc / gl.convert_layout(l_safe, row_o)[:, None]
                lse2 = gl.where(empty_row, float("inf"), m_i + gl.log2(l_safe))
                gl.store(LSE + q_start * H + h + rows * H, lse2, mask=rows < lq)
            else:
                out = acc * inv_div
            gl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(out_rows < lq)[:, None])


@functools.cache
def smem_layouts(block_m: int, block_n: int, d: int, bits: int) -> tuple[Any, Any]:
    """NVMMA shared layouts of the q/dO tiles and of K, V (swizzled for wgmma)."""
    dt = gl.bfloat16 if bits == 16 else gl.float32
    return (gl.NVMMASharedLayout.get_default_for([block_m, d], dt),
            gl.NVMMASharedLayout.get_default_for([block_n, d], dt))


SMEM_LIMIT = 227 * 1024  # bytes of shared memory one program may use on an H100 / H200 SM


def smem_bytes(tiles: tuple[int, ...], by_m: bool, d: int, resident: int) -> int:
    """Shared memory of a Gluon JFA kernel's tiles (16-bit inputs): `resident` tiles of its own
    side (BLOCK_M rows if `by_m`, else BLOCK_N) plus STAGES slots of each of the two tensors it
    streams (the other side's rows)."""
    block_m, block_n, _, stages = tiles[:4]
    own, other = (block_m, block_n) if by_m else (block_n, block_m)
    return 2 * d * (resident * own + 2 * stages * other)


def _launch_plan(
    tiles: tuple[int, ...], by_m: bool, rows: int, offsets: torch.Tensor, max_len: int, h: int, d: int, causal: bool,
    resident: int | None = None, min_stages: int = 3,
) -> tuple[tuple[int, int], int, dict[str, Any]]:
    """(grid, B, the launch's constexprs and options) of a kernel whose programs take the
    BLOCK_M-row (`by_m`) or BLOCK_N-row tiles of `rows` rows in batch order, one head each.
    `tiles`: (BLOCK_M, BLOCK_N, num_warps, STAGES[, OVERLAP_ACC]); the tiled side must fill the
    wgmma layout (a multiple of 16 x num_warps rows) and STAGES >= `min_stages` (3 where the
    program loads its own tiles: two slots in use, one loading; 2 for the warp-specialized
    forward, whose loader runs apart). `resident`: how many tiles of the program's own side stay in shared memory (the
    forward's q: 1; dQ's q and dO, dK/dV's k and v: 2); given, the tiles' shared memory (those
    plus STAGES slots of the two streamed tensors, 16-bit) must fit an SM's 227 KB, checked here
    rather than failing at launch with Triton's out-of-resources error (the tools that compile
    a tile set to show its spills pass None)."""
    from gem_kernels._triton_jfa import in_order_tiles

    block_m, block_n, warps, stages = tiles[:4]
    block = block_m if by_m else block_n
    if stages < min_stages or block % (16 * warps) or block < 16 * warps:
        raise ValueError(f"tiles={tiles}: needs STAGES >= {min_stages} and BLOCK_{'M' if by_m else 'N'} a multiple of "
                         f"16 x num_warps")
    if resident is not None:
        need = smem_bytes(tiles, by_m, d, resident)
        if need > SMEM_LIMIT:
            raise ValueError(f"tiles={tiles}: need {need} bytes of shared memory at head dim {d}, more than the "
                             f"{SMEM_LIMIT} an SM gives one program (227 KB); use fewer STAGES or smaller tiles")
    b = offsets.numel() - 1
    q_sl, kv_sl = smem_layouts(block_m, block_n, d, 16)
    consts = dict(CAUSAL=causal, D=d, BLOCK_M=block_m, BLOCK_N=block_n, LOG2B=max(4, (b - 1).bit_length()),
                  STAGES=stages, q_sl=q_sl, kv_sl=kv_sl, num_warps=warps)
    if len(tiles) > 4:
        consts["OVERLAP_ACC"] = tiles[4]
    return (in_order_tiles(rows, b, max_len, block), h), b, consts


# (BLOCK_M, BLOCK_N, num_warps, STAGES, OVERLAP_ACC): 32 q rows per step, 64 kv rows in one
# warpgroup, 4 q/dO slots (2 tiles loading ahead), dV/dK MMAs in flight across iterations.
# On an H100 (`bench.gluon`, 2026-12-07) 430 / 344 / 489 / 465 TFLOP/s on issue 15's batch full /
# causal, the trainer's and the dense batch, against the Triton kernel's 407 / 299 / 472 / 442 and
# 372-434 for 32x128 over two warpgroups; 64 q rows spill (the Sᵀ/dPᵀ tiles, lse and delta double).
DEFAULT_TILES = (32, 64, 4, 4, True)


def dkdv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_kv_len: int, causal: bool, scale: float,
    tiles: tuple[int, int, int, int, bool] | None = None,
) -> None:
    """Writes dK and dV of the two-pass backward (`problem(...)` must be None).

    q/dO `[Tq, H, D]`, k/v/dK/dV `[Tk, H, D]` with unit stride along D; lse/delta `[Tq, H]`
    fp32 contiguous (log2-domain lse, delta = rowsum(dO·O)); offsets int64 `[B + 1]`. `tiles`:
    (BLOCK_M, BLOCK_N, num_warps, STAGES, OVERLAP_ACC), default `DEFAULT_TILES` (read per call).
    """
    from gem_kernels._triton_jfa import _LOG2E

    grid, b, consts = dkdv_plan(DEFAULT_TILES if tiles is None else tiles, k.shape[0], kv_offsets, max_kv_len,
                                q.shape[1], q.shape[2], causal)
    if grid[0] == 0 or grid[1] == 0:
        return
    # Through the kernel's CachedLaunch: the eager backward plans of `_jfa` keep its binary.
    launch_of(_jfa_bwd_dkdv_gluon_kernel)(grid, dkdv_args(q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets,
                                                          b, scale, scale * _LOG2E), consts)


def dkdv_plan(tiles: tuple[int, ...], rows: int, kv_offsets: torch.Tensor, max_kv_len: int, h: int, d: int,
              causal: bool) -> tuple[tuple[int, int], int, dict[str, Any]]:
    """(grid, B, constexprs and options) of the dK/dV kernel at `tiles` over `rows` key rows
    (`_launch_plan`: programs over the kv tiles, K and V resident)."""
    return _launch_plan(tiles, False, rows, kv_offsets, max_kv_len, h, d, causal, resident=2)


def dkdv_args(q: Any, k: Any, v: Any, dout: Any, lse: Any, delta: Any, dk: Any, dv: Any, q_offsets: Any,
              kv_offsets: Any, b: int, scale: float, scale_log2: float) -> tuple[Any, ...]:
    """The Gluon dK/dV kernel's runtime arguments, in order."""
    return (q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            b, q.shape[1], scale, scale_log2)


# dQ: (BLOCK_M, BLOCK_N, num_warps, STAGES, OVERLAP_ACC): 128 q rows over two warpgroups, 64 keys
# per step, 3 K/V slots. On an H100 (`bench.gluon`, 2026-12-07) 507 / 331 / 625 / 554 TFLOP/s
# (issue 15's batch full / causal, trainer, dense) against the Triton kernel's 476 / 354 / 546 /
# 484; 4 slots 505 / 340 / 584 / 601.
DEFAULT_DQ_TILES = (128, 64, 8, 3, True)


def dq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dq_out: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, causal: bool, scale: float, tiles: tuple[int, int, int, int, bool] | None = None,
) -> None:
    """Writes dQ of the two-pass backward into `dq_out` `[Tq, H, D]` (unit stride on D), as `dkdv`
    (same inputs); `tiles` default `DEFAULT_DQ_TILES` (read per call)."""
    from gem_kernels._triton_jfa import _LOG2E

    grid, b, consts = dq_plan(DEFAULT_DQ_TILES if tiles is None else tiles, q.shape[0], q_offsets, max_q_len,
                              q.shape[1], q.shape[2], causal)
    if grid[0] == 0 or grid[1] == 0:
        return
    launch_of(_jfa_bwd_dq_gluon_kernel)(grid, dq_args(q, k, v, dout, lse, delta, dq_out, q_offsets, kv_offsets, b,
                                                      scale, scale * _LOG2E), consts)


def dq_plan(tiles: tuple[int, ...], rows: int, q_offsets: torch.Tensor, max_q_len: int, h: int, d: int,
            causal: bool) -> tuple[tuple[int, int], int, dict[str, Any]]:
    """(grid, B, constexprs and options) of the dQ kernel at `tiles` over `rows` query rows
    (`_launch_plan`: programs over the q tiles, Q and dO resident)."""
    return _launch_plan(tiles, True, rows, q_offsets, max_q_len, h, d, causal, resident=2)


def dq_args(q: Any, k: Any, v: Any, dout: Any, lse: Any, delta: Any, dq_out: Any, q_offsets: Any, kv_offsets: Any,
            b: int, scale: float, scale_log2: float) -> tuple[Any, ...]:
    """The Gluon dQ kernel's runtime arguments, in order."""
    return (q, k, v, dout, lse, delta, dq_out, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dq_out.stride(0), dq_out.stride(1),
            b, q.shape[1], scale, scale_log2)


# The forward: (BLOCK_M, BLOCK_N, num_warps, STAGES[, WS]). Without WS (or WS False) the one-stream
# kernel: 128 q rows over two warpgroups, 128 keys per step, 3 K/V slots (224 KB of shared memory;
# 4 would need 288 KB), 231 registers, no spills. With WS True the warp-specialized kernel
# (`_attn_fwd_ws_kernel`): BLOCK_M must be 128 (two consumer warpgroups of 64 rows) and num_warps
# 12 (the two consumers and a 4-warp loader; registers 232 / 232 / 40 of a 168 launch cap); a
# sixth field True: the consumers take turns to issue their MMAs (PINGPONG); a seventh True: the
# persistent kernel (the same, one program per SM walking the (q tile, head) items,
# the q tile double-buffered, so STAGES x BLOCK_N K/V rows must fit beside two q tiles: 128 x 2 or
# 64 x 4 at head dim 128).
DEFAULT_FWD_TILES: tuple[Any, ...] = (128, 128, 8, 3)
WS_FWD_TILES = (128, 128, 12, 3, True)  # the warp-specialized set the build test pins
WS_WARPS = 12
WS_REGS = (168, 232, 40)  # the launch's cap, a consumer's and the loader's (setmaxnreg)


def fwd_plan(
    tiles: tuple[Any, ...], rows: int, offsets: torch.Tensor, max_len: int, h: int, d: int, causal: bool,
    sms: int = 132, act: str = "softmax", tanh: bool = True,
) -> tuple[Any, tuple[int, int], int, dict[str, Any]]:
    """(kernel, grid, B, its constexprs and launch options) of the forward at `tiles` (see
    `DEFAULT_FWD_TILES`), checked as `_launch_plan` checks, plus the warp-specialized shape rule;
    `sms`: the GPU's SM count, the persistent kernel's largest grid. `act`: "softmax" (JFA) or a
    GDPA activation (`_gluon_gdpa`; the warp-specialized kernel only), `tanh` its sigmoid's form."""
    ws = len(tiles) > 4 and bool(tiles[4])
    persistent = len(tiles) > 6 and bool(tiles[6])
    if ws and (tiles[0] != 128 or tiles[2] != WS_WARPS):
        raise ValueError(f"tiles={tiles}: the warp-specialized forward needs BLOCK_M 128 (two consumer "
                         f"warpgroups of 64 rows) and num_warps {WS_WARPS} (two consumers and a 4-warp loader)")
    if persistent and not ws:
        raise ValueError(f"tiles={tiles}: the persistent forward is the warp-specialized one (WS True)")
    grid, b, consts = _launch_plan((*tiles[:2], 8 if ws else tiles[2], tiles[3]), True, rows, offsets, max_len, h, d,
                                   causal, resident=2 if persistent else 1, min_stages=2 if ws else 3)
    if not ws:
        return _jfa_fwd_gluon_kernel, grid, b, consts
    consts.update(num_warps=4, LOAD_WARPS=4, CONSUMER_REGS=WS_REGS[1], LOAD_REGS=WS_REGS[2], ACT=act, TANH=tanh,
                  PINGPONG=len(tiles) > 5 and bool(tiles[5]), Q_BUFS=2 if persistent else 1,
                  q_sl=smem_layouts(64, tiles[1], d, 16)[0], maxnreg=WS_REGS[0])
    return _attn_fwd_ws_kernel, fwd_grid(fwd_grid_rule(tiles, sms), grid[0], grid[1]), b, consts


def fwd_grid_rule(tiles: tuple[Any, ...], sms: int) -> int:
    """How the forward at `tiles` lays out its grid (`fwd_grid`): -1 the one-stream kernel's
    (q tiles, heads); 0 the warp-specialized kernel's, one program per (q tile, head) item; > 0
    the persistent one's, at most that many programs (`sms`, the GPU's SM count)."""
    if not (len(tiles) > 4 and tiles[4]):
        return -1
    return sms if len(tiles) > 6 and tiles[6] else 0


def fwd_grid(rule: int, tiles: int, h: int) -> tuple[int, int]:
    """The forward's grid under `rule` (`fwd_grid_rule`) for `tiles` q tiles (an upper bound:
    `_triton_jfa.in_order_tiles`) and `h` heads."""
    if rule < 0:
        return tiles, h
    items = tiles * h
    return (min(rule, items) if rule else items), 1 if items else 0


@functools.cache
def sm_count(device: torch.device) -> int:
    """The SM count of `device` (the persistent forward's largest grid; 132 off a GPU)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, causal: bool, scale: float, tiles: tuple[Any, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out `[Tq, H, D]`, log2 lse `[Tq, H]` fp32) of `_triton_jfa.jfa_forward`'s contract, by the
    Gluon kernel (`problem(...)` must be None; q/k/v with unit stride on D, offsets int64);
    `tiles` default `DEFAULT_FWD_TILES` (read per call; see there for the warp-specialized set)."""
    from gem_kernels._triton_jfa import _LOG2E

    tq, h, d = q.shape
    kern, grid, b, consts = fwd_plan(DEFAULT_FWD_TILES if tiles is None else tiles, tq, q_offsets, max_q_len, h, d,
                                     causal, sm_count(q.device))
    out = torch.empty((tq, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((tq, h), dtype=torch.float32, device=q.device)
    if grid[0] == 0 or grid[1] == 0:
        return out.zero_(), lse.fill_(float("inf"))
    # Through the kernel's CachedLaunch (the binary kept per specialization), which the eager
    # plans of `_jfa` launch again directly (`fwd_args` is the argument list they rebuild).
    launch_of(kern)(grid, fwd_args(kern, q, k, v, out, lse, q_offsets, kv_offsets, b, scale * _LOG2E), consts)
    return out, lse


def fwd_args(kern: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, q_offsets: Any, kv_offsets: Any, b: int,
             scale: float, inv_div: float = 1.0) -> tuple[Any, ...]:
    """The runtime arguments, in order, of the Gluon forward kernel `kern` (`fwd_plan`'s): the
    one-stream JFA kernel's, or the warp-specialized kernel's (which add GDPA's inv_div)."""
    args = (q, k, v, out, lse, q_offsets, kv_offsets, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), out.stride(0), out.stride(1), b, q.shape[1], scale)
    return args if kern is _jfa_fwd_gluon_kernel else (*args, inv_div)


def jfa_forward_gluon(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, max_kv_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_triton_jfa.jfa_forward` with the Gluon kernel where it serves (`serves`, a non-empty
    batch), else `jfa_forward` itself."""
    from gem_kernels._triton_jfa import _last_dim_contiguous, jfa_forward, pick_config

    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    tq, h, d = q.shape
    if (min(tq, q_offsets.numel() - 1, max_q_len, h) == 0
            or not serves("fwd", q, k, window, pick_config(max_q_len, max_kv_len, d, q.dtype))):
        return jfa_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)
    return forward(q, k, v, q_offsets, kv_offsets, max_q_len, causal, scale)
