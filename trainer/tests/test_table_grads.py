"""`table_grads`: sparse embedding gradients (one row per looked-up id) in a single process,
dense elsewhere; both train the tables alike."""

import copy
import dataclasses

import pytest
import torch

import gem_model
from gem_trainer import _loop, presets_tiny, train
from gem_trainer.config import TrainConfig, resolve_table_grads


@pytest.mark.parametrize("asked,world,sharding,expect", [
    ("auto", 1, "none", "sparse"),
    ("auto", 2, "none", "dense"),        # HSDP: FSDP reduces dense gradients
    ("auto", 1, "table_wise", "dense"),  # torchrec's fused backward trains the tables
    ("dense", 1, "none", "dense"),
    ("sparse", 1, "none", "sparse"),
])
def test_resolves_by_world_and_sharding(asked: str, world: int, sharding: str, expect: str) -> None:
    assert resolve_table_grads(asked, world, sharding) == expect


def test_bad_choices_name_the_field_and_rule() -> None:
    with pytest.raises(ValueError, match="table_grads='coo' must be one of"):
        dataclasses.replace(TrainConfig(), table_grads="coo").validate()
    with pytest.raises(ValueError, match="table_grads='sparse' needs sparse_sharding='none'"):
        dataclasses.replace(TrainConfig(), table_grads="sparse", sparse_sharding="table_wise").validate()
    with pytest.raises(ValueError, match="table_grads='sparse' needs a single process"):
        resolve_table_grads("sparse", 4, "none")


def test_one_optimizer_step_equals_the_dense_step() -> None:
    """The trainer's optimizer (row-wise Adagrad for the tables, AdamW for the rest) after one
    step on sparse table gradients leaves the parameters the dense-gradient step leaves."""
    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    cfg = presets_tiny()
    dcfg = _loop.data_config(cfg)
    dense = gem_model.GEMModel(_loop.model_config(cfg, dcfg))
    sparse = copy.deepcopy(dense)
    before = dense.events.item.weight.detach().clone()
    assert _loop.apply_table_grads(sparse, cfg, world=1) == "sparse"
    batch = next(iter(_loop.make_loader(cfg, dcfg, 0, 1, torch.device("cpu"))))
    for m in (dense, sparse):
        opt = _loop.build_optimizer(m, cfg)
        opt.set_step(0)
        _loop.loss_fn(m(batch), batch.labels).backward()
        opt.step(skip=torch.zeros((), dtype=torch.bool))
    assert any(p.grad is not None and p.grad.is_sparse for p in sparse.parameters())
    for (n, pd), (_, ps) in zip(dense.named_parameters(), sparse.named_parameters(), strict=True):
        torch.testing.assert_close(ps, pd, rtol=1e-6, atol=1e-7, msg=n)
    moved = (sparse.events.item.weight.detach() != before).any(dim=1)
    assert moved.any() and not moved.all()  # the looked-up rows moved, the others did not


def test_a_run_reports_its_table_grads_and_trains_alike() -> None:
    base = presets_tiny(steps=4, batch_size=16, eval_batches=0, progress=False)
    s = train(base)
    d = train(dataclasses.replace(base, table_grads="dense"))
    assert (s["table_grads"], d["table_grads"]) == ("sparse", "dense")
    assert s["steps"] == d["steps"] == 4
    assert abs(s["loss"] - d["loss"]) <= 1e-5 * abs(d["loss"]), (s["loss"], d["loss"])
