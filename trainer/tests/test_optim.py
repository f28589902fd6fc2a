"""RowWiseAdagrad against the fbgemm exact row-wise rule written out; the lr schedule; the
optimizer split (tables vs dense) the trainer builds."""
from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch

import gem_model
from gem_trainer import _loop
from gem_trainer._optim import RowWiseAdagrad, embedding_tables, lr_scale
from gem_trainer.config import tiny


def _reference(w: torch.Tensor, grads: list[torch.Tensor], lr: float, eps: float) -> torch.Tensor:
    w = w.clone().double()
    acc = torch.zeros(w.shape[0], dtype=torch.float64)
    for g in grads:
        g = g.double()
        for r in range(w.shape[0]):
            acc[r] += float((g[r] ** 2).mean())
            w[r] -= lr * g[r] / (math.sqrt(acc[r]) + eps)
    return w


# The one-pass Triton update (the CUDA default) runs here under Triton's CPU interpreter.
_TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["reference", pytest.param("triton", marks=pytest.mark.skipif(
    not _TRITON_OK, reason="Triton needs CUDA or TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rowwise_adagrad_matches_the_rule(seed: int, backend: str) -> None:
    g = torch.Generator().manual_seed(seed)
    rows, dim = 7, 5
    w = torch.nn.Parameter(torch.randn(rows, dim, generator=g))
    w0 = w.detach().clone()
    opt = RowWiseAdagrad([w], lr=0.07, eps=1e-8, backend=backend)
    grads = []
    for _ in range(4):
        gr = torch.randn(rows, dim, generator=g)
        gr[torch.rand(rows, generator=g) < 0.4] = 0.0  # absent ids: zero rows
        grads.append(gr)
        w.grad = gr.clone()
        opt.step()
    ref = _reference(w0, grads, 0.07, 1e-8)
    torch.testing.assert_close(w.detach().double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rowwise_adagrad_leaves_absent_rows_alone(backend: str) -> None:
    w = torch.nn.Parameter(torch.randn(6, 3))
    before = w.detach().clone()
    grad = torch.zeros(6, 3)
    grad[2] = torch.randn(3)
    w.grad = grad
    RowWiseAdagrad([w], lr=0.5, backend=backend).step()
    changed = (w.detach() != before).any(dim=1)
    assert changed.tolist() == [False, False, True, False, False, False]


def test_rowwise_adagrad_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="lr"):
        RowWiseAdagrad([torch.nn.Parameter(torch.zeros(2, 2))], lr=0.0)
    with pytest.raises(ValueError, match="2-D"):
        RowWiseAdagrad([torch.nn.Parameter(torch.zeros(4))], lr=0.1)


def test_lr_schedule_warms_up_then_decays_to_the_final_fraction() -> None:
    total, warm, final = 100, 10, 0.1
    s = [lr_scale(i, total, warm, final) for i in range(total)]
    assert s[0] == pytest.approx(0.1) and s[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(s[:10], s[1:10]))  # rising during warm-up
    assert all(a >= b for a, b in zip(s[10:], s[11:]))  # non-increasing after
    assert lr_scale(total, total, warm, final) == pytest.approx(final)
    assert lr_scale(0, 50, 0, 1.0) == 1.0  # constant when final_frac = 1 and no warm-up


def test_trainer_optimizer_splits_tables_from_dense() -> None:
    cfg = tiny()
    dcfg = _loop.data_config(cfg)
    model = gem_model.GEMModel(_loop.model_config(cfg, dcfg))
    opt = _loop.build_optimizer(model, cfg)
    tables = {id(p) for p in embedding_tables(model)}
    assert tables, "the GEM model has embedding tables"
    assert opt.tables is not None
    assert {id(p) for g in opt.tables.param_groups for p in g["params"]} == tables
    dense = {id(p) for g in opt.dense.param_groups for p in g["params"]}
    assert not dense & tables
    assert dense | tables == {id(p) for p in model.parameters()}
    # fused: the device-side skip of a non-finite step (found_inf) needs the fused kernel
    assert all(g["fused"] for g in opt.dense.param_groups)
    opt.set_step(0)
    assert opt.dense.param_groups[0]["lr"] == pytest.approx(cfg.lr / cfg.warmup_steps)
    opt.set_step(cfg.steps - 1)
    assert opt.dense.param_groups[0]["lr"] < 0.2 * cfg.lr
    assert opt.tables.param_groups[0]["lr"] == cfg.sparse_lr  # tables: no schedule


def test_step_flops_from_host_lengths_equal_the_device_count() -> None:
    cfg = tiny(batch_size=32)
    dcfg = _loop.data_config(cfg)
    model = gem_model.GEMModel(_loop.model_config(cfg, dcfg))
    loader = _loop.make_loader(cfg, dcfg, 0, 1, torch.device("cpu"))
    batch = next(loader)
    loader.close()
    assert _loop._flops(model, batch) == float(model.flops(batch)["total"]) > 0


def test_a_gem_model_0_4_checkpoint_resumes_by_name(tmp_path: Any) -> None:
    """A single-process trainer checkpoint of gem-model 0.4 (whose three token-mix linears
    had a bias: `nonseq_summary.mix`, `seq_ffn.kv_mix`, `pooling.up`) resumes into today's
    model: every parameter and every optimizer state is restored by name, the biases and
    their state are left behind."""
    from torch import nn

    from gem_checkpoint import Checkpointer
    from gem_parallel import Parallelized

    cfg = tiny()
    mcfg = _loop.model_config(cfg, _loop.data_config(cfg))
    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    old = gem_model.GEMModel(mcfg)
    mixes = [n for n, _ in old.named_modules() if n.endswith(("nonseq_summary.mix", "seq_ffn.kv_mix", "pooling.up"))]
    assert mixes
    for n in mixes:
        parent, _, leaf = n.rpartition(".")
        lin = old.get_submodule(n)
        biased = nn.Linear(lin.in_features, lin.out_features)
        with torch.no_grad():
            biased.weight.copy_(lin.weight)
        setattr(old.get_submodule(parent), leaf, biased)
    opt = _loop.build_optimizer(old, cfg)
    for p in old.parameters():  # one step with made-up gradients fills every optimizer state
        p.grad = torch.randn_like(p)
    opt.dense.step()
    ck = Checkpointer(str(tmp_path))
    ck.save(1, {"app": Parallelized(old).train_state([opt.dense])})
    ck.wait()

    new = gem_model.GEMModel(mcfg)
    opt2 = _loop.build_optimizer(new, cfg)
    assert Checkpointer(str(tmp_path)).load({"app": Parallelized(new).train_state([opt2.dense])}) == 1
    old_p = dict(old.named_parameters())
    assert len(old_p) == len(dict(new.named_parameters())) + len(mixes)
    for n, p in new.named_parameters():
        torch.testing.assert_close(p, old_p[n], rtol=0, atol=0, msg=n)
        if p in opt2.dense.state:
            for key, v in opt2.dense.state[p].items():
                torch.testing.assert_close(v, opt.dense.state[old_p[n]][key], rtol=0, atol=0, msg=f"{n} {key}")
    assert len(opt2.dense.state) == len(opt.dense.state) - len(mixes)
