"""How much AUC attention over the history can add on the planted task, at most.

The planted logit has two terms that depend on *which* events are recent: the share of event
type 0 among the last 16 events, and the mean effect of the last 8 items. A model without
sequence attention (GEMConfig(sequence_attention=False)) still sees the mean of every event
token (so the user's whole-history type share) and the `num_recent` newest tokens. This tool
scores held-out samples with two oracles that know the planted function exactly:

  bayes:   the true probability (what any model can reach at best);
  no_attn: the same logit with the last-16 type share replaced by the whole-history share
           and the last-8 item term cut to the `num_recent` newest items (the rest have mean 0),
           i.e. the best a model can do from what the attention-off ablation sees.

The AUC difference bounds what attention can add over its own ablation on this data.

    python3 tools/attention_ceiling.py [--preset tiny|gem] [--samples 65536]
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from gem_data import presets
from gem_data._metrics import auc
from gem_data._synthetic import _ITEM_FEATURE, _RECENT_ITEMS, _RECENT_TYPES, SyntheticSource, _recent, id_effect

p = argparse.ArgumentParser()
p.add_argument("--preset", default="tiny", choices=("tiny", "gem"))
p.add_argument("--samples", type=int, default=65536)
p.add_argument("--num-recent", type=int, default=None, help="default: the model preset's (tiny 2, h200 8)")
a = p.parse_args()
cfg = presets.tiny() if a.preset == "tiny" else presets.gem()
k_vis = a.num_recent if a.num_recent is not None else (2 if a.preset == "tiny" else 8)
src = SyntheticSource(cfg, block_size=256)
pl = src._p
rows: dict[str, list[np.ndarray]] = {"labels": [], "bayes": [], "no_attn": []}
start = 1 << 20  # far from the blocks training reads first
for b in range(start, start + a.samples // 256):
    hb = src.read(b)
    n, offs = hb.lengths.size, np.r_[0, np.cumsum(hb.lengths)]
    logit = np.log(hb.probs / (1 - hb.probs)).astype(np.float64)
    seq = np.repeat(np.arange(n), hb.lengths)
    # the type-0 share: last 16 (planted) vs the whole history (what a mean sees)
    k_t = np.minimum(hb.lengths, _RECENT_TYPES)
    pos_t, seq_t = _recent(offs, k_t)
    f16 = np.where(k_t > 0, np.bincount(seq_t, hb.event_types[pos_t] == 0, n) / np.maximum(k_t, 1), 2 / 7)
    fall = np.where(hb.lengths > 0, np.bincount(seq, hb.event_types == 0, n) / np.maximum(hb.lengths, 1), 2 / 7)
    oracle = logit + pl.a[None, :] * (fall - f16)[:, None]
    # the item term: the last 8 (planted) vs the newest k_vis only
    k_i = np.minimum(hb.lengths, _RECENT_ITEMS)
    pos_i, seq_i = _recent(offs, k_i)
    newest = np.minimum(hb.lengths, k_vis)
    pos_v, seq_v = _recent(offs, newest)
    for t in range(cfg.num_tasks):
        e8 = np.bincount(seq_i, id_effect(hb.event_ids[pos_i], _ITEM_FEATURE, t, cfg.seed), n)
        ev = np.bincount(seq_v, id_effect(hb.event_ids[pos_v], _ITEM_FEATURE, t, cfg.seed), n)
        oracle[:, t] += pl.g[t] * (ev - e8) / np.maximum(k_i, 1)
    rows["labels"].append(hb.labels)
    rows["bayes"].append(logit)
    rows["no_attn"].append(oracle)
y, s_b, s_n = (np.concatenate(rows[k]) for k in ("labels", "bayes", "no_attn"))
out = {"preset": a.preset, "samples": int(y.shape[0]), "num_recent": k_vis, "tasks": {}}
for t, name in enumerate(cfg.tasks):
    ab, an = auc(s_b[:, t], y[:, t]), auc(s_n[:, t], y[:, t])
    out["tasks"][name] = {"bayes": round(ab, 4), "no_attention_oracle": round(an, 4), "ceiling": round(ab - an, 4)}
print(json.dumps(out))
