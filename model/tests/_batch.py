"""A small duck-typed Batch (INTERFACES.md fields) with a planted label function, for tests.

gem_model must not import gem_data, and its tests should not depend on gem_data's progress
for the basic checks: this builds exactly the fields the model reads.
"""

from __future__ import annotations

from typing import Any

import torch

from gem_model import GEMConfig, presets
from gem_model.bench._batch import Batch, Jag, Sparse, offsets_of

SPARSE = (("user", 50), ("country", 7), ("device", 5))
FEATURES: dict[str, Any] = dict(
    event_vocab=200, num_event_types=4, sparse_features=SPARSE, num_dense=3, num_domains=3,
    tasks=("click", "conversion"),
)

# One config per Kunlun switch (and all together), shared by the test files.
KUNLUN: dict[str, dict[str, Any]] = {
    "interformer": {},
    "gdpa": dict(gdpa_ffn=True),
    "hier_pool": dict(hierarchical_pooling=True),
    "window": dict(window=3),
    "skip": dict(computation_skip=True, num_layers=3),
    # the last layer does not pool: its attention runs for the rows it reads only
    "skip_last": dict(computation_skip=True, num_layers=4, gdpa_ffn=True, hierarchical_pooling=True),
    "event_widths": dict(event_widths=(16, 8, 4, 1)),
    "all": dict(
        gdpa_ffn=True, hierarchical_pooling=True, window=4, computation_skip=True,
        event_widths=(16, 12, 8, 4),
    ),
}


def tiny_config(**overrides: Any) -> GEMConfig:
    return presets.tiny(**{**FEATURES, **overrides})


def make_batch(
    b: int, *, lengths: list[int] | None = None, max_len: int = 24, seed: int = 0
) -> Batch:
    """Random batch with labels from a planted function of the sequence and features.

    logit_click = 3·(fraction of type-0 events − 0.25)·4 + 1.5·dense[0] + (user < 25 ? 1 : −1)
    logit_conv  = 2·(fraction of ids < 50) ·2 − 2 + domain effect.
    """
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(0, max_len + 1, (b,), generator=g).tolist()
    lens = torch.tensor(lengths, dtype=torch.int64)
    offsets = offsets_of(lens)
    t = int(offsets[-1])
    ids = torch.randint(0, FEATURES["event_vocab"], (t,), generator=g)
    types = torch.randint(0, FEATURES["num_event_types"], (t,), generator=g)
    gaps = torch.randint(0, 5000, (t,), generator=g)
    ts = torch.cumsum(gaps, 0)  # non-decreasing within each sequence
    feats = {}
    for name, vocab in SPARSE:
        n = torch.randint(1, 3, (b,), generator=g)
        feats[name] = (torch.randint(0, vocab, (int(n.sum()),), generator=g), n)
    sparse = Sparse({k: Jag(v, offsets_of(n)) for k, (v, n) in feats.items()})
    dense = torch.randn(b, FEATURES["num_dense"], generator=g)
    domain = torch.randint(0, FEATURES["num_domains"], (b,), generator=g)

    sample = torch.repeat_interleave(torch.arange(b), lens)
    denom = lens.clamp(min=1).float()
    frac0 = torch.zeros(b).index_add_(0, sample, (types == 0).float()) / denom
    frac_low = torch.zeros(b).index_add_(0, sample, (ids < 50).float()) / denom
    user_first = feats["user"][0][torch.cumsum(feats["user"][1], 0) - feats["user"][1]]
    click = 12.0 * (frac0 - 0.25) + 1.5 * dense[:, 0] + torch.where(user_first < 25, 1.0, -1.0)
    conv = 4.0 * frac_low - 2.0 + (domain.float() - 1.0)
    probs = torch.sigmoid(torch.stack([click, conv], dim=1))
    labels = torch.bernoulli(probs, generator=g)
    return Batch(
        event_ids=ids, event_types=types, timestamps=ts, seq_offsets=offsets,
        max_seq_len=max(lengths) if lengths else 0, sparse=sparse, dense=dense, domain=domain,
        labels=labels, probs=probs,
    )
