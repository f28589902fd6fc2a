"""train_teacher: learns, honours its sample / time limits, token-budget batches; bad arguments."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from _common import source, teacher
from gem_transfer import train_teacher
from gem_transfer._window import BlockWindow


def _held_out_bce(model: torch.nn.Module) -> float:
    src = source(block_size=64)
    with torch.no_grad():
        return sum(float(F.binary_cross_entropy_with_logits(model(b), b.labels))
                   for b in (src.batch(5000 + i, "native") for i in range(4))) / 4


def test_teacher_learns_within_sample_budget() -> None:
    model = teacher(seed=4)
    before = _held_out_bce(model)
    log = io.StringIO()
    info = train_teacher(model, source(block_size=16), batch_blocks=2, max_samples=800, lr=3e-3, log=log,
                         log_every=10)
    assert info["samples"] == 800 and info["steps"] == 25 and info["stopped_by"] == "samples"
    assert not model.training and "teacher step 25: 800/800 samples" in log.getvalue()
    assert _held_out_bce(model) < before - 0.05, (before, _held_out_bce(model))


def test_time_limit_and_token_budget() -> None:
    model = teacher(seed=5)
    info = train_teacher(model, BlockWindow(source(block_size=8), 0, 50), tokens_per_batch=400, max_seconds=1e-6,
                         log=io.StringIO())
    assert info["steps"] == 1 and info["stopped_by"] == "seconds" and info["tokens"] >= 400
    info = train_teacher(model, BlockWindow(source(block_size=8), 0, 6), batch_blocks=2, log=io.StringIO())
    assert info["samples"] == 48 and info["stopped_by"] == "samples"


def test_bad_arguments_are_named() -> None:
    model, src = teacher(), source()
    with pytest.raises(ValueError, match="needs max_samples"):
        train_teacher(model, src)
    with pytest.raises(ValueError, match="batch_blocks=0"):
        train_teacher(model, src, batch_blocks=0, max_samples=8)
    with pytest.raises(ValueError, match="max_seconds=0"):
        train_teacher(model, src, max_samples=8, max_seconds=0)


def test_tables_take_adagrad_steps_and_dense_params_adamw() -> None:
    """One step against a reference: the first Adagrad step moves each table entry with a
    non-zero gradient by table_lr * |g| / (|g| + eps) (table_lr unless |g| ~ eps), leaves absent rows alone; the dense
    parameters take torch's AdamW step at the warm-up lr."""
    import copy

    from gem_transfer._teacher import _lr_scale, embedding_tables

    torch.manual_seed(11)
    model = teacher(seed=int(torch.randint(0, 1000, ()).item())).train()
    ref = copy.deepcopy(model)
    src = BlockWindow(source(block_size=16), int(torch.randint(0, 10_000, ()).item()), 1)
    batch = src.read(0).to_batch("native")
    F.binary_cross_entropy_with_logits(ref(batch), batch.labels).backward()  # type: ignore[no-untyped-call]
    tables = embedding_tables(ref)
    dense = [p for p in ref.parameters() if all(p is not t for t in tables)]
    lr = 2e-3
    opt = torch.optim.AdamW(dense, lr=lr * _lr_scale(0.0))
    opt.step()
    train_teacher(model, src, lr=lr, table_lr=0.1, max_samples=16, log=io.StringIO())
    absent = 0
    for (name, p), (_, q), in zip(ref.named_parameters(), model.named_parameters()):
        if any(p is t for t in tables):
            g = p.grad
            assert g is not None
            moved = (q.detach() - p.detach()).abs()
            want = 0.1 * g.abs() / (g.abs() + 1e-10)  # Adagrad's first step, eps = 1e-10
            torch.testing.assert_close(moved, want, rtol=1e-4, atol=1e-6, msg=name)
            assert torch.equal(moved[g == 0], torch.zeros_like(moved[g == 0])), name
            assert (g != 0).any(), name
            absent += int((g.abs().sum(1) == 0).sum())
        else:
            torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert len(tables) >= 3 and len(dense) > len(tables) and absent > 0


def test_lr_schedule_warms_up_then_decays_to_a_tenth() -> None:
    from gem_transfer._teacher import _lr_scale

    assert _lr_scale(0.0) == 0.01 and _lr_scale(0.01) == pytest.approx(0.5)
    assert _lr_scale(0.02) == pytest.approx(1.0) and _lr_scale(1.0) == pytest.approx(0.1)
    xs = [_lr_scale(i / 100) for i in range(2, 101)]
    assert all(a >= b for a, b in zip(xs, xs[1:]))
