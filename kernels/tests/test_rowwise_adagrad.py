"""`rowwise_adagrad_`: the Triton kernel vs the plain-PyTorch reference, on fresh random tables.

CPU: Triton's interpreter on small tables (rows not a multiple of the row block, a dim that is
not a power of two, rows with an all-zero gradient, a NaN row, a strided table, bf16 weights,
`skip`). GPU (skipped without CUDA): the h200 preset's item-table size (1M x 256), most rows
absent from the step, as in a Zipf id stream.
"""

import os

import pytest
import torch

from gem_kernels import rowwise_adagrad_, rowwise_adagrad_reference_

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="Triton needs CUDA or TRITON_INTERPRET=1 (set by Bazel)"
)
DEVICE = "cuda" if CUDA else "cpu"


def _table(rows: int, dim: int, dtype: torch.dtype, frac_hit: float, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    w = torch.randn(rows, dim, generator=g, device=DEVICE).to(dtype)
    acc = torch.rand(rows, generator=g, device=DEVICE) * (torch.rand(rows, generator=g, device=DEVICE) < 0.5)
    grad = torch.randn(rows, dim, generator=g, device=DEVICE).to(dtype)
    grad[torch.rand(rows, generator=g, device=DEVICE) >= frac_hit] = 0
    return w, acc, grad


def _both(w: torch.Tensor, acc: torch.Tensor, grad: torch.Tensor, **kw: object) -> tuple[torch.Tensor, ...]:
    w1, a1, w2, a2 = w.clone(), acc.clone(), w.clone(), acc.clone()
    rowwise_adagrad_(w1, a1, grad.clone(), backend="triton", **kw)  # type: ignore[arg-type]
    rowwise_adagrad_reference_(w2, a2, grad.clone(), **kw)  # type: ignore[arg-type]
    return w1, a1, w2, a2


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [16, 24])
def test_matches_reference(dtype: torch.dtype, dim: int) -> None:
    seed = int(torch.randint(0, 10**6, ()))
    w, acc, grad = _table(37, dim, dtype, 0.4, seed)
    zero = grad.float().abs().sum(1) == 0
    assert zero.any() and (~zero).any()
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.05, eps=1e-8)
    torch.testing.assert_close(a1, a2, rtol=1e-6, atol=1e-7)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(w1, w2, rtol=tol, atol=tol)
    # absent rows: weight and accumulator bit for bit unchanged
    assert torch.equal(w1[zero], w[zero]) and torch.equal(a1[zero], acc[zero])
    assert not torch.equal(w1[~zero], w[~zero])


@needs_triton
def test_skip_changes_nothing_even_with_nan() -> None:
    w, acc, grad = _table(21, 16, torch.float32, 0.7, int(torch.randint(0, 10**6, ())))
    grad[3] = float("nan")
    w1, a1 = w.clone(), acc.clone()
    rowwise_adagrad_(w1, a1, grad, lr=0.1, eps=1e-8, skip=torch.ones((), dtype=torch.bool, device=DEVICE),
                     backend="triton")
    assert torch.equal(w1, w) and torch.equal(a1, acc)
    # not skipped: the NaN row is poisoned as in the reference, the others are finite
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.1, eps=1e-8, skip=torch.zeros((), dtype=torch.bool, device=DEVICE))
    assert torch.isnan(w1[3]).all() and torch.isnan(a1[3])
    keep = torch.arange(21, device=DEVICE) != 3
    torch.testing.assert_close(w1[keep], w2[keep], rtol=1e-6, atol=1e-7)


@needs_triton
def test_strided_table() -> None:
    """A table that is a column slice of a wider buffer (row stride > dim)."""
    big, acc, grad = _table(19, 40, torch.float32, 0.5, int(torch.randint(0, 10**6, ())))
    w = big[:, :24]
    g = grad[:, 8:32]
    w_ref = w.clone()
    a_ref = acc.clone()
    rowwise_adagrad_reference_(w_ref, a_ref, g, lr=0.02, eps=1e-6)
    rowwise_adagrad_(w, acc, g, lr=0.02, eps=1e-6, backend="triton")
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(acc, a_ref, rtol=1e-6, atol=1e-7)


def test_bad_inputs_name_the_argument() -> None:
    w, acc = torch.zeros(4, 8), torch.zeros(4)
    with pytest.raises(ValueError, match="grad.shape"):
        rowwise_adagrad_(w, acc, torch.zeros(4, 7), lr=0.1, eps=0.0)
    with pytest.raises(ValueError, match="acc must be float32"):
        rowwise_adagrad_(w, acc.double(), torch.zeros(4, 8), lr=0.1, eps=0.0)
    with pytest.raises(ValueError, match="lr=-0.1 must be finite and >= 0"):
        rowwise_adagrad_(w, acc, torch.zeros(4, 8), lr=-0.1, eps=0.0)
    with pytest.raises(ValueError, match="lr=nan"):
        rowwise_adagrad_(w, acc, torch.zeros(4, 8), lr=float("nan"), eps=0.0)
    with pytest.raises(ValueError, match="skip must be a bool scalar"):
        rowwise_adagrad_(w, acc, torch.zeros(4, 8), lr=0.1, eps=0.0, skip=torch.zeros(()))
    with pytest.raises(ValueError, match="weight.shape"):
        rowwise_adagrad_(torch.zeros(8), acc, torch.zeros(8), lr=0.1, eps=0.0)
    with pytest.raises(ValueError, match="backend="):
        rowwise_adagrad_(w, acc, torch.zeros(4, 8), lr=0.1, eps=0.0, backend="cuda")


@needs_triton
def test_lr_zero_moves_no_weight() -> None:
    """torch.distributed.checkpoint initialises optimizer state by one step at lr 0 with zero
    gradients; at lr 0 with real gradients only the accumulator moves, as in the reference."""
    w, acc, grad = _table(13, 16, torch.float32, 0.5, int(torch.randint(0, 10**6, ())))
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.0, eps=1e-8)
    assert torch.equal(w1, w) and torch.equal(w2, w)
    torch.testing.assert_close(a1, a2, rtol=1e-6, atol=1e-7)
    w3, a3 = w.clone(), acc.clone()
    rowwise_adagrad_(w3, a3, torch.zeros_like(grad), lr=0.0, eps=1e-8, backend="triton")
    assert torch.equal(w3, w) and torch.equal(a3, acc)


def test_auto_is_the_reference_on_cpu() -> None:
    w, acc, grad = _table(9, 8, torch.float32, 0.6, 3)
    if CUDA:
        w, acc, grad = w.cpu(), acc.cpu(), grad.cpu()
    w1, a1, w2, a2 = w.clone(), acc.clone(), w.clone(), acc.clone()
    rowwise_adagrad_(w1, a1, grad, lr=0.05, eps=1e-8)
    rowwise_adagrad_reference_(w2, a2, grad, lr=0.05, eps=1e-8)
    assert torch.equal(w1, w2) and torch.equal(a1, a2)


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_item_table_size() -> None:
    w, acc, grad = _table(1_000_000, 256, torch.float32, 0.15, int(torch.randint(0, 10**6, ())))
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.05, eps=1e-8)
    torch.testing.assert_close(a1, a2, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(w1, w2, rtol=1e-6, atol=1e-6)


# --- sparse gradients (embedding modules with sparse=True) -----------------------------------


def _sparse(rows: int, dim: int, n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uncoalesced sparse COO gradient of n looked-up ids: duplicates, one id repeated a
    third of the time (a Zipf head; a long run after sorting), the ids in random order."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    ids = torch.randint(0, rows, (n,), generator=g, device=DEVICE)
    ids[torch.rand(n, generator=g, device=DEVICE) < 0.33] = int(torch.randint(0, rows, (1,), generator=g, device=DEVICE))
    vals = torch.randn(n, dim, generator=g, device=DEVICE).to(dtype)
    return torch.sparse_coo_tensor(ids[None], vals, (rows, dim), check_invariants=True)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_grad_matches_reference_and_dense(dtype: torch.dtype) -> None:
    seed = int(torch.randint(0, 10**6, ()))
    w, acc, _ = _table(53, 24, dtype, 0.0, seed)
    grad = _sparse(53, 24, 90, seed, dtype)
    assert not grad.is_coalesced()
    hit = torch.zeros(53, dtype=torch.bool, device=DEVICE)
    hit[grad._indices()[0]] = True
    assert hit.any() and (~hit).any()
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.05, eps=1e-8)
    w3, a3 = w.clone(), acc.clone()
    # the dense rule, duplicate ids summed in float32 as both sparse paths do (a bf16 sum of a
    # 30-fold duplicate is off by ~1 %: it made this test fail at random)
    rowwise_adagrad_reference_(w3, a3, grad.float().to_dense(), lr=0.05, eps=1e-8)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: the weight is rounded to bf16
    for wa, aa in ((w1, a1), (w2, a2)):
        torch.testing.assert_close(aa, a3, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(wa, w3, rtol=tol, atol=tol)
    # rows of absent ids: bit for bit unchanged
    assert torch.equal(w1[~hit], w[~hit]) and torch.equal(a1[~hit], acc[~hit])
    assert not torch.equal(w1[hit], w[hit])


@needs_triton
def test_sparse_grad_skip_nan_and_empty() -> None:
    w, acc, _ = _table(31, 16, torch.float32, 0.0, int(torch.randint(0, 10**6, ())))
    grad = _sparse(31, 16, 40, int(torch.randint(0, 10**6, ())))
    grad._values()[5] = float("nan")
    w1, a1 = w.clone(), acc.clone()
    rowwise_adagrad_(w1, a1, grad, lr=0.1, eps=1e-8, skip=torch.ones((), dtype=torch.bool, device=DEVICE),
                     backend="triton")
    assert torch.equal(w1, w) and torch.equal(a1, acc)
    # not skipped: the NaN id's row is poisoned, as in the reference
    w1, a1, w2, a2 = _both(w, acc, grad, lr=0.1, eps=1e-8, skip=torch.zeros((), dtype=torch.bool, device=DEVICE))
    bad = int(grad._indices()[0, 5])
    assert torch.isnan(w1[bad]).all() and torch.isnan(a1[bad]) and torch.isnan(w2[bad]).all()
    keep = torch.arange(31, device=DEVICE) != bad
    torch.testing.assert_close(w1[keep], w2[keep], rtol=1e-6, atol=1e-7)
    # no ids at all: nothing changes
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long, device=DEVICE),
                                    torch.zeros(0, 16, device=DEVICE), (31, 16))
    w1, a1 = w.clone(), acc.clone()
    rowwise_adagrad_(w1, a1, empty, lr=0.1, eps=1e-8, backend="triton")
    assert torch.equal(w1, w) and torch.equal(a1, acc)


@needs_triton
def test_embedding_modules_sparse_grad_trains_like_dense() -> None:
    """The gradient of real embedding modules with sparse=True gives the update their dense
    gradient gives (EmbeddingBag mean with repeated ids in a bag, Embedding)."""
    seed = int(torch.randint(0, 10**6, ()))
    torch.manual_seed(seed)
    for make in (lambda s: torch.nn.EmbeddingBag(40, 12, mode="mean", include_last_offset=True, sparse=s),
                 lambda s: torch.nn.Embedding(40, 12, sparse=s)):
        dense, sparse = make(False).to(DEVICE), make(True).to(DEVICE)
        sparse.load_state_dict(dense.state_dict())
        ids = torch.randint(0, 40, (30,), device=DEVICE)
        ids[::3] = 7
        x = torch.randn(4, 12, device=DEVICE) if isinstance(dense, torch.nn.EmbeddingBag) else torch.randn(30, 12, device=DEVICE)
        off = torch.tensor([0, 5, 5, 20, 30], device=DEVICE)
        for m in (dense, sparse):
            out = m(ids, off) if isinstance(m, torch.nn.EmbeddingBag) else m(ids)
            (out * x).sum().backward()
        assert sparse.weight.grad is not None and sparse.weight.grad.is_sparse
        assert dense.weight.grad is not None and not dense.weight.grad.is_sparse
        accs = [torch.zeros(40, device=DEVICE) for _ in range(2)]
        with torch.no_grad():
            rowwise_adagrad_(dense.weight, accs[0], dense.weight.grad, lr=0.05, eps=1e-8, backend="triton")
            rowwise_adagrad_(sparse.weight, accs[1], sparse.weight.grad, lr=0.05, eps=1e-8, backend="triton")
        torch.testing.assert_close(accs[1], accs[0], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sparse.weight, dense.weight, rtol=1e-6, atol=1e-6)


def test_sparse_grad_bad_layout_names_the_rule() -> None:
    w, acc = torch.zeros(4, 8), torch.zeros(4)
    hybrid = torch.zeros(4, 8).to_sparse(2)  # 2 sparse dims, 0 dense
    with pytest.raises(ValueError, match="1 sparse and 1 dense dimension"):
        rowwise_adagrad_(w, acc, hybrid, lr=0.1, eps=0.0)
    with pytest.raises(ValueError, match="grad.shape"):
        rowwise_adagrad_(w, acc, torch.zeros(5, 8).to_sparse(1), lr=0.1, eps=0.0)
    with pytest.raises(ValueError, match="grad.layout"):
        rowwise_adagrad_(w, acc, torch.zeros(4, 8).to_sparse_csr(), lr=0.1, eps=0.0)


@pytest.mark.skipif(not CUDA, reason="GPU test")
def test_gpu_sparse_item_table_no_sync() -> None:
    """The h200 preset's item table (1M x 256) with a 262k-id Zipf-headed step: the sparse
    update equals the dense one, and no step of it waits on the host."""
    seed = int(torch.randint(0, 10**6, ()))
    w, acc, _ = _table(1_000_000, 256, torch.float32, 0.0, seed)
    grad = _sparse(1_000_000, 256, 262_144, seed)
    w1, a1 = w.clone(), acc.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rowwise_adagrad_(w1, a1, grad, lr=0.05, eps=1e-8, skip=torch.zeros((), dtype=torch.bool, device=DEVICE))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    w2, a2 = w.clone(), acc.clone()
    rowwise_adagrad_(w2, a2, grad.to_dense(), lr=0.05, eps=1e-8)
    torch.testing.assert_close(a1, a2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w1, w2, rtol=1e-5, atol=1e-6)
