"""Balancing work across ranks: token-budget batching and base-batch shuffling.

Base-batch shuffling (GEM, "Training GEM at LLM scale"): a global step's data is cut into
small sub-batches ("base batches"); every rank computes the same cost of every sub-batch
from the sequence lengths alone (cheap metadata), sorts them by cost and merges the heaviest
with the lightest into each rank's batch. Every rank runs the same deterministic function
on the same lengths, so they agree on the assignment without any communication, and each
rank then materialises only its own sub-batches.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

CostFn = Callable[[np.ndarray], np.ndarray]


def attention_cost(lengths: np.ndarray) -> np.ndarray:
    """Default per-sample cost: len² (dense self-attention FLOPs are quadratic in length)."""
    x = np.asarray(lengths, dtype=np.float64)
    out: np.ndarray = x * x
    return out


def token_cost(lengths: np.ndarray) -> np.ndarray:
    """Per-sample cost: len (for linear-cost models, e.g. windowed attention)."""
    return np.asarray(lengths, dtype=np.float64)


def token_budget_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Cuts a stream of samples, in order, into consecutive batches of at most `max_tokens` tokens.

    A sample longer than `max_tokens` forms a batch of its own (nothing is dropped).

    Args:
        lengths: [N] sequence lengths.
        max_tokens: token budget per batch (>= 1).

    Returns:
        Index arrays (int64) of each batch, covering 0..N-1 in order.
    """
    if max_tokens < 1:
        raise ValueError(f"{max_tokens=} must be >= 1")
    L = np.asarray(lengths, dtype=np.int64)
    if L.ndim != 1 or (L.size and L.min() < 0):
        raise ValueError(f"lengths must be 1-D and >= 0, got shape {L.shape}")
    out: list[np.ndarray] = []
    start, tokens = 0, 0
    for i, n in enumerate(L.tolist()):
        if i > start and tokens + n > max_tokens:
            out.append(np.arange(start, i, dtype=np.int64))
            start, tokens = i, 0
        tokens += n
    if start < L.size:
        out.append(np.arange(start, L.size, dtype=np.int64))
    return out


def shuffle_base_batches(costs: Sequence[float] | np.ndarray, world_size: int, *,
                         max_swaps: int | None = None, tol: float = 1e-3) -> list[list[int]]:
    """Assigns sub-batches to ranks so that every rank's total cost is close to the mean.

    1. Sort sub-batches by cost, heaviest first, and deal them out in rounds of
       `world_size`: in each round the heaviest remaining sub-batch goes to the currently
       lightest rank, the next to the next-lightest, ... (for two rounds this is exactly
       "heaviest merged with lightest").
    2. Refine: repeatedly swap one sub-batch of the heaviest rank with one of a lighter rank
       when that lowers the heavier of the two (the swap that best halves their gap). With
       heavy-tailed costs, dealing alone leaves ~10-30 % imbalance; the swaps remove most of it.

    Every rank gets the same number of sub-batches (same sample count when sub-batches are
    equal-sized). Deterministic (ties broken by index), so all ranks compute the same
    answer from the same lengths without communicating.

    Args:
        costs: [n] cost of each sub-batch; n must be a multiple of world_size.
        world_size: number of ranks.
        max_swaps: cap on refinement swaps (default 4 * n); 0 gives plain dealing.
        tol: stop refining once max rank cost <= (1 + tol) * mean.

    Returns:
        For each rank, the sub-batch indices it takes, in increasing order.
    """
    c = np.asarray(costs, dtype=np.float64)
    if world_size < 1:
        raise ValueError(f"{world_size=} must be >= 1")
    if c.ndim != 1 or c.size % world_size:
        raise ValueError(f"len(costs)={c.size} must be a multiple of {world_size=}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0):
        raise ValueError("costs must be finite and >= 0")
    order = np.lexsort((np.arange(c.size), -c))  # by cost desc, then index
    load = np.zeros(world_size)
    taken: list[list[int]] = [[] for _ in range(world_size)]
    for r0 in range(0, c.size, world_size):
        group = order[r0:r0 + world_size]
        ranks = np.lexsort((np.arange(world_size), load))  # lightest first
        for item, rank in zip(group.tolist(), ranks.tolist()):
            taken[rank].append(item)
            load[rank] += c[item]
    budget = 4 * c.size if max_swaps is None else max_swaps
    target = (1.0 + tol) * load.mean()
    while budget > 0 and world_size > 1:
        hi = int(np.argmax(load))
        if load[hi] <= target:
            break
        if not _swap_from(c, taken, load, hi):
            break
        budget -= 1
    return [sorted(t) for t in taken]


def _swap_from(c: np.ndarray, taken: list[list[int]], load: np.ndarray, hi: int) -> bool:
    """One improving swap between rank `hi` and the lightest rank that admits one."""
    a = np.asarray(taken[hi])
    for lo in np.lexsort((np.arange(load.size), load)).tolist():
        gap = load[hi] - load[lo]
        if lo == hi or gap <= 0:
            break
        b = np.asarray(taken[lo])
        bo = np.argsort(c[b], kind="stable")
        bc = c[b][bo]
        # moving a_i -> lo and b_j -> hi changes hi by -(a_i - b_j); best is a_i - b_j = gap / 2,
        # and any 0 < a_i - b_j < gap lowers max(load[hi], load[lo]).
        want = c[a] - gap / 2
        j = np.clip(np.searchsorted(bc, want), 1, bc.size - 1) if bc.size > 1 else np.zeros(a.size, np.int64)
        cand = np.stack([j - 1, j]) if bc.size > 1 else j[None]
        d = c[a][None, :] - bc[cand]
        ok = (d > 1e-12 * gap) & (d < gap)
        if not ok.any():
            continue
        score = np.where(ok, np.abs(d - gap / 2), np.inf)
        ci, ai = np.unravel_index(int(np.argmin(score)), score.shape)
        bj = int(bo[cand[ci, ai]])
        i_a, i_b = int(a[ai]), int(b[bj])
        taken[hi][int(ai)], taken[lo][bj] = i_b, i_a
        load[hi] += c[i_b] - c[i_a]
        load[lo] += c[i_a] - c[i_b]
        return True
    return False


def imbalance(costs: Sequence[float] | np.ndarray) -> float:
    """max / mean of per-rank costs (1.0 = perfect balance)."""
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"costs must be a non-empty 1-D sequence, got shape {c.shape}")
    mean = float(c.mean())
    if mean <= 0:
        raise ValueError(f"costs must have a positive mean, got {mean}")
    return float(c.max()) / mean
