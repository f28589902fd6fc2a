"""A layer compiled ahead of time while the layer before it still ran eagerly must fit once
that layer runs compiled (gem-model 0.6.4).

With `--compile-background` a trainer's first steps mix eager and compiled layers, and the
blocks compiled then are kept for every later run. An eager pooling returned a view (a
transpose), a compiled one a plain tensor of the same strides, and a variant compiled from the
view guards on its `_base`: an H100 cold run compiled such a layer twice, and the next run a
fourth variant (trainer/BENCHMARKS.md, forty-seventh session). The model now hands each layer
a fresh copy of the pooling. CPU, the h200 preset's structure at tiny sizes, backend
"aot_eager" (the same guards as inductor's, without its C++ build).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import gem_parallel
from gem_data import SyntheticSource, presets as data_presets
from gem_model import GEMModel, presets

_DATA = data_presets.tiny(seq_len_mean=12.0, seq_len_min=0, seq_len_cap=40)
# The h200 preset's layer structure at the tiny sizes: pooling in layers 0 and 2, computation
# skip in 1 and 3, the last layer attending from the rows it reads.
_H200_SHAPE = dict(num_layers=4, gdpa_ffn=True, hierarchical_pooling=True, computation_skip=True,
                   stream_bias=False)


def _model() -> GEMModel:
    return GEMModel(presets.tiny(**presets.feature_sizes(_DATA), **_H200_SHAPE))


def _step(model: torch.nn.Module, seed: int) -> list[torch.Tensor]:
    batch = SyntheticSource(_DATA, block_size=16).batch(seed, sparse_kind="native")
    out = model(batch)
    F.binary_cross_entropy_with_logits(out, batch.labels).backward()  # type: ignore[attr-defined,no-untyped-call]
    got = [out.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return got


def _only(model: GEMModel, keep: set[int]) -> None:
    """Runs the layers not in `keep` eagerly (parallelize routed every layer through the store)."""
    for i, layer in enumerate(model.layers):
        if i not in keep:
            layer._compiled_call_impl = None


def test_a_layer_compiled_beside_an_eager_predecessor_fits_it_compiled(tmp_path: object) -> None:
    seed = int(torch.randint(0, 1 << 30, ()).item())
    torch.manual_seed(seed)
    eager = _model()
    assert eager.layers[0].pooling is not None and eager.layers[1].pooling is None
    store = str(tmp_path) + "/aot"

    # Run 1: layer 1 compiled while layer 0 runs eagerly (as in a background compile's first steps).
    first = copy.deepcopy(eager)
    one = gem_parallel.parallelize(first, compile="aot_eager", compile_aot=store)
    _only(first, {1})
    _step(first, seed)
    assert one.aot is not None and one.aot.stats.compiled == 1

    # Run 2: layer 0 compiled too. Layer 1's kept variant must fit: one compile (layer 0's).
    later = copy.deepcopy(eager)
    two = gem_parallel.parallelize(later, compile="aot_eager", compile_aot=store)
    _only(later, {0, 1})
    got = _step(later, seed + 1)
    assert two.aot is not None
    s = two.aot.stats
    assert s.compiled == 1 and s.loaded == 1 and s.fallbacks == 0, s.summary()
    want = _step(eager, seed + 1)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
