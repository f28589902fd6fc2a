"""Analytic forward FLOPs for the actual jagged lengths of a batch.

Counts what `torch.utils.flop_counter.FlopCounterMode` counts — matrix products (mm, addmm,
bmm, einsum lowered to bmm, attention's two products) at 2 FLOPs per multiply-add — and
nothing else (no norms, activations, softmax, RoPE, embedding lookups): the usual MFU
convention. Attention counts only *visible* query-key pairs (jagged lengths, the sliding
window), i.e. useful work; a padded or masked implementation does more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shapes:
    """Host-side sizes of one batch: B samples, sequence lengths (host ints)."""

    lengths: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


def linear(rows: int, fan_in: int, fan_out: int) -> float:
    return 2.0 * rows * fan_in * fan_out


def band_pairs(n: int, window: int | None) -> int:
    """Visible pairs of non-causal self-attention over n tokens with band |i-j| < window."""
    if window is None or window >= n:
        return n * n
    w = window - 1
    # n on the diagonal + 2 * sum_{k=1..w} (n - k)
    return n + 2 * (w * n - w * (w + 1) // 2)


def attention(pairs: int, heads: int, head_dim: int) -> float:
    """q·kᵀ and p·v: 2 products of 2·D FLOPs per visible pair and head."""
    return 4.0 * pairs * heads * head_dim
