# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call,no-any-return"
"""Triton Jagged Flash Attention: forward (online softmax) and FA2-style backward.

Why this file exists: padding jagged histories to the longest one wastes up to half the
attention compute (DESIGN.md §4 kernels). These kernels read q/k/v `[T, H, D]` in place with
separate q and kv offsets, so only real tokens are loaded and only visible tiles computed.

Grid (all kernels): axis 0 = B·H (sample, head), axis 1 = blocks of the *longer-side loop's
outer dimension* sized by the host-int max length (`max_q_len` for fwd/dq, `max_kv_len` for
dk/dv). A program past its sequence's end exits at once: the grid is host-computable, no
device sync, no per-batch tile list. Axis 1 runs in reverse so the heavy tail blocks of
causal sequences start first (a cheap form of load balancing).

Masking (bottom-right aligned, see `_jagged.visible_mask`): a query block only loops over the
kv tiles its rows can see (causal / window bounds computed per block), so fully masked
tiles are skipped; the element mask is applied inside the visited tiles.

Numerics: scores in the log2 domain (`scale·log2 e` folded in), fp32 accumulation, the
per-row log-sum-exp `lse2 = m + log2 l` stored for the backward; rows that see no key store
lse2 = +inf so every recomputed probability is exactly 0 (output 0, gradients 0, no NaN).

Backward (Dao, FlashAttention-2, §3.2): delta = rowsum(dO·O) (a Triton kernel), one
kernel accumulates dK/dV for a kv block iterating over the q blocks that see it, one kernel
accumulates dQ for a q block iterating over its kv tiles. No atomics. Or, with
`JfaConfig.one_pass` (`GEM_JFA_BWD=one_pass`), the dK/dV kernel alone also adds dQ into an
fp32 workspace with atomics (as FlashAttention-2's CUDA backward does): S and P are computed
once per tile pair instead of twice. Opt-in on Hopper (`JfaConfig.tma`, `JfaConfig.tma_loads`;
no faster on the H200, kernels/BENCHMARKS.md): dQ added by one TMA bulk reduce per tile pair
instead of element-wise atomics, and q/dO tiles loaded through tensor descriptors (see
`_tma_modes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gem_kernels import _gluon_jfa
from gem_kernels._jagged import same_view
from gem_kernels._launch import CachedLaunch, cdiv, launch_of

_LOG2E = 1.4426950408889634
_NO_SPLIT = 1 << 30  # one split covering any kv length


@dataclasses.dataclass(frozen=True, kw_only=True)
class JfaTiles:
    """Tile sizes and launch parameters of one JFA kernel."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class JfaConfig:
    """Tiles of the three kernels (forward, dK/dV, dQ)."""

    fwd: JfaTiles
    dkdv: JfaTiles
    dq: JfaTiles
    # Split-kv ("flash decoding") for few queries over long keys: each (q block, head) is
    # cut into kv chunks of `kv_split` keys run by separate programs, then combined by
    # log-sum-exp. 0 = off. A multiple of fwd.block_n and dq.block_n.
    kv_split: int = 0
    # Launch only real tiles, heaviest sample first (see `_schedule`): True = always,
    # False = never (the plain (B·H, max blocks) grid with early exits), None = when the
    # plain grid would be mostly empty programs (long-tailed lengths).
    tile_list: bool | None = None
    # The backward's tiles (dK/dV, dQ) in batch order instead (takes precedence over
    # `tile_list`): grid (real tiles, heads), each sample's tiles first to last, located
    # in-kernel; programs running together read one sample's q/dO or k/v (L2 hits).
    # `fwd_in_order`: the same for the forward.
    in_order: bool = False
    fwd_in_order: bool = False
    # In batch order, the q-side kernels (forward, dQ) walk each sample's tiles last to first:
    # for causal attention the heavy tiles start first (dK/dV keeps first to last).
    reverse_q: bool = False
    # Backward in one pass (see `jfa_backward`): the dK/dV kernel, with `dkdv` tiles and
    # schedule, also adds dQ into an fp32 workspace with atomics (5 matmuls per tile pair
    # instead of 7; `dq` tiles and `kv_split` then play no part in the backward). False = the
    # two-pass FlashAttention-2 backward (dK/dV kernel, then dQ kernel; no atomics).
    one_pass: bool = False
    # One-pass backward only (ignored by the two-pass one), Hopper TMA, opt-in (on the H200
    # 0.98-1.02x the plain one-pass backward, kernels/BENCHMARKS.md):
    # `tma` adds each tile pair's [BLOCK_M, D] dQ through a tensor descriptor's `atomic_add`
    # (one TMA bulk reduce, `cp.reduce.async.bulk.tensor`, instead of BLOCK_M·D element-wise
    # atomics), on CUDA with compute capability >= 9 only; elsewhere, and always under
    # TRITON_INTERPRET=1 (the interpreter has no descriptor reduce), the same math runs with
    # `tl.atomic_add`. `tma_loads` (independent of `tma`) loads the inner loop's q and dO tiles
    # through tensor descriptors over their 2-D `[T, H·D]` views (on SM90+ and under the
    # interpreter, which emulates descriptor loads), when those views meet TMA's rules (see
    # `_tma_view_ok`); else pointer loads. `_tma_modes` makes both choices on the host.
    tma: bool = False
    tma_loads: bool = False


_FORCED: list[JfaConfig] = []


@contextlib.contextmanager
def force_config(cfg: JfaConfig) -> Iterator[None]:
    """Use `cfg` instead of the heuristic inside the block (tests, bench sweeps)."""
    _FORCED.append(cfg)
    try:
        yield
    finally:
        _FORCED.pop()


def _pow2_clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(n, 1))))


# The backward the heuristic picks; `GEM_JFA_BWD` overrides it per process (GPU benches,
# trainer A/B runs). Two-pass, except one-pass where every query sequence is short (at most
# ONE_PASS_MAX_Q_LEN rows: the model's pooling seeds, its last layer's query slots), where
# two-pass's dQ kernel re-reads all of K and V for a few queries. On an H100 (gem-kernels
# 0.3.8, `gem_kernels.bench.bwd`, kernels/BENCHMARKS.md 2026-12-07) two-pass was the fastest
# of ours on all 10 self-attention mixes (1.08-1.29x one-pass, also on the long ones that
# the earlier rule, one-pass from 4,096 keys, gave to one-pass), and one-pass 1.37x two-pass
# on the pooling's 32 queries per sample. Never one-pass while torch's deterministic
# algorithms are on: its dQ atomics make dQ's last bits order-dependent.
ONE_PASS_DEFAULT = True
ONE_PASS_MAX_Q_LEN = 32
BWD_ENV = "GEM_JFA_BWD"
_BWD_CHOICES = {"one_pass": True, "two_pass": False}
# torch's FlashAttention-2 varlen backward fed with our forward's output and lse
# (`_flash2`): the default from the seventh session (on the H200 then 1.03-1.16x our
# backwards) until gem-kernels 0.3.9. Since 0.3.8's 32-bit row offsets ours are faster: on the
# H100, two-pass beat it on all 10 self-attention mixes of `bench.bwd` (1.20-1.49x; the issue
# batch 1.741 vs 2.110 ms, the trainer's lengths 22.43 vs 27.21 ms), and the eager h200
# trainer step was 0.2407-0.2418 s with two-pass against 0.2571-0.2584 s with it. It stays
# available: `GEM_JFA_BWD=flash` asks for it where it runs (FLASH_DEFAULT=True makes it the
# default again).
FLASH_DEFAULT = False
BWD_FLASH = "flash"
# FlashAttention-4's Hopper/Blackwell backward (`_flash4`, the optional flash-attn-4 package)
# comes first where it runs (`GEM_JFA_BWD=flash4` asks for it; unset, FLASH4_DEFAULT): on the
# H200 the fastest backward on all 8 cases of `bench.flash4` (1.5-1.9x FlashAttention-2's fed
# with the same forward), and the compiled h200 trainer step 0.1847 s against 0.2370 s
# (kernels/ and trainer/BENCHMARKS.md, 2026-12-03).
FLASH4_DEFAULT = True
BWD_FLASH4 = "flash4"
_ENV_VALUES = (*_BWD_CHOICES, BWD_FLASH, BWD_FLASH4)


def env_choice(name: str, choices: Sequence[str]) -> str | None:
    """The value of the per-process switch `name` (None when unset or empty); anything not in
    `choices` is a ValueError naming the variable and its values."""
    value = os.environ.get(name, "")
    if value == "":
        return None
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {sorted(choices)} (or unset)")
    return value


def _default_two_pass_reason() -> str | None:
    """Why the default rule picks two-pass whatever the length (None: it goes by length)."""
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic algorithms on"
    return None if ONE_PASS_DEFAULT else "the default"


def bwd_one_pass_from_env(max_q_len: int | None = None) -> bool:
    """Which of *our* backwards runs: `GEM_JFA_BWD=one_pass|two_pass`; unset, empty or `flash`
    (where flash cannot run): the default rule, `ONE_PASS_DEFAULT` and `max_q_len <=
    ONE_PASS_MAX_Q_LEN` (the longest query sequence; None: not known, two-pass) and torch's
    deterministic algorithms off."""
    value = env_choice(BWD_ENV, _ENV_VALUES)
    if value in _BWD_CHOICES:
        return _BWD_CHOICES[value]
    short = max_q_len is not None and max_q_len <= ONE_PASS_MAX_Q_LEN
    return short and _default_two_pass_reason() is None


def bwd_uses_flash4(q: torch.Tensor, k: torch.Tensor, window: int | None) -> bool:
    """Whether `jfa_backward` hands this call to FlashAttention-4's backward: `GEM_JFA_BWD=flash4`
    (or unset with FLASH4_DEFAULT), not under `force_config`, and only where it runs."""
    if _FORCED:
        return False
    value = env_choice(BWD_ENV, _ENV_VALUES)
    if value != BWD_FLASH4 and not (value is None and FLASH4_DEFAULT):
        return False
    from gem_kernels._flash4 import unavailable_reason

    return unavailable_reason(q, window, k=k) is None


def bwd_uses_flash(q: torch.Tensor, window: int | None) -> bool:
    """Whether `jfa_backward` hands this call to torch's FlashAttention-2 backward: not under
    `force_config`, not when `GEM_JFA_BWD` names one of ours, and only where it runs."""
    if _FORCED:
        return False
    value = env_choice(BWD_ENV, _ENV_VALUES)
    if value in _BWD_CHOICES or (value is None and not FLASH_DEFAULT):
        return False
    from gem_kernels._flash2 import unavailable_reason

    return unavailable_reason(q, window) is None


def bwd_rule() -> str:
    """`jfa_backward`'s choice in words (what `gem_kernels.jfa_backward_rule` returns)."""
    value = env_choice(BWD_ENV, _ENV_VALUES)
    if value in _BWD_CHOICES:
        return f"{value} ({BWD_ENV}, {value})"
    if value == BWD_FLASH4 or (value is None and FLASH4_DEFAULT):
        src = f" ({BWD_ENV}, flash4)" if value == BWD_FLASH4 else ""
        from gem_kernels._flash4 import _import_error

        here = "imports here" if _import_error() is None else "does not import here"
        return (f"flash4{src} (FlashAttention-4's backward) on CUDA fp16/bf16 SM90/SM100 without a window "
                f"where flash-attn-4 imports (it {here}); else " + _rule_without_flash4(value))
    return _rule_without_flash4(value)


def _rule_without_flash4(value: str | None) -> str:
    why = _default_two_pass_reason()
    ours = f"one_pass up to {ONE_PASS_MAX_Q_LEN} queries per sequence, two_pass above"
    if why == "the default":
        ours = "two_pass"
    elif why is not None:
        # torch's FlashAttention-2 backward is not used either (unavailable_reason).
        return f"two_pass ({why})"
    if value == BWD_FLASH or FLASH_DEFAULT:
        src = f" ({BWD_ENV}, flash)" if value == BWD_FLASH else ""
        return f"flash{src} (torch's FlashAttention-2 backward) on CUDA fp16/bf16 without a window; else {ours}"
    return ours


TMA_ENV = "GEM_JFA_TMA"
_TMA_CHOICES = {"off": (False, False), "reduce": (True, False), "loads": (True, True)}


def bwd_tma_from_env() -> tuple[bool, bool]:
    """`GEM_JFA_TMA=off|reduce|loads` -> the heuristic one-pass config's (`tma`, `tma_loads`):
    a per-process switch for GPU A/B runs (unset or empty: off, the default: no faster on the
    H200)."""
    return _TMA_CHOICES[env_choice(TMA_ENV, list(_TMA_CHOICES)) or "off"]


def pick_config(max_q_len: int, max_kv_len: int, d: int, dtype: torch.dtype) -> JfaConfig:
    """The forced config (see `force_config`; its `one_pass` is used as is) or the heuristic one
    (with the backward chosen by `GEM_JFA_BWD`, else by `bwd_one_pass_from_env`'s rule, and the
    one-pass TMA flags by `GEM_JFA_TMA`)."""
    if _FORCED:
        return _FORCED[-1]
    cfg = _heuristic_config(max_q_len, max_kv_len, d, dtype, bwd_one_pass_from_env(max_q_len))
    tma, loads = bwd_tma_from_env()
    if cfg.one_pass and (tma or loads):
        cfg = dataclasses.replace(cfg, tma=tma, tma_loads=loads)
    return cfg


@functools.lru_cache(maxsize=1024)
def _heuristic_config(
    max_q_len: int, max_kv_len: int, d: int, dtype: torch.dtype, one_pass: bool = False
) -> JfaConfig:
    """Heuristic tiles per shape (issue 3's three shapes), from the H200 sweep in BENCHMARKS.md.

    - long self-attention: forward 128×128 tiles, 8 warps; backward dK/dV 32×64 (q×kv) and
      dQ 64×32, 4 warps, 3 stages (the fastest measured at D=128).
    - cross (long q, short kv): BLOCK_N shrinks to the kv length (>=16) so no tile is mostly
      padding; BLOCK_M stays large.
    - pooling (few q, long kv): BLOCK_M shrinks to the q length (>=16), BLOCK_N = 128.
    - one-pass backward (`one_pass`): the dK/dV kernel tiles widen to 32×128 (q×kv), 8 warps,
      3 stages for 16-bit D <= 128: a wider kv block halves the dQ atomics per FLOP (one
      [BLOCK_M, D] add per tile pair); BLOCK_M = 64 (FlashAttention-2's CUDA choice) was much
      slower in the H200 sweeps (`bench.table --bwd-compare`), 32×128 w8 s3 the fastest.
    """
    lowp = dtype != torch.float32
    bm = _pow2_clamp(max_q_len, 16, 128 if lowp else 64)
    bn = _pow2_clamp(max_kv_len, 16, (128 if d <= 128 else 64) if lowp else (32 if d > 64 else 64))
    warps = 8 if (bm >= 128 and bn >= 128) or (bm >= 128 and d >= 128) else 4
    fwd = JfaTiles(block_m=bm, block_n=bn, num_warps=warps, num_stages=3 if d <= 128 else 2)
    # Backward: dK/dV holds two [BLOCK_N, D] fp32 accumulators, dQ one [BLOCK_M, D].
    small = 32 if (d >= 128 or not lowp) else 64
    dkdv = JfaTiles(
        block_m=_pow2_clamp(max_q_len, 16, small),
        block_n=_pow2_clamp(max_kv_len, 16, 64),
        num_warps=4,
        num_stages=3 if d <= 128 else 2,
    )
    dq = JfaTiles(
        block_m=_pow2_clamp(max_q_len, 16, 64),
        block_n=_pow2_clamp(max_kv_len, 16, small),
        num_warps=4,
        num_stages=3 if d <= 128 else 2,
    )
    # Split-kv and the tile-list schedule are built and tested but off by default: on the H200
    # (BENCHMARKS.md) neither beat the plain grid in eager use (their extra torch ops cost
    # more host time than they saved on the device). Enable them through `force_config`.
    # Batch order is the default of the two-pass backward (`in_order`) and of the forward
    # when a sample has more than one q tile (`fwd_in_order`). On the H200 (issue 15's batch,
    # 2026-12-04, kernels/BENCHMARKS.md), 7 interleaved rounds on each of three boxes, against
    # the plain grid: forward+backward 1.17x / 1.17x / 1.18x full and 1.09x / 1.06x / 1.04x
    # causal; the forward 1.04x / 1.14x / 1.07x full and 0.98x / 1.10x / 1.01x causal. The
    # trainer's pooling forward (32 queries per sample: one q tile) was 0.80x in batch order,
    # so one-tile queries keep the grid. The one-pass backward runs in batch order too, though
    # its dQ atomics could collide more with neighbouring programs on one sample: on the
    # trainer's batch (H=8, ~262k tokens) fwd+bwd 304.5 vs 295.3 TFLOP/s in the grid, 5 of 5
    # interleaved rounds (`bench.schedule --onepass-ab 5`, 2026-12-04).
    if one_pass:
        wide = lowp and d <= 128
        dkdv = JfaTiles(
            block_m=_pow2_clamp(max_q_len, 16, 32 if wide else small),
            block_n=_pow2_clamp(max_kv_len, 16, 128 if wide else 64),
            num_warps=8 if wide else 4,
            # 3 stages: the H200 sweep's best one-pass tile in every case (32x128 w8 s3: 1.12x
            # two-pass on a long mix (mean ~4,000 tokens), 0.98x / 0.92x on the issue batch
            # full / causal)
            num_stages=3 if wide else 2,
        )
    return JfaConfig(fwd=fwd, dkdv=dkdv, dq=dq, kv_split=0, tile_list=False, in_order=True,
                     fwd_in_order=max_q_len > bm, one_pass=one_pass)


@triton.jit
def _mma(a, b, acc, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b. UPCAST works around Triton's CPU interpreter, whose bf16 dot is wrong."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


@triton.jit
def _visible(rows, cols, shift, lk, WINDOW, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Element mask for query rows [BM] x key cols [BN] (rows index the query side)."""
    ipos = rows[:, None] + shift
    j = cols[None, :]
    mask = j < lk
    if CAUSAL:
        mask = mask & (j <= ipos)
    if HAS_WINDOW:
        if CAUSAL:
            mask = mask & (j > ipos - WINDOW)
        else:
            mask = mask & (ipos - j < WINDOW) & (j - ipos < WINDOW)
    return mask


@triton.jit
def _visible_t(rows, cols, shift, lk, WINDOW, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """`_visible` transposed: key cols [BN] x query rows [BM] (the dK/dV kernel's layout)."""
    ipos = rows[None, :] + shift
    j = cols[:, None]
    mask = j < lk
    if CAUSAL:
        mask = mask & (j <= ipos)
    if HAS_WINDOW:
        if CAUSAL:
            mask = mask & (j > ipos - WINDOW)
        else:
            mask = mask & (ipos - j < WINDOW) & (j - ipos < WINDOW)
    return mask


@triton.jit
def _locate(offsets, pid, B, BLOCK: tl.constexpr, BLOCK_B: tl.constexpr):
    """(sample b, tile index within b, total tiles) of tile `pid` of the jagged batch.

    Computed in-kernel from the offsets (per-sample tile counts, their inclusive cumsum), so
    the host launches one kernel and nothing else; costs one [BLOCK_B] load per program.
    """
    idx = tl.arange(0, BLOCK_B)
    m = idx < B
    lo = tl.load(offsets + idx, mask=m, other=0)
    hi = tl.load(offsets + idx + 1, mask=m, other=0)
    cnt = ((hi - lo + (BLOCK - 1)) // BLOCK).to(tl.int32)
    cum = tl.cumsum(cnt, 0)
    b = tl.sum((cum <= pid).to(tl.int32), 0)
    first = tl.sum(tl.where(idx == b, cum - cnt, 0), 0)
    return b, pid - first, tl.sum(cnt, 0)


@triton.jit
def _schedule(OFF, CUM, ORDER, H, B, BLOCK: tl.constexpr, TILE_LIST: tl.constexpr, LOG2B: tl.constexpr,
              IN_ORDER: tl.constexpr):
    """(sample b, head h, block start, ok) of this program; `OFF` are the tiled side's offsets.

    Grid mode: axis 0 = B·H, axis 1 = blocks of the longest sequence in reverse (programs
    past a sequence's end exit). Tile-list mode: axis 0 = H × (an upper bound on the real
    tiles, cdiv(T, BLOCK) + B); `CUM` is the inclusive cumsum of per-sample tile counts in
    the order `ORDER` (heaviest sample first), found by binary search; no empty programs
    beyond the bound's slack, and the heaviest work starts first. In-order mode (IN_ORDER):
    axis 0 = the same bound on the real tiles in batch order, each sample's first to last,
    found in-kernel from `OFF` (`_locate`, 2^LOG2B >= B lanes: no host ops), axis 1 = heads;
    programs running together then read the same sample's keys (L2 hits). IN_ORDER = 2: the
    same, each sample's tiles last to first (for causal q tiles, the heavy ones first).
    """
    if IN_ORDER:
        pid = tl.program_id(0)
        h = tl.program_id(1)
        b, blk, total = _locate(OFF, pid, B, BLOCK, 1 << LOG2B)
        if IN_ORDER == 2:
            bb = tl.minimum(b, B - 1)  # b == B past the last tile (ok is False then)
            n = (tl.load(OFF + bb + 1) - tl.load(OFF + bb) + BLOCK - 1) // BLOCK
            blk = (n - 1 - blk).to(blk.dtype)
        return b, h, blk * BLOCK, pid < total
    pid = tl.program_id(0)
    h = pid % H
    if TILE_LIST:
        t = pid // H
        lo = 0
        hi = B
        for _ in tl.static_range(LOG2B):
            mid = (lo + hi) // 2
            c = tl.load(CUM + tl.minimum(mid, B - 1))
            right = (c <= t) & (mid < hi)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(right, hi, mid)
        ok = lo < B
        idx = tl.minimum(lo, B - 1)
        prev = tl.load(CUM + idx - 1, mask=idx > 0, other=0)
        n_blocks = tl.load(CUM + idx) - prev
        b = tl.load(ORDER + idx)
        blk = n_blocks - 1 - (t - prev)  # heavy (late, for causal) blocks first
    else:
        b = pid // H
        blk = tl.num_programs(1) - 1 - tl.program_id(1)
        length = tl.load(OFF + b + 1) - tl.load(OFF + b)
        ok = blk * BLOCK < length
    return b, h, blk * BLOCK, ok


@triton.jit
def _kv_bounds(m_start, lk, shift, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """kv tiles that query rows [m_start, m_start + BLOCK_M) may see, as lo <= f_lo <= f_hi <= hi.

    [lo, hi) holds every visible key (lo a multiple of BLOCK_N); tiles in [f_lo, f_hi) are
    visible to every row of the block and skip the element mask; the edges are masked.
    """
    lo = 0
    hi = lk
    if CAUSAL:
        hi = tl.minimum(hi, m_start + BLOCK_M + shift)
    if HAS_WINDOW:
        lo = tl.maximum(lo, m_start + shift - WINDOW + 1)
        if not CAUSAL:
            hi = tl.minimum(hi, m_start + BLOCK_M - 1 + shift + WINDOW)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.maximum(hi, lo)
    # Full tiles: n + BLOCK_N <= lk, and every row's rule holds for every column of the tile.
    f_lo = lo
    f_hi = lk
    if CAUSAL:
        f_hi = tl.minimum(f_hi, m_start + shift + 1)
    if HAS_WINDOW:
        f_lo = tl.maximum(f_lo, m_start + BLOCK_M + shift - WINDOW)
        if not CAUSAL:
            f_hi = tl.minimum(f_hi, m_start + shift + WINDOW)
    f_lo = ((f_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    f_hi = (tl.maximum(f_hi, 0) // BLOCK_N) * BLOCK_N
    f_lo = tl.minimum(f_lo, hi)
    f_hi = tl.maximum(tl.minimum(f_hi, hi), f_lo)
    return lo, f_lo, f_hi, hi


@triton.jit
def _split_bounds(lo, f_lo, f_hi, hi, s_lo, SPLIT):
    """Clamps the kv tile ranges to this program's split [s_lo, s_lo + SPLIT)."""
    lo = tl.maximum(lo, s_lo)
    hi = tl.maximum(tl.minimum(hi, s_lo + SPLIT), lo)
    f_lo = tl.minimum(tl.maximum(f_lo, lo), hi)
    f_hi = tl.maximum(tl.minimum(f_hi, hi), f_lo)
    return lo, f_lo, f_hi, hi


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d,
              stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """One kv tile of the online softmax (Dao, FlashAttention-2, Alg. 1)."""
    cols = start_n + offs_n
    if MASKED:
        kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None],
                     mask=(cols < lk)[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :],
                    mask=(cols < lk)[:, None], other=0.0)
    else:
        kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
    qk = _mma(q, kT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), DOT_PREC, UPCAST) * scale_log2
    p, acc, l_i, m_new = _softmax_step(qk, acc, l_i, m_i, offs_m, cols, shift, lk, WINDOW, CAUSAL, HAS_WINDOW,
                                       MASKED)
    acc = _mma(p.to(v.dtype), v, acc, DOT_PREC, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _softmax_step(qk, acc, l_i, m_i, offs_m, cols, shift, lk, WINDOW, CAUSAL: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr):
    """The online-softmax update of one tile's log2-domain scores `qk` [BM, BN] (shared by the
    pointer and the TMA forward): masked tiles select with `_visible`, a row that has seen no
    key yet keeps m = -inf (its p and alpha are computed against 0, so no NaN). Returns
    (p, acc rescaled, l, m) — the caller adds p @ V."""
    if MASKED:
        qk = tl.where(_visible(offs_m, cols, shift, lk, WINDOW, CAUSAL, HAS_WINDOW), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = m_new
    p = tl.exp2(qk - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, acc * alpha[:, None], l_i, m_new


@triton.jit
def _jfa_fwd_kernel(
    Q, K, V, O, LSE, QO, KO,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_os, stride_ls, SPLIT, CUM, ORDER, B,
    H, scale_log2, WINDOW,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr,
):
    b, h, m_start, ok = _schedule(QO, CUM, ORDER, H, B, BLOCK_M, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    q_start = tl.load(QO + b)
    lq = (tl.load(QO + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(KO + b)
    lk = (tl.load(KO + b + 1) - kv_start).to(tl.int32)
    shift = lk - lq

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < lq
    q = tl.load((Q + q_start * stride_qt + h * stride_qh) + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=m_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    lo, f_lo, f_hi, hi = _kv_bounds(m_start, lk, shift, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    lo, f_lo, f_hi, hi = _split_bounds(lo, f_lo, f_hi, hi, tl.program_id(2) * SPLIT, SPLIT)
    k_base = K + kv_start * stride_kt + h * stride_kh
    v_base = V + kv_start * stride_vt + h * stride_vh
    for start_n in range(lo, f_lo, BLOCK_N):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                  stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                                  CAUSAL, HAS_WINDOW, True, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
    for start_n in range(f_lo, f_hi, BLOCK_N):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                  stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                                  CAUSAL, HAS_WINDOW, False, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
    for start_n in range(f_hi, hi, BLOCK_N):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                  stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                                  CAUSAL, HAS_WINDOW, True, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)

    out, lse2 = _softmax_finish(acc, l_i, m_i)
    O += tl.program_id(2) * stride_os
    LSE += tl.program_id(2) * stride_ls
    tl.store((O + q_start * stride_ot + h * stride_oh) + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=m_valid[:, None])
    tl.store((LSE + q_start * H + h) + offs_m * H, lse2, mask=m_valid)


@triton.jit
def _softmax_finish(acc, l_i, m_i):
    """The forward's epilogue (shared by the pointer and the TMA kernel): out = acc / l and the
    log2-domain lse2 = m + log2 l; a row that saw no key gets out 0 and lse2 = +inf, so the
    backward's recomputed probabilities are exactly 0 there."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    return acc / l_safe[:, None], tl.where(empty, float("inf"), m_i + tl.log2(l_safe))


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_m, offs_n, offs_d,
               stride_qt, stride_dot, stride_dqt, H, shift, lq, lk, scale, scale_log2, WINDOW,
               q_desc, do_desc, dq_desc, q_start, col0,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr,
               UPCAST: tl.constexpr, DQ_ATOMIC: tl.constexpr, DQ_TMA: tl.constexpr, TMA_LOADS: tl.constexpr):
    """dV += Pᵀ dO and dK += dSᵀ Q for one q block (FlashAttention-2 backward, transposed).

    DQ_ATOMIC (the one-pass backward): also dQ[rows] += scale · dS K, added into the fp32
    workspace at `dq_base` with relaxed atomics (other kv blocks of the sample add to the
    same rows; order does not matter, the workspace is read only by a later launch). With
    DQ_TMA the add is one TMA bulk reduce of the [BLOCK_M, D] tile through `dq_desc` (the
    workspace as 2-D [T, H·D], block at row q_start + start_m, column col0 = h·D). A bulk
    reduce has no mask: rows past lq (the next sample's, in masked tiles) must add exactly 0.
    They do: their q and dO rows are 0 and lse2 = +inf, so pT = 0 and dS = 0; and the tile is
    also zeroed there explicitly (`tl.where`) so that not even a non-finite k can leak into
    the next sample. Rows past T are clipped by the descriptor's bounds.

    TMA_LOADS: q and dO come through `q_desc` / `do_desc` (2-D [T, H·D] views, block
    [BLOCK_M, D]); such a load is bounded by T only, so in masked tiles the rows past lq (the
    next sample's data) are zeroed, as the pointer loads' masks do.
    """
    rows = start_m + offs_m
    if MASKED:
        r_valid = rows < lq
        lse2 = tl.load(lse_base + rows * H, mask=r_valid, other=float("inf"))
        delta = tl.load(delta_base + rows * H, mask=r_valid, other=0.0)
    else:
        lse2 = tl.load(lse_base + rows * H)
        delta = tl.load(delta_base + rows * H)
    if TMA_LOADS:
        row0 = (q_start + start_m).to(tl.int32)
        q = q_desc.load([row0, col0])
        do = do_desc.load([row0, col0])
        if MASKED:
            q = tl.where(r_valid[:, None], q, tl.zeros_like(q))
            do = tl.where(r_valid[:, None], do, tl.zeros_like(do))
        qT = tl.trans(q)
    elif MASKED:
        qT = tl.load(q_base + rows[None, :] * stride_qt + offs_d[:, None], mask=r_valid[None, :], other=0.0)
        do = tl.load(do_base + rows[:, None] * stride_dot + offs_d[None, :], mask=r_valid[:, None], other=0.0)
    else:
        qT = tl.load(q_base + rows[None, :] * stride_qt + offs_d[:, None])
        do = tl.load(do_base + rows[:, None] * stride_dot + offs_d[None, :])
    kq = _mma(k, qT, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), DOT_PREC, UPCAST) * scale_log2
    pT = tl.exp2(kq - lse2[None, :])
    if MASKED:
        pT = tl.where(_visible_t(rows, offs_n, shift, lk, WINDOW, CAUSAL, HAS_WINDOW), pT, 0.0)
    dv = _mma(pT.to(do.dtype), do, dv, DOT_PREC, UPCAST)
    dpT = _mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), DOT_PREC, UPCAST)
    dsT = (pT * (dpT - delta[None, :])).to(qT.dtype)
    dk = _mma(dsT, tl.trans(qT), dk, DOT_PREC, UPCAST)
    if DQ_ATOMIC:
        dq = _mma(tl.trans(dsT), k, tl.zeros([BLOCK_M, D], dtype=tl.float32), DOT_PREC, UPCAST) * scale
        if DQ_TMA:
            if MASKED:  # rows past lq (the next sample's): exactly 0 already, kept so explicitly
                dq = tl.where(r_valid[:, None], dq, 0.0)
            dq_desc.atomic_add([(q_start + start_m).to(tl.int32), col0], dq)
        else:
            dq_ptrs = dq_base + rows[:, None] * stride_dqt + offs_d[None, :]
            if MASKED:  # rows past lq belong to the next sample (or past the end): never touch them
                tl.atomic_add(dq_ptrs, dq, mask=r_valid[:, None], sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _jfa_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, QO, KO,
    Q_DESC, DO_DESC, DQ_DESC,  # tensor descriptors when TMA_LOADS / DQ_TMA (else unused plain tensors)
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
    CUM, ORDER, B, H, scale, scale_log2, WINDOW,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr,
    DQ_ATOMIC: tl.constexpr,  # one-pass backward: also add dQ into the fp32 workspace DQ (else unused)
    DQ_TMA: tl.constexpr,  # one-pass: add dQ by TMA bulk reduce through DQ_DESC (host: `_tma_modes`)
    TMA_LOADS: tl.constexpr,  # q and dO tiles through Q_DESC / DO_DESC (host: `_tma_modes`)
):
    b, h, n_start, ok = _schedule(KO, CUM, ORDER, H, B, BLOCK_N, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    kv_start = tl.load(KO + b)
    lk = (tl.load(KO + b + 1) - kv_start).to(tl.int32)
    q_start = tl.load(QO + b)
    lq = (tl.load(QO + b + 1) - q_start).to(tl.int32)
    shift = lk - lq

    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    n_valid = offs_n < lk
    k = tl.load((K + kv_start * stride_kt + h * stride_kh) + offs_n[:, None] * stride_kt + offs_d[None, :],
                mask=n_valid[:, None], other=0.0)
    v = tl.load((V + kv_start * stride_vt + h * stride_vh) + offs_n[:, None] * stride_vt + offs_d[None, :],
                mask=n_valid[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)

    # Query blocks that may see keys [n_start, n_start + BLOCK_N): [lo, hi); blocks in
    # [f_lo, f_hi) are all-valid rows that see every key of the tile (no element mask).
    lo = 0
    hi = lq
    f_lo = 0
    f_hi = lq
    if CAUSAL:
        lo = tl.maximum(lo, n_start - shift)
        f_lo = tl.maximum(f_lo, n_start + BLOCK_N - 1 - shift)
    if HAS_WINDOW:
        hi = tl.minimum(hi, n_start + BLOCK_N - 1 - shift + WINDOW)
        f_hi = tl.minimum(f_hi, n_start - shift + WINDOW)
        if not CAUSAL:
            lo = tl.maximum(lo, n_start - shift - WINDOW + 1)
            f_lo = tl.maximum(f_lo, n_start + BLOCK_N - shift - WINDOW)
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = tl.maximum(hi, lo)
    f_lo = tl.maximum(f_lo, lo)
    f_lo = tl.minimum(((f_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, hi)
    f_hi = (tl.maximum(f_hi, 0) // BLOCK_M) * BLOCK_M
    f_hi = tl.maximum(tl.minimum(f_hi, hi), f_lo)
    q_base = Q + q_start * stride_qt + h * stride_qh
    do_base = DO + q_start * stride_dot + h * stride_doh
    lse_base = LSE + q_start * H + h
    delta_base = DELTA + q_start * H + h
    dq_base = DQ + q_start * stride_dqt + h * stride_dqh
    col0 = h * D  # this head's first column in the descriptors' 2-D [T, H·D] views
    # One-pass: the kv-block programs of a (sample, head) run at once; walking the q blocks in
    # the same order they would add into the same dQ rows at the same time (atomic contention).
    # So each starts its full blocks at `rot`, spread evenly over [f_lo, f_hi) by kv-block
    # index, and wraps around: [lo, f_lo) masked, [rot, f_hi) full, [f_hi, hi) masked,
    # [f_lo, rot) full (the masked lo edge is the causal/band diagonal, already distinct per kv
    # block). Every loop keeps one constexpr mask mode. Two-pass: rot = f_lo, the plain order.
    rot = f_lo
    if DQ_ATOMIC:
        n_full = (f_hi - f_lo) // BLOCK_M
        n_kv = (lk + BLOCK_N - 1) // BLOCK_N  # >= 1: this program's block is inside lk
        rot = f_lo + ((n_start // BLOCK_N) * n_full // n_kv) * BLOCK_M
    for start_m in range(lo, f_lo, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_m,
                            offs_n, offs_d, stride_qt, stride_dot, stride_dqt, H, shift, lq, lk, scale, scale_log2,
                            WINDOW, Q_DESC, DO_DESC, DQ_DESC, q_start, col0, CAUSAL, HAS_WINDOW, True, BLOCK_M,
                            BLOCK_N, D, DOT_PREC, UPCAST, DQ_ATOMIC, DQ_TMA, TMA_LOADS)
    for start_m in range(rot, f_hi, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_m,
                            offs_n, offs_d, stride_qt, stride_dot, stride_dqt, H, shift, lq, lk, scale, scale_log2,
                            WINDOW, Q_DESC, DO_DESC, DQ_DESC, q_start, col0, CAUSAL, HAS_WINDOW, False, BLOCK_M,
                            BLOCK_N, D, DOT_PREC, UPCAST, DQ_ATOMIC, DQ_TMA, TMA_LOADS)
    for start_m in range(f_hi, hi, BLOCK_M):
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_m,
                            offs_n, offs_d, stride_qt, stride_dot, stride_dqt, H, shift, lq, lk, scale, scale_log2,
                            WINDOW, Q_DESC, DO_DESC, DQ_DESC, q_start, col0, CAUSAL, HAS_WINDOW, True, BLOCK_M,
                            BLOCK_N, D, DOT_PREC, UPCAST, DQ_ATOMIC, DQ_TMA, TMA_LOADS)
    if DQ_ATOMIC:
        for start_m in range(f_lo, rot, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, start_m, offs_m,
                                offs_n, offs_d, stride_qt, stride_dot, stride_dqt, H, shift, lq, lk, scale,
                                scale_log2, WINDOW, Q_DESC, DO_DESC, DQ_DESC, q_start, col0, CAUSAL, HAS_WINDOW,
                                False, BLOCK_M, BLOCK_N, D, DOT_PREC, UPCAST, DQ_ATOMIC, DQ_TMA, TMA_LOADS)

    dk = dk * scale
    tl.store((DK + kv_start * stride_dkt + h * stride_dkh) + offs_n[:, None] * stride_dkt + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=n_valid[:, None])
    tl.store((DV + kv_start * stride_dvt + h * stride_dvh) + offs_n[:, None] * stride_dvt + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=n_valid[:, None])


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d,
             stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
             CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, MASKED: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """dQ += dS K for one kv tile (FlashAttention-2 backward)."""
    cols = start_n + offs_n
    if MASKED:
        c_valid = (cols < lk)[None, :]
        kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=c_valid, other=0.0)
        vT = tl.load(v_base + cols[None, :] * stride_vt + offs_d[:, None], mask=c_valid, other=0.0)
    else:
        kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
        vT = tl.load(v_base + cols[None, :] * stride_vt + offs_d[:, None])
    qk = _mma(q, kT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), DOT_PREC, UPCAST) * scale_log2
    p = tl.exp2(qk - lse2[:, None])
    if MASKED:
        p = tl.where(_visible(offs_m, cols, shift, lk, WINDOW, CAUSAL, HAS_WINDOW), p, 0.0)
    dp = _mma(do, vT, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), DOT_PREC, UPCAST)
    ds = p * (dp - delta[:, None])
    return _mma(ds.to(kT.dtype), tl.trans(kT), dq, DOT_PREC, UPCAST)


@triton.jit
def _jfa_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, QO, KO,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_dqs, SPLIT, CUM, ORDER, B,
    H, scale, scale_log2, WINDOW,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    TILE_LIST: tl.constexpr, LOG2B: tl.constexpr, IN_ORDER: tl.constexpr,
):
    b, h, m_start, ok = _schedule(QO, CUM, ORDER, H, B, BLOCK_M, TILE_LIST, LOG2B, IN_ORDER)
    if not ok:
        return
    q_start = tl.load(QO + b)
    lq = (tl.load(QO + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(KO + b)
    lk = (tl.load(KO + b + 1) - kv_start).to(tl.int32)
    shift = lk - lq

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < lq
    q = tl.load((Q + q_start * stride_qt + h * stride_qh) + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=m_valid[:, None], other=0.0)
    do = tl.load((DO + q_start * stride_dot + h * stride_doh) + offs_m[:, None] * stride_dot + offs_d[None, :],
                 mask=m_valid[:, None], other=0.0)
    lse2 = tl.load((LSE + q_start * H + h) + offs_m * H, mask=m_valid, other=float("inf"))
    delta = tl.load((DELTA + q_start * H + h) + offs_m * H, mask=m_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    lo, f_lo, f_hi, hi = _kv_bounds(m_start, lk, shift, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    lo, f_lo, f_hi, hi = _split_bounds(lo, f_lo, f_hi, hi, tl.program_id(2) * SPLIT, SPLIT)
    k_base = K + kv_start * stride_kt + h * stride_kh
    v_base = V + kv_start * stride_vt + h * stride_vh
    for start_n in range(lo, f_lo, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                      stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                      CAUSAL, HAS_WINDOW, True, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
    for start_n in range(f_lo, f_hi, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                      stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                      CAUSAL, HAS_WINDOW, False, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)
    for start_n in range(f_hi, hi, BLOCK_N):
        dq = _dq_tile(dq, q, do, lse2, delta, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                      stride_kt, stride_vt, shift, lk, scale_log2, WINDOW,
                      CAUSAL, HAS_WINDOW, True, BLOCK_M, BLOCK_N, DOT_PREC, UPCAST)

    dq = dq * scale
    DQ += tl.program_id(2) * stride_dqs
    tl.store((DQ + q_start * stride_dqt + h * stride_dqh) + offs_m[:, None] * stride_dqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=m_valid[:, None])


@triton.jit
def _jfa_bwd_delta_kernel(O, DO, DELTA, DQ, n_rows, H, stride_ot, stride_oh, stride_dot, stride_doh,
                          D: tl.constexpr, BLOCK: tl.constexpr,
                          ZERO_DQ: tl.constexpr):  # one-pass: also zero the contiguous fp32 dQ workspace
    """delta[t, h] = Σ_d dO[t, h, d] · O[t, h, d] in fp32 (FlashAttention-2 backward preprocess).

    With ZERO_DQ it also zeroes the one-pass backward's dQ accumulator `[T, H, D]` (the rows it
    visits anyway), which saves a separate memset launch.
    """
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = rows < n_rows
    t = rows // H
    h = rows % H
    offs_d = tl.arange(0, D)
    o = tl.load(O + (t * stride_ot + h * stride_oh)[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    do = tl.load(DO + (t * stride_dot + h * stride_doh)[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    tl.store(DELTA + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=valid)
    if ZERO_DQ:
        tl.store(DQ + rows[:, None] * D + offs_d[None, :], tl.zeros([BLOCK, D], dtype=tl.float32),
                 mask=valid[:, None])


def interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def tma_view_problem(t: torch.Tensor, name: str) -> str | None:
    """Why `t` `[T, H, D]` seen as the 2-D `[T, H·D]` (strides `[t.stride(0), 1]`) cannot be a
    TMA descriptor (None: it can). TMA's rules: heads adjacent (`stride(1) == D`, or H = 1),
    last stride 1, rows not overlapping, row stride, head width and base 16-byte aligned. A
    strided view of a fused projection (q = qkv[:, 0] of `[T, 3, H, D]`) passes; a head-strided
    or odd-offset one not. Shared by the backward's `_tma_modes` and the TMA forward."""
    tq, h, d = t.shape
    e = t.element_size()
    if tq == 0 or h == 0 or d == 0:
        return f"{name}.shape={tuple(t.shape)} is empty (a descriptor needs elements)"
    if t.stride(2) != 1:
        return f"{name}.stride(2)={t.stride(2)} must be 1 (TMA: last stride 1)"
    if h > 1 and t.stride(1) != d:
        return f"{name}.stride(1)={t.stride(1)} must equal D={d} (heads packed: [T, H*D] view)"
    if t.stride(0) < h * d:
        return f"{name}.stride(0)={t.stride(0)} must be >= H*D={h * d} (rows must not overlap)"
    if (t.stride(0) * e) % 16 or (d * e) % 16:
        return f"{name}.stride(0)={t.stride(0)} and D={d} elements must be multiples of 16 bytes (TMA)"
    if t.data_ptr() % 16:
        return f"{name}.data_ptr() must be 16-byte aligned (TMA base)"
    return None


def _tma_view_ok(t: torch.Tensor) -> bool:
    return tma_view_problem(t, "t") is None


def _tma_modes(
    cfg: JfaConfig, q: torch.Tensor, dout: torch.Tensor, dq_acc: torch.Tensor
) -> tuple[bool, bool]:
    """(DQ_TMA, TMA_LOADS) of the dK/dV kernel: what `cfg.tma` / `cfg.tma_loads` become here.

    The dQ bulk reduce needs a compiled kernel on CUDA compute capability >= 9 (TMA); under
    TRITON_INTERPRET=1 (no descriptor reduce in the interpreter), on older GPUs, or if the fp32
    workspace is not contiguous, it is False: the same dQ through `tl.atomic_add`. Descriptor
    loads also run in the interpreter (it emulates them), so CPU tests cover that path; they
    need q and dO to pass `_tma_view_ok`, else pointer loads. Two-pass: (False, False).
    """
    if not cfg.one_pass or not (cfg.tma or cfg.tma_loads):
        return False, False
    interpret = interpreting()
    hopper = q.device.type == "cuda" and not interpret and torch.cuda.get_device_capability(q.device)[0] >= 9
    reduce = cfg.tma and hopper and dq_acc.dtype == torch.float32 and dq_acc.is_contiguous() and _tma_view_ok(dq_acc)
    loads = cfg.tma_loads and (hopper or interpret) and _tma_view_ok(q) and _tma_view_ok(dout)
    return reduce, loads


def desc_2d(t: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A host TMA descriptor over `t` `[T, H, D]` as 2-D `[T, H·D]` (real row stride), block
    `[block_rows, D]` (the backward's q/dO/dQ tiles, the TMA forward's K/V tiles)."""
    tq, h, d = t.shape
    return TensorDescriptor(t, [tq, h * d], [t.stride(0), 1], [block_rows, d])


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(2) == 1 else t.contiguous()


def _check_into(into: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """`jfa_backward`'s `into` must be a tuple (dq, dk, dv) of views shaped like q, k, v (or
    None), of q's dtype and device, with a unit stride on D (the kernels write rows of D)."""
    if not isinstance(into, tuple) or len(into) != 3:
        raise ValueError(f"into must be a tuple (dq, dk, dv) of tensors or None, got {type(into).__name__}")
    for name, t, like in zip(("dq", "dk", "dv"), into, (q, k, v)):
        if t is not None and (t.shape != like.shape or t.dtype != q.dtype or t.device != q.device
                              or t.stride(-1) != 1):
            raise ValueError(f"into's {name} {tuple(t.shape)} {t.dtype} on {t.device} (strides {t.stride()}) must "
                             f"be {tuple(like.shape)} {q.dtype} on {q.device} with a unit stride on D")


def settle(grads: tuple[torch.Tensor, ...], buf: torch.Tensor) -> torch.Tensor:
    """`buf[:, i] = grads[i]` for a packed gradient `[T, len(grads), H, D]` whose slots were
    handed to `jfa_backward(into=)`: a gradient already written into its slot stays; if none
    is (torch's FlashAttention-2 backward returns fresh tensors), one `torch.stack(out=)` (two
    `copy_` into the strided halves measured ~0.5 ms slower than the stack at the trainer's
    size on an H100, CHANGELOG 0.3.6); else each fresh one is copied in. Returns `buf`."""
    fresh = [i for i, g in enumerate(grads) if not same_view(g, buf[:, i])]
    if len(fresh) == len(grads):
        torch.stack(grads, 1, out=buf)
    else:
        for i in fresh:
            buf[:, i].copy_(grads[i])
    return buf


def _upcast(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and (t.device.type != "cuda" or interpreting())


def _dot_prec(dtype: torch.dtype) -> str:
    # fp32 inputs get exact fp32 dots (the reference dtype); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def _schedule_args(
    offsets: torch.Tensor, other_offsets: torch.Tensor, rows: int, max_len: int, block: int, h: int,
    tile_list: bool | None, in_order: int = 0,
) -> tuple[tuple[int, int], dict[str, object]]:
    """Grid (axes 0 and 1) and the schedule kernel args for tiling `offsets`' side by `block`.

    The tile list pays a few tiny device ops (lengths, argsort, cumsum; no host sync) and is
    used only when the plain grid would launch mostly empty programs (long-tailed lengths).
    `in_order` (before `tile_list`) is the tile list in batch order, found in-kernel (no ops):
    0 off, 1 each sample's tiles first to last, 2 last to first (`_schedule`'s IN_ORDER).
    """
    b = offsets.numel() - 1
    list_tiles = cdiv(rows, block) + b
    if in_order:
        grid = (in_order_tiles(rows, b, max_len, block), h)
        log2b = max(4, (b - 1).bit_length())
        return grid, dict(CUM=offsets, ORDER=offsets, B=b, TILE_LIST=False, LOG2B=log2b, IN_ORDER=int(in_order))
    grid_tiles = b * cdiv(max_len, block)
    if tile_list or (tile_list is None and grid_tiles > 2 * list_tiles):
        lengths = offsets[1:] - offsets[:-1]
        work = other_offsets[1:] - other_offsets[:-1]  # work per tile ∝ the other side's length
        order = torch.argsort(work, descending=True, stable=True)
        cum = ((lengths[order] + block - 1) // block).cumsum(0)
        return (h * list_tiles, 1), dict(CUM=cum, ORDER=order, B=b, TILE_LIST=True, LOG2B=max(1, b.bit_length()),
                                         IN_ORDER=0)
    return (b * h, cdiv(max_len, block)), dict(CUM=offsets, ORDER=offsets, B=b, TILE_LIST=False, LOG2B=1,
                                                      IN_ORDER=0)


def in_order_tiles(rows: int, b: int, max_len: int, block: int) -> int:
    """Programs per head of a batch-order schedule (`_schedule_args`' `in_order`): every real
    `block`-row tile of `b` samples and `rows` rows, bounded both ways (host ints)."""
    by_rows, by_len = cdiv(rows, block) + b, b * cdiv(max_len, block)
    return by_rows if by_rows < by_len else by_len


def _fwd_launch() -> CachedLaunch:
    """The forward kernel's cached launch (`_launch.launch_of`, as the backward's)."""
    return launch_of(_jfa_fwd_kernel)


def _q_order(cfg: JfaConfig, in_order: bool) -> int:
    """`_schedule_args`' in_order for a q-side kernel (forward, dQ) of `cfg`."""
    return (2 if cfg.reverse_q else 1) if in_order else 0


def jfa_forward(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward. Returns out `[Tq, H, D]` and lse2 `[Tq, H]` fp32 (log2 domain, +inf = empty)."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    if tq == 0 or b == 0 or max_q_len == 0 or h == 0:
        return torch.zeros_like(q), torch.full((tq, h), math.inf, dtype=torch.float32, device=q.device)
    cfg = pick_config(max_q_len, max_kv_len, d, q.dtype)
    t = cfg.fwd
    splits = cdiv(max_kv_len, cfg.kv_split) if cfg.kv_split else 1
    # Every row of [0, Tq) belongs to a sequence (offsets contract), so the kernel writes all
    # of out/lse: no memset. With split-kv, partial results go to an fp32 workspace.
    if splits > 1:
        out_ws = torch.empty((splits, tq, h, d), dtype=torch.float32, device=q.device)
        lse_ws = torch.empty((splits, tq, h), dtype=torch.float32, device=q.device)
    else:
        out_ws = torch.empty_like(q).unsqueeze(0)
        lse_ws = torch.empty((1, tq, h), dtype=torch.float32, device=q.device)
    # Through `_fwd_launch` (gem_kernels._launch.CachedLaunch): Triton's binder once per
    # specialization, then the compiled kernel's runner (host time: the table's eager figures).
    ws_strides = (out_ws.stride(1), out_ws.stride(2), out_ws.stride(0), lse_ws.stride(0))
    (g0, g1), args, consts = fwd_launch_args(cfg, q, k, v, out_ws, lse_ws, ws_strides, splits, q_offsets, kv_offsets,
                                             max_q_len, causal, window, scale)
    _fwd_launch()((g0, g1, splits), args, consts)
    if splits == 1:
        return out_ws[0], lse_ws[0]
    return _combine_splits(out_ws, lse_ws, q.dtype)


def fwd_launch_args(
    cfg: JfaConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_ws: torch.Tensor, lse_ws: torch.Tensor,
    ws_strides: tuple[int, int, int, int], splits: int, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid axes 0 and 1, runtime arguments, constexprs and launch options) of the forward
    kernel writing the workspaces `out_ws` `[S, Tq, H, D]` and `lse_ws` `[S, Tq, H]` (S =
    `splits` kv splits, the grid's axis 2), whose strides are `ws_strides` (out's row, head and
    split strides, lse's split stride). Shared by `jfa_forward` and the JFA eager plan
    (`_jfa._remember`, which passes stand-ins for the workspaces with their strides), so the
    plan keeps the binary this launch selects."""
    tq, h, d = q.shape
    t = cfg.fwd
    grid, sched = _schedule_args(q_offsets, kv_offsets, tq, max_q_len, t.block_m, h, cfg.tile_list,
                                 _q_order(cfg, cfg.fwd_in_order))
    args = (q, k, v, out_ws, lse_ws, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            *ws_strides, cfg.kv_split if splits > 1 else _NO_SPLIT, sched["CUM"], sched["ORDER"], sched["B"],
            h, scale * _LOG2E, window if window is not None else 0)
    consts = dict(CAUSAL=causal, HAS_WINDOW=window is not None, D=d,
                  BLOCK_M=t.block_m, BLOCK_N=t.block_n, DOT_PREC=_dot_prec(q.dtype), UPCAST=_upcast(q),
                  TILE_LIST=sched["TILE_LIST"], LOG2B=sched["LOG2B"], IN_ORDER=sched["IN_ORDER"],
                  num_warps=t.num_warps, num_stages=t.num_stages)
    return grid, args, consts


def _combine_splits(
    out_ws: torch.Tensor, lse_ws: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merges split-kv partials `[S, Tq, H, D]` + lse2 `[S, Tq, H]` by log-sum-exp (base 2)."""
    lse = torch.where(torch.isposinf(lse_ws), -math.inf, lse_ws)  # empty split: weight 0
    m = lse.amax(0)
    m_safe = torch.where(torch.isinf(m), 0.0, m)
    w = torch.exp2(lse - m_safe)
    denom = w.sum(0)
    out = (w.unsqueeze(-1) * out_ws).sum(0) / torch.where(denom == 0, 1.0, denom).unsqueeze(-1)
    lse2 = torch.where(denom == 0, math.inf, m_safe + torch.log2(torch.where(denom == 0, 1.0, denom)))
    return out.to(dtype), lse2


def jfa_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    causal: bool,
    window: int | None,
    scale: float,
    into: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward. Returns dq, dk, dv (zeros for rows of empty or invisible sequences).

    `into`: optional views (dq, dk, dv), each None or shaped like q / k / v (q's dtype, unit
    stride on D), that the backward writes into where its kernel can: FlashAttention-4's
    writes every one given, ours dk and dv (any row/head strides; dq comes from a workspace,
    except that `GEM_JFA_GLUON`'s dQ kernel writes dq too), torch's FlashAttention-2 none. Each
    returned tensor is then either the view given (`_jagged.same_view`) or a fresh one, which
    the caller moves in: `settle` (one stack where all are fresh), or the rotary ops' one
    rotation pass. The packed ops pass the slots of one
    gradient: the halves of kv's `[Tkv, 2, H, D]` (`jfa_bwd_kv`), the slots of `[T, 3, H, D]`
    (`jfa_bwd_qkv`), so no copy assembles it afterwards.

    Where `bwd_uses_flash4` says so, FlashAttention-4's backward (`_flash4.flash4_backward`, the
    optional flash-attn-4 package); else where `bwd_uses_flash` says so, torch's FlashAttention-2
    varlen backward (`_flash2.flash_backward`, dQ by atomics); otherwise one of ours:

    Two-pass (FlashAttention-2 §3.2): delta, then a dK/dV kernel per kv block and a dQ kernel
    per q block, each recomputing S = QKᵀ and P (7 matmuls per tile pair), no atomics.
    One-pass (`JfaConfig.one_pass`): delta (which also zeroes an fp32 dQ workspace), then the
    dK/dV kernel alone, adding each tile's dS K into the workspace with atomics (5 matmuls),
    then a cast of the workspace to q's dtype (none for fp32). The atomic sums make dQ's
    last bits depend on the order of arrival (not bitwise reproducible run to run).
    One-pass with `JfaConfig.tma` / `tma_loads` (see `_tma_modes`): dQ added by TMA bulk
    reduces and / or q, dO loaded through tensor descriptors on Hopper; under
    TRITON_INTERPRET=1 `tma` falls back to the `tl.atomic_add` path (same math).
    """
    dout, q, k, v = (_last_dim_contiguous(t) for t in (dout, q, k, v))
    tq, h, d = q.shape
    b = q_offsets.numel() - 1
    # The buffers the kernels write into where they can (None: allocate).
    dst: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] = (None, None, None)
    if into is not None:
        _check_into(into, q, k, v)
        dst = into
    if tq == 0 or k.shape[0] == 0 or b == 0 or h == 0 or max_q_len == 0 or max_kv_len == 0:
        dq0, dk0, dv0 = (torch.zeros_like(x) if t is None else t.zero_() for t, x in zip(dst, (q, k, v)))
        return dq0, dk0, dv0
    if bwd_uses_flash4(q, k, window):
        from gem_kernels._flash4 import flash4_backward

        return flash4_backward(dout, q, k, v, out, lse, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, scale,
                               dq=dst[0], dk=dst[1], dv=dst[2])
    if bwd_uses_flash(q, window):
        from gem_kernels._flash2 import flash_backward

        return flash_backward(dout, q, k, v, out, lse, q_offsets, kv_offsets, max_q_len, max_kv_len, causal,
                              scale)
    cfg = pick_config(max_q_len, max_kv_len, d, q.dtype)
    # The kernels write every row of dk/dv (offsets contract): no memset. They take any row
    # and head strides, so the slots of a packed gradient are written in place.
    dk = torch.empty_like(k) if dst[1] is None else dst[1]
    dv = torch.empty_like(v) if dst[2] is None else dst[2]
    # One-pass: every dQ row is a sum over kv blocks; rows no kv block sees stay 0.
    dq_acc = torch.empty((tq, h, d), dtype=torch.float32, device=q.device) if cfg.one_pass else dk
    # FA2 preprocess: delta_i = sum_d dO_id · O_id (fp32).
    out = _last_dim_contiguous(out)
    delta = torch.empty((tq, h), dtype=torch.float32, device=q.device)
    grid, args, consts = bwd_delta_args(cfg, out, dout, delta, dq_acc)
    launch_of(_jfa_bwd_delta_kernel)(grid, args, consts)
    if _gluon_jfa.serves("dkdv", q, k, window, cfg):  # GEM_JFA_GLUON: the kernel's Gluon twin
        _gluon_jfa.dkdv(q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets, max_kv_len, causal, scale)
    else:
        dq_tma, tma_loads = _tma_modes(cfg, q, dout, dq_acc)
        grid, args, consts = bwd_dkdv_args(cfg, q, k, v, dout, lse, delta, dk, dv, dq_acc, q_offsets, kv_offsets,
                                           max_kv_len, causal, window, scale, dq_tma, tma_loads)
        if dq_tma or tma_loads:  # descriptor arguments: Triton's own launch (CachedLaunch keys tensors and ints)
            _jfa_bwd_dkdv_kernel[grid](*args, **consts)
        else:
            launch_of(_jfa_bwd_dkdv_kernel)(grid, args, consts)
    if cfg.one_pass:
        return dq_acc.to(q.dtype), dk, dv
    if _gluon_jfa.serves("dq", q, k, window, cfg):  # GEM_JFA_GLUON
        dq = torch.empty_like(q) if dst[0] is None else dst[0]  # written in place (any row/head strides)
        _gluon_jfa.dq(q, k, v, dout, lse, delta, dq, q_offsets, kv_offsets, max_q_len, causal, scale)
        return dq, dk, dv
    splits = cdiv(max_kv_len, cfg.kv_split) if cfg.kv_split else 1
    if splits > 1:
        dq_ws = torch.empty((splits, tq, h, d), dtype=torch.float32, device=q.device)
    else:
        dq_ws = torch.empty_like(q).unsqueeze(0)
    (g0, g1), args, consts = bwd_dq_args(cfg, q, k, v, dout, lse, delta, dq_ws, splits, q_offsets, kv_offsets,
                                         max_q_len, causal, window, scale)
    launch_of(_jfa_bwd_dq_kernel)((g0, g1, splits), args, consts)
    dq = dq_ws[0] if splits == 1 else dq_ws.sum(0).to(q.dtype)
    return dq, dk, dv


# The launches' builders below are shared by `jfa_backward` and the JFA backward plan
# (`_jfa._remember_backward`, which passes stand-ins for the buffers), so the plan keeps the
# binaries these launches select. Each returns (grid, runtime arguments, constexprs and launch
# options).


def bwd_delta_args(
    cfg: JfaConfig, out: torch.Tensor, dout: torch.Tensor, delta: torch.Tensor, dq_acc: torch.Tensor,
) -> tuple[tuple[int, ...], tuple[Any, ...], dict[str, Any]]:
    """The delta kernel (one-pass: it also zeroes the fp32 dQ workspace `dq_acc`)."""
    tq, h, d = out.shape
    args = (out, dout, delta, dq_acc, tq * h, h, out.stride(0), out.stride(1), dout.stride(0), dout.stride(1))
    return (cdiv(tq * h, 64),), args, dict(D=d, BLOCK=64, ZERO_DQ=cfg.one_pass, num_warps=4)


def bwd_dkdv_args(
    cfg: JfaConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dq_acc: torch.Tensor, q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor, max_kv_len: int, causal: bool, window: int | None, scale: float, dq_tma: bool,
    tma_loads: bool,
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """The dK/dV kernel (one-pass: adding dQ into `dq_acc`; else `dq_acc` is not read)."""
    h, d = q.shape[1], q.shape[2]
    grid, sched = _schedule_args(kv_offsets, q_offsets, k.shape[0], max_kv_len, cfg.dkdv.block_n, h, cfg.tile_list,
                                 int(cfg.in_order))
    bm = cfg.dkdv.block_m
    args = (q, k, v, dout, lse, delta, dk, dv, dq_acc, q_offsets, kv_offsets,
            desc_2d(q, bm) if tma_loads else q, desc_2d(dout, bm) if tma_loads else dout,
            desc_2d(dq_acc, bm) if dq_tma else dq_acc,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            dq_acc.stride(0), dq_acc.stride(1),
            sched["CUM"], sched["ORDER"], sched["B"], h, scale, scale * _LOG2E, window if window is not None else 0)
    consts = dict(CAUSAL=causal, HAS_WINDOW=window is not None, D=d, DOT_PREC=_dot_prec(q.dtype), UPCAST=_upcast(q),
                  TILE_LIST=sched["TILE_LIST"], LOG2B=sched["LOG2B"], IN_ORDER=sched["IN_ORDER"],
                  BLOCK_M=bm, BLOCK_N=cfg.dkdv.block_n, DQ_ATOMIC=cfg.one_pass, DQ_TMA=dq_tma, TMA_LOADS=tma_loads,
                  num_warps=cfg.dkdv.num_warps, num_stages=cfg.dkdv.num_stages)
    return grid, args, consts


def bwd_dq_args(
    cfg: JfaConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dq_ws: torch.Tensor, splits: int, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
    max_q_len: int, causal: bool, window: int | None, scale: float,
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """The two-pass dQ kernel writing `dq_ws` `[splits, Tq, H, D]` (grid axis 2: the kv splits)."""
    h, d = q.shape[1], q.shape[2]
    grid, sched = _schedule_args(q_offsets, kv_offsets, q.shape[0], max_q_len, cfg.dq.block_m, h, cfg.tile_list,
                                 _q_order(cfg, cfg.in_order))
    args = (q, k, v, dout, lse, delta, dq_ws, q_offsets, kv_offsets,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dout.stride(0), dout.stride(1), dq_ws.stride(1), dq_ws.stride(2), dq_ws.stride(0),
            cfg.kv_split if splits > 1 else _NO_SPLIT, sched["CUM"], sched["ORDER"], sched["B"],
            h, scale, scale * _LOG2E, window if window is not None else 0)
    consts = dict(CAUSAL=causal, HAS_WINDOW=window is not None, D=d, DOT_PREC=_dot_prec(q.dtype), UPCAST=_upcast(q),
                  TILE_LIST=sched["TILE_LIST"], LOG2B=sched["LOG2B"], IN_ORDER=sched["IN_ORDER"],
                  BLOCK_M=cfg.dq.block_m, BLOCK_N=cfg.dq.block_n,
                  num_warps=cfg.dq.num_warps, num_stages=cfg.dq.num_stages)
    return grid, args, consts
