"""GDPA's forward on the warp-specialized Gluon kernel (Hopper) that JFA's uses.

Why: issue 15's GDPA target (SiLU causal forward >= 280 TFLOP/s, 1.3x HSTU's public kernel) sits
at the edge on an H100 (255-279 eager, kernels/BENCHMARKS.md 2026-12-07). GDPA's loop is JFA's
without the online softmax: S = Q·Kᵀ, P = act(S·scale) (zero where a key is not visible),
O += P·V, out = O / divisor. In the Triton kernel its SFU work (the sigmoid) and its MMAs run
one after the other in a single instruction stream. `_gluon_jfa._attn_fwd_ws_kernel` with ACT an
activation runs it on the warp-specialized partitions: a loader streaming the q tile and K/V
slots (`cp.async`, zero-filled rows past a sample's end, mbarriers), two consumer warpgroups
owning a 128-row q tile's halves, S_j issued with O += P_{j-1}·V_{j-1} and act(S_j) computed under
the second; optional ping-pong and persistence (`_gluon_jfa.DEFAULT_FWD_TILES`' fields).

**Not yet run on a GPU** (written in a session without one): reached only through `forward`
here (tests, `bench.gluon --fwd-only`), never by `gem_kernels.generalized_dot_product_attention`.
Contract: the Triton forward's (`_gdpa.gdpa_forward_triton`) without a window; bf16/fp16, head
dim 64 or 128, on a Hopper GPU (`_gluon_jfa.problem`). Checked on any machine: its sm_90a build
(`tests/test_sm90_builds.py`), its tile walk in float64 and the partitions' barrier protocol
(`tests/test_gluon_schedule.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from gem_kernels import _gluon_jfa
from gem_kernels._launch import launch_of

ACTIVATIONS = ("silu", "gelu", "relu", "relu2", "sigmoid", "identity")  # `_triton_gdpa._act`'s

DEFAULT_TILES = (128, 128, 12, 3, True, True)  # not measured yet (no GPU has run this kernel)


def fwd_plan(
    tiles: tuple[Any, ...], rows: int, offsets: torch.Tensor, max_len: int, h: int, d: int, causal: bool,
    activation: str, tanh: bool = True, sms: int = 132,
) -> tuple[Any, tuple[int, int], int, dict[str, Any]]:
    """(kernel, grid, B, constexprs and launch options) of the forward at `tiles`, a
    warp-specialized tile set of `_gluon_jfa.fwd_plan` ((128, BLOCK_N, 12, STAGES, True[,
    PINGPONG[, PERSISTENT]])), checked as it checks; `activation` one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: must be one of {ACTIVATIONS}")
    if not (len(tiles) > 4 and tiles[4]):
        raise ValueError(f"tiles={tiles}: GDPA's Gluon forward is the warp-specialized one "
                         f"(128, BLOCK_N, {_gluon_jfa.WS_WARPS}, STAGES, True[, PINGPONG[, PERSISTENT]])")
    return _gluon_jfa.fwd_plan(tiles, rows, offsets, max_len, h, d, causal, sms, activation, tanh)


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
                                     causal, activation, sms=_gluon_jfa.sm_count(q.device))
    out = torch.empty((tq, h, d), dtype=q.dtype, device=q.device)
    if grid[0] == 0 or grid[1] == 0:
        return out.zero_()
    args = _gluon_jfa.fwd_args(kern, q, k, v, out, out, q_offsets, kv_offsets, b, scale, 1.0 / divisor)
    launch_of(kern)(grid, args, consts)
    return out
