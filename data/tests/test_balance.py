import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gem_data import attention_cost, imbalance, shuffle_base_batches, token_budget_batches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 80))
def test_token_budget_batches_property(lengths: list[int], budget: int) -> None:
    groups = token_budget_batches(lengths, budget)
    flat = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    np.testing.assert_array_equal(flat, np.arange(len(lengths)))  # in order, nothing dropped
    L = np.asarray(lengths, dtype=np.int64)
    for g in groups:
        assert g.size >= 1
        assert L[g].sum() <= budget or g.size == 1  # only a lone over-long sample may exceed
    for a, b in zip(groups, groups[1:]):
        assert L[a].sum() + L[b[0]] > budget  # greedy: the next sample did not fit


def test_token_budget_edges() -> None:
    assert token_budget_batches([], 5) == []
    assert [g.tolist() for g in token_budget_batches([9, 1, 1], 5)] == [[0], [1, 2]]
    assert [g.tolist() for g in token_budget_batches([0, 0, 5, 0], 5)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_batches([1], 0)
    with pytest.raises(ValueError, match="lengths"):
        token_budget_batches([-1], 3)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_shuffle_is_an_equal_count_partition_and_never_worse_than_dealing(world: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(0.0, 1.5, world * k)
    costs[rng.random(costs.size) < 0.1] = 0.0
    got = shuffle_base_batches(costs, world)
    assert sorted(i for r in got for i in r) == list(range(world * k))
    assert all(len(r) == k for r in got)
    dealt = shuffle_base_batches(costs, world, max_swaps=0)
    assert max(costs[r].sum() for r in got) <= max(costs[r].sum() for r in dealt) + 1e-9
    assert got == shuffle_base_batches(costs.copy(), world)  # deterministic: ranks agree without comms


def test_dealing_is_heaviest_with_lightest() -> None:
    costs = np.array([1.0, 8.0, 3.0, 6.0])
    # sorted: 8(1) 6(3) 3(2) 1(0): rank0 <- 8, rank1 <- 6; then lightest rank1 <- 3, rank0 <- 1
    assert shuffle_base_batches(costs, 2, max_swaps=0) == [[0, 1], [2, 3]]


def test_balanced_within_5_percent_at_gem_lengths() -> None:
    rng = np.random.default_rng()
    W, k, bs = 8, 64, 4
    mu = np.log(1000.0) - 0.5
    worst_bal, worst_unbal = 0.0, 0.0
    for _ in range(5):
        L = np.clip(np.rint(rng.lognormal(mu, 1.0, (W * k, bs))), 16, 16384)
        c = attention_cost(L).sum(1)
        got = shuffle_base_batches(c, W)
        worst_bal = max(worst_bal, imbalance([c[r].sum() for r in got]))
        worst_unbal = max(worst_unbal, imbalance(c.reshape(W, k).sum(1)))
    assert worst_bal <= 1.05, worst_bal
    assert worst_unbal > worst_bal


def test_imbalance_and_bad_args() -> None:
    assert imbalance([1.0, 1.0, 4.0]) == pytest.approx(2.0)
    assert imbalance([3.0]) == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        imbalance([])
    with pytest.raises(ValueError, match="positive mean"):
        imbalance([0.0, 0.0])
    with pytest.raises(ValueError, match="multiple of world_size"):
        shuffle_base_batches([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="world_size"):
        shuffle_base_batches([1.0], 0)
    with pytest.raises(ValueError, match="finite"):
        shuffle_base_batches([1.0, float("nan")], 2)
    np.testing.assert_array_equal(attention_cost(np.array([0, 3])), [0.0, 9.0])
