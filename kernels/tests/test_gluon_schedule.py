"""The Gluon kernels' tile schedules, modelled in PyTorch on the CPU, against the reference.

The Gluon kernels (`_gluon_jfa`) cannot run without a Hopper GPU. What can be checked here is
their arithmetic order and tile bounds: these models walk the tiles exactly as the kernels do
(the same `hi` / `f_hi` / `lo` / `f_lo` formulas, which tiles take an element mask, rows and
keys past a sample's end as zero-filled rows, the forward's rescale one tile late as in
FlashAttention-3's pipelining, the dQ kernel's missing column mask) in float64, and must give
the reference attention and its gradients on fresh random jagged batches, causal and full,
self- and cross-attention, with tile sizes that do and do not divide the lengths.
"""

from __future__ import annotations

import math

import pytest
import torch

from gem_kernels._jagged import visible_mask

LOG2E = 1.4426950408889634


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Softmax attention of one (sample, head) under the library's visibility rule
    (`_jagged.visible_mask`, bottom-right aligned); a row that sees no key gives 0."""
    mask = visible_mask(q.shape[0], k.shape[0], causal=causal, window=None)
    s = torch.where(mask, (q @ k.T) * scale, -math.inf)
    seen = mask.any(1, keepdim=True)
    return torch.where(seen, torch.softmax(torch.where(seen, s, 0.0), 1), 0.0) @ v


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x's first `rows` rows, zero rows past its end (cp.async's masked rows)."""
    out = x.new_zeros((rows, *x.shape[1:]))
    out[: min(rows, x.shape[0])] = x[:rows]
    return out


def _fwd_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bm: int, bn: int,
               c: float, halves: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """`_jfa_fwd_gluon_kernel` for one (sample, head): q [lq, D], k/v [lk, D] -> out, lse2. With
    `halves=2`, `_attn_fwd_ws_kernel`: each bm-row tile's two consumers walk the tile's kv tiles
    (its `hi`) over their bm / 2 rows, each with its own first row's causal bound (`f_hi`)."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    out, lse = torch.zeros_like(q), torch.full((lq,), math.inf, dtype=q.dtype)
    for m_start, tile_hi in ((m0, min(lk, max(t0 + bm + shift, 0)) if causal else lk)
                             for t0 in range(0, lq, bm) for m0 in range(t0, t0 + bm, bm // halves) if m0 < lq):
        hi, f_hi = (tile_hi, min(lk, m_start + shift + 1)) if causal else (lk, lk)
        bm_ = bm // halves
        rows = torch.arange(m_start, m_start + bm_)
        qt = _pad(q[m_start:], bm_)
        n_tiles = -(-hi // bn)
        m_i = torch.full((bm_,), -math.inf, dtype=q.dtype)
        l_i = torch.zeros(bm_, dtype=q.dtype)
        acc = torch.zeros(bm_, q.shape[1], dtype=q.dtype)

        def softmax(j: int, m_i: torch.Tensor, l_i: torch.Tensor) -> tuple[torch.Tensor, ...]:
            s = (qt @ _pad(k[j * bn:], bn).T) * c
            if j * bn + bn > f_hi:
                cols = j * bn + torch.arange(bn)
                ok = (cols < lk)[None, :]
                if causal:
                    ok = ok & (cols[None, :] <= rows[:, None] + shift)
                s = torch.where(ok, s, -math.inf)
            m_new = torch.maximum(m_i, s.max(1).values)
            m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp2(s - m_safe[:, None])
            alpha = torch.exp2(m_i - m_safe)
            return p, alpha, l_i * alpha + p.sum(1), m_new

        if n_tiles > 0:
            p, _, l_i, m_i = softmax(0, m_i, l_i)
            for j in range(1, n_tiles):
                p_prev = p
                p, alpha, l_i, m_i = softmax(j, m_i, l_i)  # runs under O += P_{j-1} V_{j-1}
                acc = (acc + p_prev @ _pad(v[(j - 1) * bn:], bn)) * alpha[:, None]
            acc = acc + p @ _pad(v[(n_tiles - 1) * bn:], bn)
        empty = l_i == 0
        l_safe = torch.where(empty, 1.0, l_i)
        n = min(bm_, lq - m_start)
        out[m_start:m_start + n] = (acc / l_safe[:, None])[:n]
        lse[m_start:m_start + n] = torch.where(empty, math.inf, m_i + torch.log2(l_safe))[:n]
    return out, lse


def _dkdv_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, causal: bool, bm: int, bn: int, scale: float) -> tuple[torch.Tensor, ...]:
    """`_jfa_bwd_dkdv_gluon_kernel` for one (sample, head) -> dk, dv."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for n_start in range(0, lk, bn):
        kt, vt = _pad(k[n_start:], bn), _pad(v[n_start:], bn)
        offs_n = n_start + torch.arange(bn)
        lo, f_lo = (max(n_start - shift, 0), max(n_start + bn - 1 - shift, 0)) if causal else (0, 0)
        lo = (lo // bm) * bm
        n_tiles = (max(lq, lo) - lo + bm - 1) // bm
        dkt, dvt = torch.zeros(bn, k.shape[1], dtype=k.dtype), torch.zeros(bn, v.shape[1], dtype=v.dtype)
        for it in range(n_tiles):
            start_m = lo + it * bm
            rows = start_m + torch.arange(bm)
            r_ok = rows < lq
            lse2 = torch.where(r_ok, _pad(lse[start_m:], bm), math.inf)
            dl = torch.where(r_ok, _pad(delta[start_m:], bm), 0.0)
            qt, dot = _pad(q[start_m:], bm), _pad(do[start_m:], bm)
            p = torch.exp2((kt @ qt.T) * scale * LOG2E - lse2[None, :])
            if causal and start_m < f_lo:
                p = torch.where(offs_n[:, None] <= rows[None, :] + shift, p, 0.0)
            ds = p * ((vt @ dot.T) - dl[None, :])
            dvt += p @ dot
            dkt += ds @ qt
        n = min(bn, lk - n_start)
        dk[n_start:n_start + n], dv[n_start:n_start + n] = (dkt * scale)[:n], dvt[:n]
    return dk, dv


def _dq_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
              delta: torch.Tensor, causal: bool, bm: int, bn: int, scale: float) -> torch.Tensor:
    """`_jfa_bwd_dq_gluon_kernel` for one (sample, head): no column mask past lk (zero K rows)."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    dq = torch.zeros_like(q)
    for m_start in range(0, lq, bm):
        rows = m_start + torch.arange(bm)
        r_ok = rows < lq
        qt, dot = _pad(q[m_start:], bm), _pad(do[m_start:], bm)
        lse2 = torch.where(r_ok, _pad(lse[m_start:], bm), math.inf)
        dl = torch.where(r_ok, _pad(delta[m_start:], bm), 0.0)
        hi, f_hi = (min(lk, max(m_start + bm + shift, 0)), max(m_start + shift + 1, 0)) if causal else (lk, lk)
        dqt = torch.zeros(bm, q.shape[1], dtype=q.dtype)
        for it in range(-(-hi // bn)):
            start_n = it * bn
            kt, vt = _pad(k[start_n:], bn), _pad(v[start_n:], bn)
            p = torch.exp2((qt @ kt.T) * scale * LOG2E - lse2[:, None])
            if causal and start_n + bn > f_hi:
                p = torch.where(start_n + torch.arange(bn)[None, :] <= rows[:, None] + shift, p, 0.0)
            dqt += (p * ((dot @ vt.T) - dl[:, None])) @ kt
        n = min(bm, lq - m_start)
        dq[m_start:m_start + n] = (dqt * scale)[:n]
    return dq


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("tiles", [(16, 16), (8, 32), (32, 8)])
def test_models_give_the_reference(causal: bool, cross: bool, tiles: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(hash((causal, cross, tiles)) % 2**31)
    b, h, d = 5, 2, 8
    lq = torch.randint(0, 60, (b,), generator=g).tolist()
    lk = torch.randint(0, 60, (b,), generator=g).tolist() if cross else lq
    lq[0], lk[0] = 0, 7 if cross else 0  # an empty side
    qo = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()])
    ko = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()])
    q = torch.randn(sum(lq), h, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(sum(lk), h, d, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    bm, bn = tiles
    for i in range(b):
        qs, ks = slice(int(qo[i]), int(qo[i + 1])), slice(int(ko[i]), int(ko[i + 1]))
        for hh in range(h):
            qb, kb, vb = (x[s_, hh].detach().requires_grad_() for x, s_ in ((q, qs), (k, ks), (v, ks)))
            ref = _reference(qb, kb, vb, causal, scale)
            dob = torch.randn(ref.shape, generator=g, dtype=torch.float64)
            ref_dq, ref_dk, ref_dv = torch.autograd.grad(ref, (qb, kb, vb), dob, allow_unused=True)
            with torch.no_grad():
                out, lse = _fwd_model(qb, kb, vb, causal, bm, bn, scale * LOG2E)
                torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
                if bm % 2 == 0:  # the warp-specialized forward: two consumers per tile
                    out_ws, lse_ws = _fwd_model(qb, kb, vb, causal, bm, bn, scale * LOG2E, halves=2)
                    torch.testing.assert_close(out_ws, ref, atol=1e-10, rtol=1e-10)
                    torch.testing.assert_close(lse_ws, lse, atol=1e-10, rtol=1e-10)
                delta = (dob * out).sum(1)
                dk, dv = _dkdv_model(qb, kb, vb, dob, lse, delta, causal, bm, bn, scale)
                dq = _dq_model(qb, kb, vb, dob, lse, delta, causal, bm, bn, scale)
            for got, want, like in ((dq, ref_dq, qb), (dk, ref_dk, kb), (dv, ref_dv, vb)):
                torch.testing.assert_close(got, torch.zeros_like(like) if want is None else want, atol=1e-10,
                                           rtol=1e-10)


# ---- The warp-specialized forward's barrier protocol (`_gluon_jfa._attn_fwd_ws_kernel`) ----


class _MBarrier:
    """An mbarrier as PTX defines it: `count` arrivals complete the current phase; a wait on
    parity P passes once the phase of parity P before the current one completed, i.e. while the
    current phase's parity differs from P (a fresh barrier passes a wait on parity 1)."""

    def __init__(self, count: int) -> None:
        self.count, self.left, self.completed = count, count, 0

    def arrive(self, n: int = 1) -> None:
        assert 0 < n <= self.left, "more arrivals than the phase expects"
        self.left -= n
        if self.left == 0:
            self.completed, self.left = self.completed + 1, self.count

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity


def _ws_protocol(items: list[int], stages: int, pingpong: bool, seed: int, q_bufs: int = 2,
                 loader_threads: int = 4, barrier: type[_MBarrier] = _MBarrier, empty_arrivals: int = 2,
                 q_release_early: bool = False) -> None:
    """Runs one program of `_attn_fwd_ws_kernel` (its work items: `items[i]` is item i's kv tile
    count; one item per program unless persistent) through the loader and the two consumers, in
    the order the kernel makes its barrier operations, under a random interleaving in which the
    loader's copies land at random later points. The K/V ring and the ping-pong turns count the
    program's kv tiles across items; the q tile goes to buffer it % q_bufs. Checks: no deadlock; a
    consumer finds in a slot (a q buffer) the tile (item) it waited for, from issuing the MMAs
    that read it until it releases it; the loader refills a slot only after both consumers
    released the tile before it there; with `pingpong`, each tile's MMAs are issued by consumer 0
    then consumer 1, before consumer 0 issues the next tile's. Mutants the checks must catch:
    `barrier` (another parity rule), `empty_arrivals=1` (one consumer's release frees a slot),
    `q_release_early` (the q buffer released before the item's last score MMA)."""
    import random

    rng = random.Random(seed)
    ready = [_MBarrier(loader_threads) for _ in range(stages)]  # one arrival per loader thread
    empty = [barrier(empty_arrivals) for _ in range(stages)]  # one per consumer
    q_ready = [_MBarrier(loader_threads) for _ in range(q_bufs)]
    q_empty = [_MBarrier(2) for _ in range(q_bufs)]
    turn = [_MBarrier(1), _MBarrier(1)]
    slot: list[int | None] = [None] * stages  # the program's kv tile a slot holds (or is being filled with)
    qbuf: list[int | None] = [None] * q_bufs  # the item a q buffer holds
    released: list[set[int]] = [set(), set()]  # kv tiles each consumer released
    in_flight: list[tuple[_MBarrier, int]] = []  # (barrier, arrivals) of copies not yet landed
    issued: list[tuple[int, int]] = []  # (consumer, kv tile) in the order their MMAs were issued

    def loader():  # type: ignore[no-untyped-def]
        c = 0
        for it, n_tiles in enumerate(items):
            qb = it % q_bufs
            yield q_empty[qb], ((it // q_bufs) & 1) ^ 1
            qbuf[qb] = it
            for _ in range(loader_threads):  # each thread: cp.async of q, then arrive.noinc
                in_flight.append((q_ready[qb], 1))
            for _ in range(n_tiles):
                s = c % stages
                yield empty[s], ((c // stages) & 1) ^ 1
                if c >= stages and empty_arrivals == 2:
                    assert all(c - stages in r for r in released), f"slot {s} refilled with tile {c} before release"
                slot[s] = c
                for _ in range(loader_threads):  # the threads' copies land one by one
                    in_flight.append((ready[s], 1))
                c += 1

    def consumer(cid: int):  # type: ignore[no-untyped-def]
        c = 0
        for it, n_tiles in enumerate(items):
            qb = it % q_bufs
            yield q_ready[qb], (it // q_bufs) & 1
            assert qbuf[qb] == it, f"consumer {cid}: item {it}'s q buffer holds item {qbuf[qb]}"
            if n_tiles == 0:
                q_empty[qb].arrive()
            for j in range(n_tiles):
                s = (c + j) % stages
                yield ready[s], ((c + j) // stages) & 1
                assert slot[s] == c + j, f"consumer {cid} waited for tile {c + j}, slot {s} holds {slot[s]}"
                if pingpong:
                    yield turn[cid], (c + j + 1 - cid) & 1
                assert qbuf[qb] == it, f"item {it}'s q buffer refilled while consumer {cid} read it"
                assert j == 0 or slot[(c + j - 1) % stages] == c + j - 1, \
                    f"a slot refilled while consumer {cid} issued tile {c + j}'s MMAs"
                issued.append((cid, c + j))  # S = Q·Kᵀ (and O += P·V of the tile before) issued
                if q_release_early and j == n_tiles - 1:
                    q_empty[qb].arrive()
                if pingpong:
                    turn[1 - cid].arrive()
                yield None  # the softmax: the other partitions run meanwhile
                assert qbuf[qb] == it, f"item {it}'s q buffer refilled under consumer {cid}'s score MMA"
                if j:
                    assert slot[(c + j - 1) % stages] == c + j - 1, \
                        f"tile {c + j - 1}'s slot refilled while consumer {cid} read it"
                    released[cid].add(c + j - 1)
                    if empty_arrivals == 2 or cid == 0:  # (the mutant with 1: only consumer 0's release counts)
                        empty[(c + j - 1) % stages].arrive()
            if n_tiles:
                if not q_release_early:
                    q_empty[qb].arrive()  # after the item's last score MMA retired
                yield None  # the last O += P·V
                last = c + n_tiles - 1
                assert slot[last % stages] == last, f"tile {last}'s slot refilled under the last P·V"
                released[cid].add(last)
                if empty_arrivals == 2 or cid == 0:
                    empty[last % stages].arrive()
            c += n_tiles

    actors = {"loader": loader(), "c0": consumer(0), "c1": consumer(1)}
    waiting: dict[str, tuple[_MBarrier, int] | None] = {name: None for name in actors}
    while actors:
        runnable = [n for n in actors if waiting[n] is None or waiting[n][0].passes(waiting[n][1])]
        if in_flight and (not runnable or rng.random() < 0.4):
            bar, n = in_flight.pop(rng.randrange(len(in_flight)))
            bar.arrive(n)
            continue
        assert runnable, f"deadlock: items {items}, {stages} slots, pingpong={pingpong}, waiting on {waiting}"
        name = rng.choice(runnable)
        try:
            waiting[name] = next(actors[name])
        except StopIteration:
            del actors[name]
    if pingpong:
        assert issued == [(cid, c) for c in range(sum(items)) for cid in (0, 1)], issued


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_ws_forward_barrier_protocol_one_item_per_program(stages: int, pingpong: bool) -> None:
    for n_tiles in range(0, 9):
        for seed in range(20):
            _ws_protocol([n_tiles], stages, pingpong, seed=seed + 1000 * n_tiles, q_bufs=1)


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("stages", [2, 4])
def test_ws_forward_barrier_protocol_persistent(stages: int, pingpong: bool) -> None:
    import random

    rng = random.Random(stages + 10 * pingpong)
    for trial in range(60):
        items = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.randint(1, 6))]
        _ws_protocol(items, stages, pingpong, seed=trial, q_bufs=2)


def test_ws_protocol_model_catches_wrong_protocols() -> None:
    # The model is not vacuous. A loader that waits on the empty barriers' parity 0 from the start
    # (no fresh-barrier pass) deadlocks; empty barriers completed by one consumer's release let
    # the loader refill a slot the other still reads; a q buffer released before the item's last
    # score MMA is refilled under it (an item without kv tiles between: the ring's back-pressure
    # does not hold the loader back).
    class _Strict(_MBarrier):
        def passes(self, parity: int) -> bool:
            return super().passes(parity ^ 1)

    with pytest.raises(AssertionError, match="deadlock"):
        _ws_protocol([3], 2, False, seed=0, q_bufs=1, barrier=_Strict)
    for kw, items, text in (({"empty_arrivals": 1}, [6], ("refilled", "holds")),
                            ({"q_release_early": True}, [3, 0, 3, 0, 2, 0, 1], ("q buffer refilled",))):
        failures = 0
        for seed in range(60):
            try:
                _ws_protocol(items, 2, False, seed=seed, **kw)  # type: ignore[arg-type]
            except AssertionError as e:
                assert any(t in str(e) for t in text), e
                failures += 1
        assert failures > 0, kw


_ACTS = {"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid, "relu": torch.relu,
         "identity": lambda x: x}


def _gdpa_ws_model(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bm: int, bn: int, scale: float,
                   act: str, div: float) -> torch.Tensor:
    """`_attn_fwd_ws_kernel` with a GDPA activation, one (sample, head): each bm-row q tile's two consumers
    walk the tile's kv tiles (its `hi`), each masking the tiles that reach past its first row's
    bound (`f_hi`), zero-filled rows past the sample's end included (act(0) need not be 0)."""
    lq, lk = q.shape[0], k.shape[0]
    shift = lk - lq
    out = torch.zeros_like(q)
    for t0 in range(0, lq, bm):
        hi = min(lk, max(t0 + bm + shift, 0)) if causal else lk
        for m0 in range(t0, t0 + bm, bm // 2):
            if m0 >= lq:
                continue
            f_hi = min(lk, m0 + shift + 1) if causal else lk
            rows = torch.arange(m0, m0 + bm // 2)
            qt = _pad(q[m0:], bm // 2)
            acc = torch.zeros(bm // 2, q.shape[1], dtype=q.dtype)
            for j in range(-(-hi // bn)):
                p = _ACTS[act]((qt @ _pad(k[j * bn:], bn).T) * scale)
                if j * bn + bn > f_hi:
                    cols = j * bn + torch.arange(bn)
                    ok = (cols < lk)[None, :]
                    if causal:
                        ok = ok & (cols[None, :] <= rows[:, None] + shift)
                    p = torch.where(ok, p, 0.0)
                acc = acc + p @ _pad(v[j * bn:], bn)
            n = min(bm // 2, lq - m0)
            out[m0:m0 + n] = (acc / div)[:n]
    return out


@pytest.mark.parametrize("act", sorted(_ACTS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_gdpa_ws_model_gives_the_reference(act: str, causal: bool, cross: bool) -> None:
    g = torch.Generator().manual_seed(hash((act, causal, cross)) % 2**31)
    for bm, bn in ((16, 8), (8, 16), (16, 16)):
        lq = torch.randint(0, 50, (4,), generator=g).tolist()
        lk = torch.randint(0, 50, (4,), generator=g).tolist() if cross else lq
        for a, b in zip(lq, lk):
            q = torch.randn(a, 8, generator=g, dtype=torch.float64)
            k, v = (torch.randn(b, 8, generator=g, dtype=torch.float64) for _ in range(2))
            mask = visible_mask(a, b, causal=causal, window=None)
            want = torch.where(mask, _ACTS[act]((q @ k.T) * 0.3), 0.0) @ v / 7.0
            got = _gdpa_ws_model(q, k, v, causal, bm, bn, 0.3, act, 7.0)
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
