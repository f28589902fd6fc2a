"""No host sync in a steady-state training step (issue #16 item 3).

The skip of a non-finite step is decided on the device (fused AdamW's `found_inf`, the
tables' masked gradients) and the step's loss, stop signal and checkpoint flag are read one
step late (gem_trainer._loop). On CPU: a skipped step leaves parameters and optimizer state
bitwise unchanged, and reading late books exactly what reading every step at its end does,
NaN runs included. On CUDA (skipped without a GPU): the trainer's steady-state steps run
under `torch.cuda.set_sync_debug_mode("error")` (the GEM_SYNC_DEBUG_AFTER hook), NaN
injection included.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import gem_trainer._loop as loop
from _poison import nan_loss_at
from gem_checkpoint import Checkpointer
from gem_trainer import presets_tiny, train
from gem_trainer._metrics import WARMUP_STEPS
from gem_trainer._optim import Optimizers, RowWiseAdagrad, dense_adamw

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a GPU"))]


def _optimizers(device: str, seed: int) -> tuple[Optimizers, list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    dense = [torch.nn.Parameter(torch.randn(5, 3, generator=g).to(device)),
             torch.nn.Parameter(torch.randn(4, generator=g).to(device))]
    table = torch.nn.Parameter(torch.randn(9, 6, generator=g).to(device))
    opt = Optimizers(dense_adamw(dense, lr=1e-2), RowWiseAdagrad([table], lr=0.1),
                     total_steps=20, warmup=2, final_frac=0.1)
    return opt, [*dense, table]


def _grads(params: list[torch.nn.Parameter], seed: int, *, nan: bool = False) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        grad = torch.randn(p.shape, generator=g)
        if p.dim() == 2 and p.shape[0] == 9:
            grad[torch.rand(9, generator=g) < 0.4] = 0.0  # absent ids
        if nan:
            grad[0] = math.nan
        p.grad = grad.to(p.device)


def _snapshot(opt: Optimizers, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in params]
    for o in opt.optimizers:
        for p in params:
            out += [v.clone() for _, v in sorted(o.state.get(p, {}).items())]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_skipped_step_changes_nothing_and_is_not_counted(device: str, seed: int) -> None:
    opt, params = _optimizers(device, seed)
    ref, ref_params = _optimizers(device, seed)
    assert all(g["fused"] for g in opt.dense.param_groups)
    no, yes = torch.tensor(False, device=device), torch.tensor(True, device=device)
    for i in range(3):
        _grads(params, 10 * seed + i)
        _grads(ref_params, 10 * seed + i)
        opt.set_step(i)
        opt.step(skip=no)
        ref.set_step(i)
        ref.step()  # without the flag: the same update, bit for bit
    before = _snapshot(opt, params)
    assert len(before) == len(params) + 3 * 2 + 1  # AdamW exp_avg, exp_avg_sq, step; Adagrad sum
    _grads(params, 99, nan=True)
    opt.set_step(3)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step(skip=~torch.isfinite(params[0].grad.sum()))  # type: ignore[union-attr]
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    opt.zero_grad()
    after = _snapshot(opt, params)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))
    # The skipped step was not counted: the next one equals the reference's fourth.
    _grads(params, 7)
    _grads(ref_params, 7)
    opt.set_step(3)
    opt.step(skip=no)
    ref.set_step(3)
    ref.step()
    for a, b in zip(_snapshot(opt, params), _snapshot(ref, ref_params), strict=True):
        assert torch.equal(a, b)


def test_skip_refuses_an_unfused_dense_optimizer() -> None:
    w = torch.nn.Parameter(torch.zeros(3))
    opt = Optimizers(torch.optim.AdamW([w], fused=False), None, total_steps=1, warmup=0, final_frac=1.0)
    w.grad = torch.ones(3)
    with pytest.raises(ValueError, match="fused"):
        opt.step(skip=torch.tensor(False))


def _losses(log_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec and "samples" in rec:
            out[int(rec["step"])] = float(rec["loss"])
    return out


def _run(monkeypatch: pytest.MonkeyPatch, tmp: Path, poison: set[int], *, every_step: bool,
         **kw: Any) -> tuple[dict[str, Any], dict[int, float]]:
    with monkeypatch.context() as m:
        m.setattr(loop, "loss_fn", nan_loss_at(poison))
        if every_step:  # the reference: every step read at its end (the pre-issue-16 loop)
            m.setattr(loop, "_settle_now", lambda *a, **k: True)
        s = train(presets_tiny(batch_size=16, eval_batches=0, progress=False, log_every=1,
                               log_dir=str(tmp), **kw))
    return s, _losses(tmp)


_KEYS = ("steps", "loss", "bad_steps", "stop_reason")


def test_reading_late_books_what_reading_every_step_does(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """NaNs after the warm-up (read late): the same steps skipped, the same lr schedule
    positions (every logged loss bitwise equal), the same summary."""
    poison = {WARMUP_STEPS + 3, WARMUP_STEPS + 5, WARMUP_STEPS + 6}
    ref, want = _run(monkeypatch, tmp_path / "ref", poison, every_step=True, steps=12)
    got_s, got = _run(monkeypatch, tmp_path / "late", poison, every_step=False, steps=12)
    assert ref["steps"] == 12 and ref["bad_steps"] == 3, ref
    assert {k: got_s[k] for k in _KEYS} == {k: ref[k] for k in _KEYS}
    assert sorted(got) == list(range(1, 13)) and got == want


def test_a_run_of_nans_read_late_stops_where_the_reference_stops(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    first = WARMUP_STEPS + 3
    kw = {"steps": 40, "max_bad_steps": 3, "ckpt_every": 100}
    ref, want = _run(monkeypatch, tmp_path / "ref", set(range(first, 100)), every_step=True,
                     ckpt_dir=str(tmp_path / "ck_ref"), **kw)
    got_s, got = _run(monkeypatch, tmp_path / "late", set(range(first, 100)), every_step=False,
                      ckpt_dir=str(tmp_path / "ck_late"), **kw)
    assert ref["stop_reason"] == "nan" and ref["steps"] == first - 1 and ref["bad_steps"] == 3, ref
    assert {k: got_s[k] for k in _KEYS} == {k: ref[k] for k in _KEYS} and got == want
    assert Checkpointer(str(tmp_path / "ck_late")).latest() == first - 1


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("poison", [set(), {WARMUP_STEPS + 5, WARMUP_STEPS + 7}], ids=["clean", "nan"])
def test_steady_state_steps_do_not_sync_on_cuda(monkeypatch: pytest.MonkeyPatch, poison: set[int]) -> None:
    """Steps after the warm-up run under set_sync_debug_mode("error"); a NaN there is still
    skipped on the device and counted."""
    monkeypatch.setenv("GEM_SYNC_DEBUG_AFTER", str(WARMUP_STEPS))
    monkeypatch.setattr(loop, "loss_fn", nan_loss_at(poison))
    s = train(presets_tiny(steps=16, batch_size=16, eval_batches=0, progress=False))
    assert s["device"].startswith("cuda"), s
    assert s["steps"] == 16 and s["bad_steps"] == len(poison) and math.isfinite(s["loss"]), s
    assert s["sync_debug_steps"] >= 8, s  # the steps after warm-up + the first late read


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_a_run_of_nans_stops_on_cuda_under_sync_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_SYNC_DEBUG_AFTER", str(WARMUP_STEPS))
    first = WARMUP_STEPS + 4
    monkeypatch.setattr(loop, "loss_fn", nan_loss_at(set(range(first, 100))))
    s = train(presets_tiny(steps=40, batch_size=16, eval_batches=0, progress=False, max_bad_steps=3))
    assert s["stop_reason"] == "nan" and s["steps"] == first - 1 and s["bad_steps"] == 3, s
    assert s["sync_debug_steps"] > 0, s


def _slow_reads(m: pytest.MonkeyPatch, wait: float) -> None:
    """Each step's first read of its values waits `wait` s, as a read waits for the GPU."""
    real = loop._Pending.values

    def values(self: loop._Pending) -> list[float]:
        if self.vals is None:
            time.sleep(wait)
        return real(self)
    m.setattr(loop._Pending, "values", values)


@pytest.mark.parametrize("every_step", [True, False], ids=["read-at-end", "read-late"])
def test_a_steps_time_holds_its_wait_for_the_device(monkeypatch: pytest.MonkeyPatch, every_step: bool) -> None:
    """A step read at its end waits for the device after its last timestamp; that wait is
    the step's (the tenth session found checkpointed H200 runs reporting 0.186 s steps, 46 %
    MFU, for steps whose device time was ~0.24 s: the waits of the steps read at their ends
    fell between two step windows). Read late, the wait falls in the next step's window."""
    # Long enough that a loaded 2-core CI box's tiny step (up to ~1.5 s seen) stays below it:
    # one wait plus the step's work < 2 waits <= a window holding two waits.
    wait = 2.5
    with monkeypatch.context() as m:
        _slow_reads(m, wait)
        if every_step:
            m.setattr(loop, "_settle_now", lambda *a, **k: True)
        s = train(presets_tiny(steps=WARMUP_STEPS + 4, batch_size=16, eval_batches=0, progress=False))
    assert s["steps"] == WARMUP_STEPS + 4, s
    assert s["step_s_median"] >= wait and s["time_to_first_step_s"] >= wait, s
    # every window holds one wait, not two (a CI run measured 2.05 s against the old bound of
    # 2 * 0.5 + 1.0 s: the step's own work, not a second wait)
    assert s["step_s_median"] < 2 * wait, s


def test_a_delayed_save_keeps_the_loop_reading_late(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Writes slower than the save interval: while the write runs, a single-process loop does
    not read each step at its end (the due save would be delayed again anyway); it saves once
    the write ends, books what reading every step books, and ends with a final checkpoint."""
    ends: list[bool] = []
    real = loop._settle_now

    def spy(*a: Any, **k: Any) -> bool:
        out = real(*a, **k)
        ends.append(out)
        return out
    monkeypatch.setenv("GEM_CKPT_FAULT", "write:sleep=1.5")
    steps = 16
    with monkeypatch.context() as m:
        m.setattr(loop, "_settle_now", spy)
        m.setattr(loop, "loss_fn", nan_loss_at(set()))
        s = train(presets_tiny(steps=steps, batch_size=16, eval_batches=0, progress=False, log_every=1,
                               log_dir=str(tmp_path / "late"), ckpt_dir=str(tmp_path / "ck"), ckpt_every=2))
    ref, want = _run(monkeypatch, tmp_path / "ref", set(), every_step=True, steps=steps)
    assert s["steps"] == steps and s["ckpt_delayed_steps"] > 0, s
    assert _losses(tmp_path / "late") == want
    assert Checkpointer(str(tmp_path / "ck")).latest() == steps
    steady = ends[WARMUP_STEPS:-1]
    # Read at the end: the steps whose number is a multiple of 2 (a save falls due) and the
    # step after a write ended; without the rule every delayed step is read at its end too.
    assert steady.count(False) >= 2, ends


def test_the_save_cadence_counts_from_the_resumed_step(tmp_path: Path) -> None:
    """`ckpt_steps_between_saves` of a resumed run counts from its checkpoint's step. How many
    saves the loop makes depends on the write's speed (on a loaded CI box a write outlasted
    two steps and one save moved to the end of the run), so the figure is checked against
    the count of saves the run reports."""
    kw: dict[str, Any] = {"batch_size": 16, "eval_batches": 0, "progress": False,
                          "ckpt_dir": str(tmp_path / "ck"), "ckpt_every": 2}
    first = train(presets_tiny(steps=4, **kw))
    assert first["ckpt_writer"] == ("process" if torch.cuda.is_available() else "thread"), first  # "auto"
    assert first["ckpt_saves"] >= 1 and first["ckpt_steps_between_saves"] == 4 / first["ckpt_saves"], first
    again = train(presets_tiny(steps=10, resume=True, **kw))
    assert again["steps"] == 10 and again["ckpt_saves"] >= 1, again
    assert again["ckpt_steps_between_saves"] == (10 - 4) / again["ckpt_saves"], again
