# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""Hopper JFA forward: K/V through TMA tensor descriptors, optional warp specialization.

Why this file exists: on an H200 the pointer-load forward (`_triton_jfa.jfa_forward`) reaches
~300 useful TFLOP/s on the issue's jagged batch and ~396 on dense 8x4096x16, against
cuDNN's ~660. Hopper's fast path feeds wgmma from shared memory filled by the TMA engine
(asynchronous bulk copies, no address arithmetic in registers), ideally with a producer warp
issuing the copies while consumer warp groups do the math (warp specialization, as
FlashAttention-3 does). This module is an opt-in twin of `jfa_forward` with that shape; the
lead measures it (`python3 -m gem_kernels.bench.fwd_tma`) before anything routes to it.

Same contract as `jfa_forward`: q/k/v `[T, H, D]` with separate q and kv offsets, causal
bottom-right aligned and sliding windows (`_jagged.visible_mask`; the bounds and masks are
`_triton_jfa`'s own `_kv_bounds` / `_visible`), out `[Tq, H, D]` and lse `[Tq, H]` fp32 in the
log2 domain (+inf for rows that see no key, whose output is 0). No split-kv.

Descriptors (`TmaTiles.device_desc`):
- host (default): `triton.tools.tensor_descriptor.TensorDescriptor` over k and v viewed 2-D
  `[Tkv, H*D]` with their real row stride, block `[BLOCK_N, D]` at `[kv_start + n, h*D]`.
  No allocator. A tile reaching past its sample's end reads the NEXT sample's rows (TMA only
  zero-fills past row Tkv): see "Edge tiles" below. q is loaded and out stored by masked
  pointer ops (a TMA store would write the next sample's rows, which another program owns).
- device: each program builds its q/k/v/out descriptors with `tl.make_tensor_descriptor`
  over rows `[0, end of its sample)`, so TMA zero-fills keys past the sample's end and clips
  the out store at the sample's end. Costs four 128-byte descriptor writes per program into
  a scratch buffer from `triton.set_allocator` (set around the launch, previous one put back).
  Triton's tutorial 06 uses device descriptors for Hopper + warp specialization.

Edge tiles (the ones `_kv_bounds` marks as masked; the middle tiles are whole and visible):
key columns past the sample's end get score -inf by `tl.where` (their values are never
trusted), so their probability is exactly 0. V rows there are multiplied by that 0; with host
descriptors they hold the next sample's values, and 0 * NaN/Inf = NaN would leak a
non-finite value of the next sample into this one. Decision: host mode zeroes those V rows
with `tl.where` (the tile goes shared memory -> registers -> shared memory for the second
wgmma; paid only on the few tiles on the mask's edges, vs the ~L/BLOCK_N whole tiles that
keep the direct TMA -> wgmma path), so no option of this module can mix samples:
out matches `jfa_forward` whatever the neighbours hold. Device mode needs no select (the
hardware already zero-fills there).

Loops: `[lo, f_lo)` and `[f_hi, hi)` masked, `[f_lo, f_hi)` unmasked, each a
`tl.range(..., warp_specialize=WS)` (as the tutorial tags both of its loops), or with
`TmaTiles.one_loop` a single masked loop over `[lo, hi)` (the simplest shape for Triton's
automatic warp specialization, at the price of the mask on every tile).

Fallback: without CUDA capability >= 9, or when a tensor breaks a TMA rule (base 16-byte
aligned, row stride a multiple of 16 bytes, heads packed so `[T, H*D]` is a view: stride(1)
== D, stride(2) == 1), `jfa_forward_tma` calls `jfa_forward` (`tma_fallback_reason` says
why). Under `TRITON_INTERPRET=1` the TMA kernel runs in Triton's interpreter (CPU tests).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import triton
import triton.language as tl

from gem_kernels._launch import cdiv
from gem_kernels._triton_jfa import (_LOG2E, _dot_prec, _kv_bounds, _last_dim_contiguous, _mma, _pow2_clamp,
                                     _softmax_finish, _softmax_step, _upcast, desc_2d, interpreting, jfa_forward,
                                     tma_view_problem)

# TMA box dimensions are at most 256 elements each.
_TMA_MAX_BOX = 256
_HEAD_DIMS = (16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TmaTiles:
    """Tiles and launch parameters of the TMA forward kernel.

    `ws`: warp-specialize the kv loops (`tl.range(..., warp_specialize=True)`; Hopper's
    automatic pass wants 4-warp consumer groups, so num_warps=4 with 128-row blocks).
    `device_desc`: per-program device-side descriptors clipped at the sample's end (see the
    module docstring) instead of host descriptors over the whole tensors.
    `one_loop`: one masked kv loop instead of masked edges + an unmasked middle.
    """

    block_m: int
    block_n: int
    num_warps: int = 8
    num_stages: int = 3
    ws: bool = False
    device_desc: bool = False
    one_loop: bool = False

    @property
    def name(self) -> str:
        extra = "".join(s for s, on in ((" ws", self.ws), (" dev", self.device_desc), (" 1loop", self.one_loop)) if on)
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}{extra}"


def _t(bm: int, bn: int, w: int, s: int, *, ws: bool = False, dev: bool = False, one: bool = False) -> TmaTiles:
    return TmaTiles(block_m=bm, block_n=bn, num_warps=w, num_stages=s, ws=ws, device_desc=dev, one_loop=one)


# The D=128 16-bit configs the bench compares (by `TmaTiles.name`), warp specialization on
# and off for the same tiles. WS configs use 4 warps (Hopper's automatic warp specialization
# partitions 4-warp groups); tutorial 06 pairs Hopper WS with device descriptors, so both
# kinds are listed. On the H200 with triton 3.6 (2026-11-30, kernels/BENCHMARKS.md) every WS
# config fails to compile (triton's NVGPUWarpSpecialization pass rejects these loops), and
# the others run at 0.92-0.99x the pointer kernel: this path stays opt-in, and the GPU tests
# run the configs of `COMPILING_TILES`.
TILES: dict[str, TmaTiles] = {t.name: t for t in (
    _t(128, 128, 8, 3),
    _t(128, 128, 8, 3, dev=True),
    _t(128, 64, 4, 3),
    _t(128, 64, 4, 3, ws=True),
    _t(128, 64, 4, 3, ws=True, dev=True),
    _t(128, 64, 4, 4),
    _t(128, 128, 4, 2),
    _t(128, 128, 4, 2, ws=True),
    _t(128, 128, 4, 2, ws=True, dev=True),   # tutorial 06's Hopper warp-specialized shape
    _t(128, 128, 4, 2, ws=True, dev=True, one=True),
)}


# The configs that compile on the H200 with triton 3.6 (no warp specialization).
COMPILING_TILES: dict[str, TmaTiles] = {n: t for n, t in TILES.items() if not t.ws}


def pick_tiles(max_q_len: int, max_kv_len: int, d: int, dtype: torch.dtype) -> TmaTiles:
    """Heuristic tiles: 16-bit D <= 128 -> 128x128 w8 s3 (the pointer kernel's best, host
    descriptors, no warp specialization) shrunk to short sequences; D = 256 -> 128x64 w8 s2
    (shared memory); fp32 -> 64x32 w4 s2."""
    lowp = dtype != torch.float32
    if not lowp:
        bm_hi, bn_hi, warps, stages = 64, 32, 4, 2
    elif d > 128:
        bm_hi, bn_hi, warps, stages = 128, 64, 8, 2
    else:
        bm_hi, bn_hi, warps, stages = 128, 128, 8, 3
    bm = _pow2_clamp(max_q_len, 16, bm_hi)
    bn = _pow2_clamp(max_kv_len, 16, bn_hi)
    if bm < 128 and warps == 8:
        warps = 4
    return TmaTiles(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


def _resolve_tiles(tiles: TmaTiles | str | None, max_q_len: int, max_kv_len: int, d: int,
                   dtype: torch.dtype) -> TmaTiles:
    if tiles is None:
        return pick_tiles(max_q_len, max_kv_len, d, dtype)
    if isinstance(tiles, str):
        if tiles not in TILES:
            raise ValueError(f"tiles={tiles!r} must be a TmaTiles or one of {sorted(TILES)}")
        tiles = TILES[tiles]
    if not isinstance(tiles, TmaTiles):
        raise TypeError(f"tiles must be a TmaTiles, a name from TILES or None, got {type(tiles).__name__}")
    for field in ("block_m", "block_n"):
        n = getattr(tiles, field)
        if n < 16 or n > _TMA_MAX_BOX or n & (n - 1):
            raise ValueError(f"tiles.{field}={n} must be a power of 2 in [16, {_TMA_MAX_BOX}] (TMA box, wgmma)")
    if tiles.num_warps not in (1, 2, 4, 8, 16) or tiles.num_stages < 1:
        raise ValueError(f"tiles.num_warps={tiles.num_warps} must be a power of 2 <= 16 and "
                         f"tiles.num_stages={tiles.num_stages} >= 1")
    return tiles


def tma_fallback_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None,
                        tiles: TmaTiles | None = None) -> str | None:
    """Why `jfa_forward_tma` would fall back to `jfa_forward` for these tensors (None: it
    runs the TMA kernel). `out` (default: as `torch.empty_like(q)`) and q are checked only for
    device descriptors (host mode reads q and writes out by pointer)."""
    if not interpreting():
        if q.device.type != "cuda":
            return f"q is on {q.device.type}: the TMA kernel needs CUDA (or TRITON_INTERPRET=1)"
        cap = torch.cuda.get_device_capability(q.device)
        if cap[0] < 9:
            return f"CUDA capability {cap[0]}.{cap[1]} < 9.0: no TMA"
    checked = [(k, "k"), (v, "v")]
    if tiles is not None and tiles.device_desc:
        checked += [(q, "q")] + ([(out, "out")] if out is not None else [])
    for t, name in checked:
        why = tma_view_problem(t, name)
        if why is not None:
            return why
    return None


@triton.jit
def _tma_tile(acc, l_i, m_i, q, k_desc, v_desc, kv_row, col, start_n, offs_m, offs_n, shift, lk, scale_log2,
              WINDOW, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
              ZERO_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
              UPCAST: tl.constexpr):
    """One kv tile of the online softmax (FlashAttention-2, Alg. 1) from TMA-loaded K and V.

    K is loaded `[BLOCK_N, D]` and used transposed (K-major B operand, as tutorial 06 does).
    MASKED tiles select the scores with `_visible` (columns past the sample's end included)
    and, with ZERO_V, zero V's rows past the end (host descriptors read the next sample there).
    """
    k = k_desc.load([(kv_row + start_n).to(tl.int32), col])  # TMA offsets must be int32
    qk = _mma(q, k.T, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), DOT_PREC, UPCAST) * scale_log2
    cols = start_n + offs_n
    p, acc, l_i, m_new = _softmax_step(qk, acc, l_i, m_i, offs_m, cols, shift, lk, WINDOW, CAUSAL, HAS_WINDOW,
                                       MASKED)
    v = v_desc.load([(kv_row + start_n).to(tl.int32), col])
    if MASKED and ZERO_V:
        v = tl.where((cols < lk)[:, None], v, tl.zeros_like(v))
    acc = _mma(p.to(v.dtype), v, acc, DOT_PREC, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _jfa_tma_fwd_kernel(
    Q, K, V, O, LSE, QO, KO,
    stride_qt, stride_qh, stride_kt, stride_vt, stride_ot, stride_oh,
    H, scale_log2, WINDOW,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    WS: tl.constexpr, DEVICE_DESC: tl.constexpr, ONE_LOOP: tl.constexpr,
):
    """Grid: axis 0 = B·H, axis 1 = query blocks of the longest sample, in reverse (heavy
    causal tail blocks first; a program past its sample's end exits). K and V are host
    TensorDescriptors `[Tkv, H*D]` (DEVICE_DESC False) or pointers from which this program
    builds descriptors clipped at its sample's end (DEVICE_DESC True, also for q and out)."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    m_start = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    q_start = tl.load(QO + b)
    lq = (tl.load(QO + b + 1) - q_start).to(tl.int32)
    if m_start >= lq:
        return
    kv_start = tl.load(KO + b)
    lk = (tl.load(KO + b + 1) - kv_start).to(tl.int32)
    shift = lk - lq
    # TMA coordinates and shapes are 32-bit (the offsets are int64; rows < 2**31 by far).
    q_row = q_start.to(tl.int32)
    kv_row = kv_start.to(tl.int32)
    col = (h * D).to(tl.int32)

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < lq
    if DEVICE_DESC:
        # Rows [0, end of this sample): TMA zero-fills loads and clips stores past the end.
        q_desc = tl.make_tensor_descriptor(Q, shape=[q_row + lq.to(tl.int32), H * D], strides=[stride_qt, 1],
                                           block_shape=[BLOCK_M, D])
        o_desc = tl.make_tensor_descriptor(O, shape=[q_row + lq.to(tl.int32), H * D], strides=[stride_ot, 1],
                                           block_shape=[BLOCK_M, D])
        k_desc = tl.make_tensor_descriptor(K, shape=[kv_row + lk.to(tl.int32), H * D], strides=[stride_kt, 1],
                                           block_shape=[BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(V, shape=[kv_row + lk.to(tl.int32), H * D], strides=[stride_vt, 1],
                                           block_shape=[BLOCK_N, D])
        q = q_desc.load([(q_row + m_start).to(tl.int32), col])
    else:
        k_desc = K
        v_desc = V
        q = tl.load((Q + q_start * stride_qt + h * stride_qh) + offs_m[:, None] * stride_qt + offs_d[None, :],
                    mask=m_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    lo, f_lo, f_hi, hi = _kv_bounds(m_start, lk, shift, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    ZERO_V: tl.constexpr = not DEVICE_DESC
    if ONE_LOOP:
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, k_desc, v_desc, kv_row, col, start_n, offs_m, offs_n,
                                      shift, lk, scale_log2, WINDOW, CAUSAL, HAS_WINDOW, True, ZERO_V,
                                      BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
    else:
        for start_n in tl.range(lo, f_lo, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, k_desc, v_desc, kv_row, col, start_n, offs_m, offs_n,
                                      shift, lk, scale_log2, WINDOW, CAUSAL, HAS_WINDOW, True, ZERO_V,
                                      BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
        for start_n in tl.range(f_lo, f_hi, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, k_desc, v_desc, kv_row, col, start_n, offs_m, offs_n,
                                      shift, lk, scale_log2, WINDOW, CAUSAL, HAS_WINDOW, False, ZERO_V,
                                      BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
        for start_n in tl.range(f_hi, hi, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, k_desc, v_desc, kv_row, col, start_n, offs_m, offs_n,
                                      shift, lk, scale_log2, WINDOW, CAUSAL, HAS_WINDOW, True, ZERO_V,
                                      BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)

    out, lse2 = _softmax_finish(acc, l_i, m_i)
    if DEVICE_DESC:
        o_desc.store([(q_row + m_start).to(tl.int32), col], out.to(O.dtype.element_ty))
    else:
        tl.store((O + q_start * stride_ot + h * stride_oh) + offs_m[:, None] * stride_ot + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=m_valid[:, None])
    tl.store((LSE + q_start * H + h) + offs_m * H, lse2, mask=m_valid)


# The compiled kernel of the last TMA launch (None under the interpreter): the bench reads its
# TTGIR (did warp specialization happen?), registers and shared memory.
_LAST_COMPILED: list[Any] = [None]


def last_compiled() -> Any:
    """Triton's CompiledKernel of the last `jfa_forward_tma` launch (None if none, or under
    TRITON_INTERPRET=1)."""
    return _LAST_COMPILED[0]


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator protocol: the device descriptors' global scratch (128 B each)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _launch_with_allocator(launch: Any) -> None:
    """Runs `launch()` with `_scratch` as Triton's allocator, then puts the previous one back
    (the allocator is a ContextVar in Triton 3.6/3.7; `set_allocator` alone would clobber a
    caller's). The scratch is taken at launch time on the current stream, so freeing it
    after the launch is stream-ordered and safe."""
    try:
        from triton.runtime import _allocation

        token = _allocation._allocator.set(_scratch)
    except (ImportError, AttributeError):  # a Triton without the ContextVar: set it for good
        triton.set_allocator(_scratch)
        launch()
        return
    try:
        launch()
    finally:
        _allocation._allocator.reset(token)


def jfa_forward_tma(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
    *,
    tiles: TmaTiles | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_triton_jfa.jfa_forward` through TMA descriptors. Returns out `[Tq, H, D]` (q's dtype)
    and lse2 `[Tq, H]` fp32 (log2 domain, +inf = the row sees no key), as `jfa_backward` expects.

    Supports what `jfa_forward` does (full, causal, window; separate q/kv offsets; empty
    sequences) except split-kv and the tile-list schedule: `_triton_jfa.force_config` does not
    apply here (only to the fallback). `tiles`: a `TmaTiles`, a name from `TILES`, or None
    for `pick_tiles`. Falls back to `jfa_forward` (its own heuristic tiles) when
    `tma_fallback_reason` is not None: no CUDA capability >= 9 (except under
    TRITON_INTERPRET=1, where this kernel runs in the interpreter), or k/v (q/out too with
    device descriptors) break a TMA rule.

    Raises:
        ValueError: head dim D of q not in (16, 32, 64, 128, 256) or k/v not `[Tkv, H, D]`
            like q; `tiles` unknown or not a power-of-2 block in [16, 256].
        TypeError: `tiles` neither a TmaTiles, a str nor None.
    """
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [T, H, D]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    tq, h, d = q.shape
    if d not in _HEAD_DIMS:
        raise ValueError(f"q.shape[2]={d} (head dim D) must be one of {_HEAD_DIMS}")
    if k.shape[1:] != (h, d) or v.shape != k.shape:
        raise ValueError(f"k and v must be [Tkv, H={h}, D={d}] like q; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    t = _resolve_tiles(tiles, max_q_len, max_kv_len, d, q.dtype)
    b = q_offsets.numel() - 1
    if tq == 0 or b == 0 or max_q_len == 0 or h == 0:
        return torch.zeros_like(q), torch.full((tq, h), math.inf, dtype=torch.float32, device=q.device)
    _LAST_COMPILED[:] = [None]
    if k.shape[0] == 0:
        # No key anywhere: a descriptor needs a non-empty tensor; every row is empty.
        return torch.zeros_like(q), torch.full((tq, h), math.inf, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    if tma_fallback_reason(q, k, v, out, t) is not None:
        return jfa_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale)
    lse = torch.empty((tq, h), dtype=torch.float32, device=q.device)
    if t.device_desc:
        kd, vd = k, v
    else:
        kd, vd = desc_2d(k, t.block_n), desc_2d(v, t.block_n)
    grid = (b * h, cdiv(max_q_len, t.block_m))

    def launch() -> None:
        _LAST_COMPILED[:] = [_jfa_tma_fwd_kernel[grid](
            q, kd, vd, out, lse, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), v.stride(0), out.stride(0), out.stride(1),
            h, scale * _LOG2E, window if window is not None else 0,
            CAUSAL=bool(causal), HAS_WINDOW=window is not None, D=d,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, DOT_PREC=_dot_prec(q.dtype), UPCAST=_upcast(q),
            WS=t.ws, DEVICE_DESC=t.device_desc, ONE_LOOP=t.one_loop,
            num_warps=t.num_warps, num_stages=t.num_stages,
        )]

    if t.device_desc and not interpreting():
        _launch_with_allocator(launch)
    else:
        launch()
    return out, lse
