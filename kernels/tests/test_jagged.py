"""Shared helpers (_jagged) and the JFA reference against independent formulations."""

import math

import pytest
import torch

from gem_kernels import jagged_flash_attention, pad_jagged, unpad_jagged
from gem_kernels._jagged import check_offsets, kv_range, visible_mask
from gem_kernels._jfa_reference import jfa_padded, jfa_reference


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)


def test_pad_unpad_roundtrip() -> None:
    lengths = [3, 0, 1, 5]
    off = _offsets(lengths)
    x = torch.randn(int(off[-1]), 2, 4)
    p = pad_jagged(x, off, 5)
    assert p.shape == (4, 5, 2, 4)
    for b, n in enumerate(lengths):
        assert torch.equal(p[b, :n], x[off[b] : off[b + 1]])
        assert torch.count_nonzero(p[b, n:]) == 0
    assert torch.equal(unpad_jagged(p, off), x)
    assert torch.equal(unpad_jagged(p, off, total=int(off[-1])), x)


def test_pad_empty_batch() -> None:
    off = _offsets([0, 0])
    p = pad_jagged(torch.randn(0, 3), off, 2)
    assert p.shape == (2, 2, 3) and torch.count_nonzero(p) == 0
    assert unpad_jagged(p, off).shape == (0, 3)


@pytest.mark.parametrize("lq,lk", [(4, 4), (2, 6), (6, 2), (0, 3), (3, 0)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 1, 3])
def test_visible_mask_rule_and_kv_range(lq: int, lk: int, causal: bool, window: int | None) -> None:
    m = visible_mask(lq, lk, causal=causal, window=window)
    for i in range(lq):
        ip = i + lk - lq
        for j in range(lk):
            want = True
            if causal:
                want &= j <= ip
            if window is not None:
                want &= (j > ip - window) if causal else abs(ip - j) < window
            assert bool(m[i, j]) == want
        lo, hi = kv_range(i, i + 1, lq, lk, causal=causal, window=window)
        visible = m[i].nonzero().flatten().tolist()
        assert all(lo <= j < hi for j in visible)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 3), (False, 2)])
def test_reference_matches_sdpa_per_sequence(causal: bool, window: int | None) -> None:
    torch.manual_seed(0)
    lq, lk = [5, 0, 1, 7, 3], [4, 2, 1, 7, 0]
    qo, ko = _offsets(lq), _offsets(lk)
    h, d = 2, 8
    q = torch.randn(int(qo[-1]), h, d, dtype=torch.float64)
    k = torch.randn(int(ko[-1]), h, d, dtype=torch.float64)
    v = torch.randn(int(ko[-1]), h, d, dtype=torch.float64)
    # float64 inputs are checked against float64 SDPA; the reference computes in fp32.
    out = jagged_flash_attention(
        q.float(), k.float(), v.float(), qo, ko, 7, 7, causal=causal, window=window, backend="reference"
    )
    for b in range(5):
        qb = q[qo[b] : qo[b + 1]].transpose(0, 1)
        kb = k[ko[b] : ko[b + 1]].transpose(0, 1)
        vb = v[ko[b] : ko[b + 1]].transpose(0, 1)
        m = visible_mask(lq[b], lk[b], causal=causal, window=window)
        got = out[qo[b] : qo[b + 1]].transpose(0, 1).double()
        for i in range(lq[b]):
            if not bool(m[i].any()):
                assert torch.count_nonzero(got[:, i]) == 0
                continue
            s = (qb[:, i : i + 1] @ kb.transpose(1, 2)) / math.sqrt(d)
            s = s.masked_fill(~m[i], -math.inf)
            want = torch.softmax(s, -1) @ vb
            torch.testing.assert_close(got[:, i : i + 1], want, atol=1e-5, rtol=1e-5)


def test_reference_no_nan_grad_for_invisible_rows() -> None:
    qo, ko = _offsets([3, 2]), _offsets([0, 2])
    q = torch.randn(5, 1, 4, requires_grad=True)
    k = torch.randn(2, 1, 4, requires_grad=True)
    v = torch.randn(2, 1, 4, requires_grad=True)
    out = jagged_flash_attention(q, k, v, qo, ko, 3, 2, causal=True, backend="reference")
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert torch.count_nonzero(q.grad[:3]) == 0 and torch.count_nonzero(out[:3]) == 0


@pytest.mark.parametrize(
    "off,total,max_len,match",
    [
        (torch.tensor([1, 3]), 3, 3, r"offsets\[0\]=1 must be 0"),
        (torch.tensor([0, 2]), 3, 3, r"must equal the number of rows"),
        (torch.tensor([0, 3, 2, 3]), 3, 3, "non-decreasing"),
        (torch.tensor([0, 3]), 3, 2, "max_len=2 is smaller"),
        (torch.zeros(2, 2, dtype=torch.int64), 0, 1, r"must be \[B\+1\]"),
    ],
)
def test_check_offsets_errors(off: torch.Tensor, total: int, max_len: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_offsets(off.long(), "offsets", total=total, max_len=max_len, max_len_name="max_len")


def test_public_bad_inputs() -> None:
    off = _offsets([2, 1])
    q = torch.randn(3, 2, 8)
    with pytest.raises(TypeError, match="q_offsets.dtype"):
        jagged_flash_attention(q, q, q, off.int(), off, 2, 2)
    with pytest.raises(ValueError, match=r"k.shape=.* must be \[T, H, D\]"):
        jagged_flash_attention(q, q[0], q, off, off, 2, 2)
    with pytest.raises(TypeError, match="v.dtype"):
        jagged_flash_attention(q, q, q.half(), off, off, 2, 2)
    with pytest.raises(ValueError, match="backend="):
        jagged_flash_attention(q, q, q, off, off, 2, 2, backend="cuda")
    with pytest.raises(ValueError, match="window=0"):
        jagged_flash_attention(q, q, q, off, off, 2, 2, window=0)
    with pytest.raises(ValueError, match="max_kv_len=1 is smaller"):
        jagged_flash_attention(q, q, q, off, off, 2, 1)
    with pytest.raises(TypeError, match="max_q_len"):
        jagged_flash_attention(q, q, q, off, off, 2.0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="q_offsets.shape"):
        jagged_flash_attention(q, q, q, _offsets([3]), off, 3, 2)
    with pytest.raises(ValueError, match="head dim"):
        jagged_flash_attention(q[..., :6], q[..., :6], q[..., :6], off, off, 2, 2, backend="triton")


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 4), (False, 3)])
def test_padded_reference_matches_per_sequence_spec(causal: bool, window: int | None) -> None:
    torch.manual_seed(1)
    lq, lk = [6, 0, 1, 9, 4], [5, 3, 0, 9, 8]
    qo, ko = _offsets(lq), _offsets(lk)
    q = torch.randn(sum(lq), 3, 8, requires_grad=True)
    k = torch.randn(sum(lk), 3, 8, requires_grad=True)
    v = torch.randn(sum(lk), 3, 8, requires_grad=True)
    dout = torch.randn(sum(lq), 3, 8)
    kw = dict(causal=causal, window=window, scale=0.3)
    a = jfa_padded(q, k, v, qo, ko, 9, 9, **kw)  # type: ignore[arg-type]
    b = jfa_reference(q, k, v, qo, ko, **kw)  # type: ignore[arg-type]
    torch.testing.assert_close(a, b)
    for ga, gb in zip(torch.autograd.grad(a, (q, k, v), dout), torch.autograd.grad(b, (q, k, v), dout)):
        assert torch.isfinite(ga).all()
        torch.testing.assert_close(ga, gb)
