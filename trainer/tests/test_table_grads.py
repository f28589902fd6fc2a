"""`table_grads`: dense (the default) or sparse embedding gradients (one row per looked-up id,
one process); both train the tables alike."""

import copy
import dataclasses

import pytest
import torch

import gem_model
from gem_trainer import _loop, presets_tiny, train
from gem_trainer.__main__ import parse_args
from gem_trainer.config import TrainConfig


def test_bad_choices_name_the_field_and_rule() -> None:
    with pytest.raises(ValueError, match="table_grads='coo' must be one of"):
        dataclasses.replace(TrainConfig(), table_grads="coo").validate()
    with pytest.raises(ValueError, match="table_grads='sparse' needs sparse_sharding='none'"):
        dataclasses.replace(TrainConfig(), table_grads="sparse", sparse_sharding="table_wise").validate()
    model = gem_model.GEMModel(_loop.model_config(presets_tiny(), _loop.data_config(presets_tiny())))
    with pytest.raises(ValueError, match="table_grads='sparse' needs a single process"):
        _loop.apply_table_grads(model, presets_tiny(table_grads="sparse"), world=4)
    lookups = [m for m in model.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))]
    assert lookups and not any(m.sparse for m in lookups)  # nothing switched
    assert parse_args([]).table_grads == "dense"
    assert parse_args(["--table-grads", "sparse"]).table_grads == "sparse"


def test_one_optimizer_step_equals_the_dense_step() -> None:
    """The trainer's optimizer (row-wise Adagrad for the tables, AdamW for the rest) after one
    step on sparse table gradients leaves the parameters the dense-gradient step leaves."""
    torch.manual_seed(int(torch.randint(0, 10**6, ())))
    cfg = presets_tiny()
    dcfg = _loop.data_config(cfg)
    dense = gem_model.GEMModel(_loop.model_config(cfg, dcfg))
    sparse = copy.deepcopy(dense)
    before = dense.events.item.weight.detach().clone()
    _loop.apply_table_grads(sparse, dataclasses.replace(cfg, table_grads="sparse"), world=1)
    batch = next(iter(_loop.make_loader(cfg, dcfg, 0, 1, torch.device("cpu"))))
    for m in (dense, sparse):
        opt = _loop.build_optimizer(m, cfg)
        opt.set_step(0)
        _loop.loss_fn(m(batch), batch.labels).backward()  # type: ignore[no-untyped-call]
        opt.step(skip=torch.zeros((), dtype=torch.bool))
    assert any(p.grad is not None and p.grad.is_sparse for p in sparse.parameters())
    for (n, pd), (_, ps) in zip(dense.named_parameters(), sparse.named_parameters(), strict=True):
        torch.testing.assert_close(ps, pd, rtol=1e-6, atol=1e-7, msg=n)
    moved = (sparse.events.item.weight.detach() != before).any(dim=1)
    assert moved.any() and not moved.all()  # the looked-up rows moved, the others did not


def test_a_run_reports_its_table_grads_and_trains_alike() -> None:
    base = presets_tiny(steps=4, batch_size=16, eval_batches=0, progress=False)
    assert base.table_grads == "dense"
    s = train(dataclasses.replace(base, table_grads="sparse"))
    d = train(base)
    assert (s["table_grads"], d["table_grads"]) == ("sparse", "dense")
    assert s["steps"] == d["steps"] == 4
    ls, ld = s["loss"], d["loss"]
    assert isinstance(ls, float) and isinstance(ld, float)
    assert abs(ls - ld) <= 1e-5 * abs(ld), (ls, ld)
