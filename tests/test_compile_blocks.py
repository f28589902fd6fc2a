"""`gem_parallel.parallelize(model, compile=...)` on the GEM model: whole-graph blocks, bounded
recompiles over jagged batches of changing size, and the eager model's numbers.

CPU, tiny sizes, backend "aot_eager" (dynamo capture + AOT autograd + functionalization, the
same graphs inductor would get, without inductor's C++ codegen, which takes minutes on a
2-core box). The attention runs on the reference backend here; the kernels' custom ops under
compile are tested in kernels/tests/test_strided_ops.py, and inductor on the GPU by the
trainer's `--compile` run (trainer/BENCHMARKS.md).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import gem_parallel
from gem_data import SyntheticSource, presets as data_presets
from gem_model import GEMConfig, GEMModel, presets

# Here, not in model/tests: the model package may not depend on gem_parallel (the dependency
# direction is model -> kernels; parallel transforms a model from outside).
_DATA = data_presets.tiny(seq_len_mean=12.0, seq_len_min=0, seq_len_cap=40)


def tiny_config(**overrides: object) -> GEMConfig:
    return presets.tiny(**presets.feature_sizes(_DATA), **overrides)


def make_batch(b: int, seed: int) -> object:
    """A planted-task block of b samples (jagged lengths differ from block to block)."""
    return SyntheticSource(_DATA, block_size=b).batch(seed, sparse_kind="native")


def _step(model: torch.nn.Module, batch: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(batch)
    F.binary_cross_entropy_with_logits(out, batch.labels).backward()  # type: ignore[attr-defined]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


# The model here lives on the CPU, so Triton means its interpreter (the GPU compile path is
# tests/test_no_sync_model.py's compiled case).
TRITON = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize("backend,select,gather,in_place,ac", [
    ("reference", False, False, False, False),
    # GEMConfig.select_stream_rows: compiled, the per-row selects; eager, the scatters
    ("reference", True, False, False, False),
    # GEMConfig.gather_stream_grads: compiled, the reads' gradients gathered per row
    ("reference", False, True, False, False),
    # GEMConfig.inplace_residual_gemm (the default since gem-model 0.6.3): compiled, the
    # residual GEMMs add into a copy in place; also inside activation checkpointing, whose
    # backward re-runs that mutation
    ("reference", False, False, True, False),
    ("reference", False, False, True, True),
    # The kernels' custom ops inside the compiled blocks (Triton's interpreter on CPU, ~30 s).
    pytest.param("triton", False, False, False, False,
                 marks=pytest.mark.skipif(not TRITON, reason="needs TRITON_INTERPRET=1")),
])
def test_compiled_blocks_match_eager_without_breaks_or_unbounded_recompiles(backend: str, select: bool,
                                                                           gather: bool, in_place: bool,
                                                                           ac: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    # gdpa + hierarchical pooling + window + computation skip: two block kinds (with and
    # without pooling), every Kunlun path through the layout.
    cfg = tiny_config(gdpa_ffn=True, hierarchical_pooling=True, window=4, computation_skip=True,
                      num_layers=2, attention_backend=backend, select_stream_rows=select,
                      gather_stream_grads=gather, inplace_residual_gemm=in_place,
                      stream_bias=not in_place)  # (a biased linear keeps the plain sum)
    model = GEMModel(cfg)
    eager = copy.deepcopy(model)
    done = gem_parallel.parallelize(model, None, compile="aot_eager", ac=ac)
    assert done.compiled_blocks == 2
    assert all(("Checkpoint" in type(layer).__name__) == ac for layer in model.layers)
    start = done.compile_counts()
    graphs = []
    for i, b in enumerate([4, 5, 6]):
        batch = make_batch(b, seed=i)
        got, got_g = _step(model, batch)
        # (the checkpoint wrapper's name in the parameters' paths)
        got_g = {n.replace("_checkpoint_wrapped_module.", ""): g for n, g in got_g.items()}
        want, want_g = _step(eager, batch)
        assert got_g.keys() == want_g.keys()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for n in want_g:
            torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-4, atol=1e-6, msg=n)
        counts = done.compile_counts()
        assert counts["graph_breaks"] == start["graph_breaks"]
        graphs.append(counts["graphs"] - start["graphs"])
    # One dynamic graph per block kind (with and without pooling) at step 1, then none.
    assert graphs == [2, 2, 2], graphs
