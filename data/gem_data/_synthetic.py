"""SyntheticSource: GEM-like samples with a planted, known label function.

Data are produced in fixed-size *blocks* of samples; block b depends only on (seed, b), so
any block can be made on any rank or worker in any order (deterministic, resumable, and the
loader can look at the lengths of every block without generating its contents).

The planted logit of task t for one sample (all parts roughly unit-scale, see `_Planted`):

    bias_t + w_t . dense + sum_f c_ft * mean_{id in f} e(f, t, id) + dom[d, t]
    + a_t * (frac. of event type 0 among the last 16 events - its mean)
    + g_t * mean_{last 8 events} e(item, t, id) + h_t * z(log1p(len))

where e(., ., id) is a fixed pseudo-random effect per id (a hash, so no tables even for
million-id vocabularies). label ~ Bernoulli(sigmoid(logit)). A model with per-id embeddings,
dense and domain inputs and attention over recent events can learn all of it.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from gem_data._batch import Batch
from gem_data._config import DataConfig
from gem_data._host import HostBatch, offsets_of

_RECENT_TYPES = 16
_RECENT_ITEMS = 8
_ITEM_FEATURE = 1_000_003  # feature slot of the sequence item ids in the effect hash
_T0 = 1_700_000_000
_PAGE = 256  # blocks whose lengths are drawn together


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def id_effect(ids: np.ndarray, feature: int, task: int, seed: int) -> np.ndarray:
    """Fixed pseudo-random effect in [-sqrt(3), sqrt(3)] (unit variance) of each id."""
    with np.errstate(over="ignore"):
        key = np.uint64((seed * 1_000_003 + feature) * 131 + task)
        h = _splitmix(ids.astype(np.uint64) * np.uint64(0x2545F4914F6CDD1D) + _splitmix(np.array([key]))[0])
    u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return (u - 0.5) * math.sqrt(12.0)


def zipf_ids(rng: np.random.Generator, vocab: int, alpha: float, n: int) -> np.ndarray:
    """n ids in [0, vocab) with P(id) ~ (id + 1)^-alpha (continuous inverse-CDF approximation)."""
    u = rng.random(n)
    top = (vocab + 1.0) ** (1.0 - alpha)
    x = (1.0 - u * (1.0 - top)) ** (1.0 / (1.0 - alpha))
    out: np.ndarray = np.minimum(x.astype(np.int64) - 1, vocab - 1).clip(0)
    return out


def _recent(offs: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the last k[i] events of each sequence i, and their sequence index."""
    total = int(k.sum())
    seq = np.repeat(np.arange(k.size), k)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
    return offs[1:][seq] - k[seq] + within, seq


class _Planted:
    """The planted label-function parameters, drawn once from the config seed."""

    def __init__(self, cfg: DataConfig) -> None:
        rng = np.random.default_rng([cfg.seed, 0x5EED])
        nt = cfg.num_tasks
        self.bias = np.array([-1.0 - 1.0 * min(t, 1) - 0.3 * max(t - 1, 0) for t in range(nt)])
        self.w = rng.normal(0.0, 0.8 / math.sqrt(max(cfg.num_dense, 1)), (cfg.num_dense, nt))
        self.c = rng.uniform(0.4, 0.8, (len(cfg.sparse_features), nt))
        self.dom = rng.normal(0.0, 0.5, (cfg.num_domains, nt))
        self.a = rng.uniform(1.5, 2.5, nt) * rng.choice([-1.0, 1.0], nt)
        self.g = rng.uniform(0.6, 1.0, nt)
        self.h = rng.uniform(0.2, 0.4, nt) * rng.choice([-1.0, 1.0], nt)
        self.type_mix = rng.dirichlet(np.ones(cfg.num_event_types))
        sig = cfg.seq_len_sigma
        self.mu = math.log(cfg.seq_len_mean) - sig * sig / 2
        self.loglen_mean, self.loglen_std = self.mu, max(sig, 0.5)


class SyntheticSource:
    """Deterministic GEM-like samples in blocks of `block_size`, with known label probabilities.

    Args:
        cfg: the DataConfig (feature sizes, length distribution, seed).
        block_size: samples per block (the unit the loader reads and balances).
        num_blocks: finite size of the data set in blocks, or None for an endless source.

    Example:
        src = SyntheticSource(presets.tiny(), block_size=32)
        batch = src.batch(0)              # Batch of 32 samples, batch.probs = true probabilities
        print(bayes_metrics(batch.probs))
    """

    def __init__(self, cfg: DataConfig, *, block_size: int = 64, num_blocks: int | None = None) -> None:
        if not isinstance(cfg, DataConfig):
            raise TypeError(f"cfg must be a DataConfig, got {type(cfg).__name__}")
        if block_size < 1:
            raise ValueError(f"{block_size=} must be >= 1")
        if num_blocks is not None and num_blocks < 0:
            raise ValueError(f"{num_blocks=} must be >= 0 or None")
        self.cfg = cfg
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._p = _Planted(cfg)
        self._page = functools.lru_cache(maxsize=16)(self._length_page)  # thread-safe cache

    def __len__(self) -> int:
        if self.num_blocks is None:
            raise TypeError("an endless SyntheticSource (num_blocks=None) has no len()")
        return self.num_blocks

    def _check(self, b: int) -> None:
        if b < 0 or (self.num_blocks is not None and b >= self.num_blocks):
            raise IndexError(f"block {b} out of range [0, {self.num_blocks})")

    def _length_page(self, page: int) -> np.ndarray:
        # lengths of _PAGE blocks at once: a planner asks for thousands of blocks per step
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, page, 0])
        raw = rng.lognormal(self._p.mu, cfg.seq_len_sigma, (_PAGE, self.block_size))
        out: np.ndarray = np.clip(np.rint(raw), cfg.seq_len_min, cfg.seq_len_cap).astype(np.int64)
        out.flags.writeable = False
        return out

    def lengths(self, b: int) -> np.ndarray:
        """[block_size] int64 sequence lengths of block b (cheap: no contents generated; read-only)."""
        self._check(b)
        out: np.ndarray = self._page(b // _PAGE)[b % _PAGE]
        return out

    def read(self, b: int) -> HostBatch:
        """Block b as numpy arrays."""
        cfg, p = self.cfg, self._p
        lengths = self.lengths(b)
        rng = np.random.default_rng([cfg.seed, b, 1])
        n, T = self.block_size, int(lengths.sum())
        offs = offsets_of(lengths)
        seq_of = np.repeat(np.arange(n), lengths)
        # events: item ids (Zipf), types (per-user mix of type 0 vs the global mix), times
        event_ids = zipf_ids(rng, cfg.event_vocab, cfg.zipf_alpha, T)
        p0_user = rng.beta(2.0, 5.0, n)
        other = rng.choice(cfg.num_event_types, size=T, p=p.type_mix)
        event_types = np.where(rng.random(T) < p0_user[seq_of], 0, other).astype(np.int64)
        gaps = rng.exponential(3600.0, T).astype(np.int64)
        csum = np.cumsum(gaps)
        start_csum = np.r_[0, csum][offs[:-1]]
        t0 = _T0 + rng.integers(0, 30 * 86400, n)
        timestamps = (t0[seq_of] + csum - start_csum[seq_of]).astype(np.int64)
        # non-sequence sparse ids
        K = len(cfg.sparse_features)
        sparse_lengths = rng.poisson(cfg.sparse_mean_len, (K, n)).astype(np.int64)
        sparse_values = [zipf_ids(rng, vocab, cfg.zipf_alpha, int(sparse_lengths[k].sum()))
                         for k, (_, vocab) in enumerate(cfg.sparse_features)]
        dense = rng.standard_normal((n, cfg.num_dense)).astype(np.float32)
        domain = rng.integers(0, cfg.num_domains, n).astype(np.int64)
        # planted logits
        logit = p.bias[None, :] + dense.astype(np.float64) @ p.w + p.dom[domain]
        # sequence statistics over the most recent events only (gathered, not the whole history)
        k_t = np.minimum(lengths, _RECENT_TYPES)
        pos_t, seq_t = _recent(offs, k_t)
        n0 = np.bincount(seq_t, weights=(event_types[pos_t] == 0), minlength=n)
        frac0 = np.where(k_t > 0, n0 / np.maximum(k_t, 1), 2.0 / 7.0)
        logit += p.a[None, :] * (frac0 - 2.0 / 7.0)[:, None]
        z_len = (np.log1p(lengths) - p.loglen_mean) / p.loglen_std
        logit += p.h[None, :] * z_len[:, None]
        k_i = np.minimum(lengths, _RECENT_ITEMS)
        pos_i, seq_i = _recent(offs, k_i)
        recent_ids = event_ids[pos_i]
        for t in range(cfg.num_tasks):
            eff = np.bincount(seq_i, weights=id_effect(recent_ids, _ITEM_FEATURE, t, cfg.seed), minlength=n)
            logit[:, t] += p.g[t] * eff / np.maximum(k_i, 1)
            for k in range(K):
                so = offsets_of(sparse_lengths[k])
                e = np.r_[0.0, np.cumsum(id_effect(sparse_values[k], k, t, cfg.seed))]
                m = np.where(sparse_lengths[k] > 0, (e[so[1:]] - e[so[:-1]]) / np.maximum(sparse_lengths[k], 1), 0.0)
                logit[:, t] += p.c[k, t] * m
        probs = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(probs.shape) < probs).astype(np.float32)
        return HostBatch(cfg.sparse_names, lengths, event_ids, event_types, timestamps, sparse_lengths,
                         sparse_values, dense, domain, labels, probs.astype(np.float32))

    def batch(self, b: int, sparse_kind: str = "auto") -> Batch:
        """Block b as a CPU `Batch` (sparse as KeyedJaggedTensor if torchrec imports, see make_sparse)."""
        return self.read(b).to_batch(sparse_kind)

    def __iter__(self) -> Iterator[Batch]:
        b = 0
        while self.num_blocks is None or b < self.num_blocks:
            yield self.batch(b)
            b += 1
