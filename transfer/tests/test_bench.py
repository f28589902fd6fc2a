"""The bench and the end-to-end command, at toy sizes (the numbers are not meaningful here)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from gem_transfer import METHODS
from gem_transfer.__main__ import main as cli
from gem_transfer.bench.transfer import main as bench


def test_quick_bench_table_chart_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quick bench with `--sweep` (N = 64, 128, 256 of its 256 student samples; the run
    without a sweep is the gem smoke test's): the preset's N at the top level, every N and method
    in the sweep, one teacher scored on the same held-out set at every N."""
    bench(["--quick", "--sweep", "--out", str(tmp_path), "--device", "cpu", "--eval-samples", "256"])
    text = capsys.readouterr().out
    out = text.strip().splitlines()
    last = json.loads(out[-1], parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert set(last["tasks"]) == {"click", "conversion"}
    for row in last["tasks"].values():
        for key in ("bayes", "teacher", *METHODS):
            assert 0.0 < row[key] < 1.0, (key, row)
        assert row["gain"]["label_only"] == 0.0 and isinstance(row["target_met"], bool)
    lat = last["latency"]
    assert lat["teacher_us"] > 0 and all(lat[m]["ratio"] > 0 for m in METHODS)
    assert all(lat[m]["flops_frac"] < 0.5 for m in METHODS)  # a fraction of the teacher's FLOPs
    assert last["eval_samples"] >= 256 and (tmp_path / "transfer.json").exists()
    assert any(line.startswith("  combined") for line in out)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "transfer_gains.png").stat().st_size > 0
        assert (tmp_path / "transfer_sweep.png").stat().st_size > 0
    else:
        assert "chart skipped: matplotlib is not installed" in out
    sweep = last["sweep"]
    assert last["student_samples_sweep"] == [64, 128, 256] and list(sweep) == ["64", "128", "256"]
    assert last["teacher_train"]["samples"] == last["teacher_samples"] == 1024  # trained once
    for n, e in sweep.items():
        assert e["samples"] == int(n) and e["teacher_samples_over_n"] == 1024 / int(n)
        assert e["student_seeds"] == 1 and f"N = {int(n):,} ({1024 / int(n):.1f}x fewer" in text
        for t, row in e["tasks"].items():
            assert all(0.0 < row[m] < 1.0 for m in METHODS)
            # the same teacher on the same held-out samples at every N
            assert row["teacher"] == last["tasks"][t]["teacher"] and row["bayes"] == last["tasks"][t]["bayes"]
            assert e["best_over_kd"][t] == row["best_gain_over_kd_gain"]
            assert e["teacher_over_kd"][t] == row["teacher_gain_over_kd_gain"]
    assert sweep["256"]["tasks"] == last["tasks"]  # the top level is the preset's N, one of the sweep's


def test_end_to_end_command_trains_saves_and_reloads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--teacher-samples", "512", "--student-samples", "128", "--eval-samples", "256",
            "--methods", "label_only,combined", "--device", "cpu", "--out", str(tmp_path / "run")]
    cli([*args, "--save-teacher", str(tmp_path / "t.pt")])
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # strict JSON
    assert (tmp_path / "t.pt").exists() and set(first["tasks"]["click"]) >= {"label_only", "combined", "teacher"}
    # the saved teacher, the same out dir: the score shards are reused, the teacher's AUC is the same
    cli([*args, "--teacher", str(tmp_path / "t.pt")])
    captured = capsys.readouterr()
    again = json.loads(captured.out.strip().splitlines()[-1])
    assert "0 shards written" in captured.err
    for t in ("click", "conversion"):
        assert again["tasks"][t]["teacher"] == first["tasks"][t]["teacher"]
    with pytest.raises(SystemExit):
        cli(["--methods", "nope"])


def test_run_transfer_on_parquet_data(tmp_path: Path) -> None:
    """`data="parquet:DIR"`: the last row groups are held out, the students take the ones just
    before them, the teacher the rest."""
    import gem_data
    from gem_transfer import read_scores, run_transfer
    from gem_transfer.presets import tiny

    src = gem_data.SyntheticSource(gem_data.presets.tiny(seed=0), block_size=64)
    gem_data.write_parquet((src.batch(b, "native") for b in range(16)), tmp_path / "data",
                           tasks=("click", "conversion"), samples_per_shard=256, rows_per_group=32)
    cfg = tiny(data=f"parquet:{tmp_path / 'data'}", teacher_samples=512, student_samples=128, eval_samples=256,
               methods=("label_only", "sharing"))
    res = run_transfer(cfg, tmp_path / "run")
    assert res["teacher_train"]["samples"] == 512 and res["score"]["eval"]["samples"] == 256
    held = read_scores(tmp_path / "run" / "scores_eval")
    assert sorted(set(held["block"].tolist())) == list(range(24, 32))  # 32 row groups of 32 rows
    assert sorted(set(read_scores(tmp_path / "run" / "scores_student")["block"].tolist())) == list(range(20, 24))
    assert set(res["students"]) == {"label_only", "sharing"} and "sharing" in res["table"]


def test_per_domain_students(tmp_path: Path) -> None:
    """student_domain=d: every student and held-out sample is from surface d; the teacher saw all
    domains, and none of the students' samples (they follow its 4 blocks)."""
    import numpy as np

    from gem_transfer import read_scores, run_transfer
    from gem_transfer.presets import tiny

    cfg = tiny(teacher_samples=256, student_samples=100, eval_samples=200, methods=("label_only",), student_domain=1)
    res = run_transfer(cfg, tmp_path)
    tr, ev = res["objects"]["train_set"], res["objects"]["eval_set"]
    assert 100 <= len(tr) < 100 + 64 and 200 <= len(ev) < 200 + 64
    assert (np.asarray(tr.host.domain) == 1).all() and (np.asarray(ev.host.domain) == 1).all()
    assert len(tr) == len(tr.teacher_logits) == len(tr.teacher_repr)
    assert read_scores(tmp_path / "scores_student")["block"].min() == 256 // 64
    with pytest.raises(ValueError, match="student_domain=-1"):
        tiny(student_domain=-1)


def test_gem_preset_smoke_runs_the_gpu_code_path_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--preset gem --smoke`: GEM-like features (3 tasks, 4 domains), the h200 teacher's layer
    kinds at toy widths, token-budget teacher steps, the time budget, the JSON line."""
    last = bench(["--preset", "gem", "--smoke", "--out", str(tmp_path), "--device", "cpu", "--time-budget", "120"])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == last and last["preset"] == "gem" and last["smoke"] is True
    assert set(last["tasks"]) == {"click", "conversion", "engagement"}
    assert last["time_budget"] == 120.0 and last["seconds"] < 120.0
    cfg = last["teacher_params"]
    assert cfg > 0 and last["teacher_train"]["steps"] > 1  # token-budget steps, not one step
    assert all(r["stopped_by"] in ("epochs", "patience", "time") for v in last["students"].values() for r in v)


def test_time_budget_cuts_teacher_and_students(tmp_path: Path) -> None:
    """A tight time_budget stops the teacher at its share and every student at its slice."""
    import time

    from gem_transfer import run_transfer
    from gem_transfer.presets import tiny

    cfg = tiny(teacher_samples=1 << 20, student_samples=256, eval_samples=128, time_budget=5.0,
               methods=("label_only", "kd"))
    t0 = time.perf_counter()
    res = run_transfer(cfg, tmp_path)
    took = time.perf_counter() - t0
    assert res["teacher_train"]["stopped_by"] == "seconds" and res["teacher_train"]["samples"] < 1 << 20
    assert took < 5.0 + 10.0, took  # scoring and evaluation are not budgeted (a busy box); unbudgeted: minutes
    assert {r["stopped_by"] for v in res["students"].values() for r in v["runs"]} <= {"time", "patience", "epochs"}


def test_sweep_subsets_are_nested_and_paired(tmp_path: Path) -> None:
    """The students of N train on the first N of the scored student samples, and are the students a
    run with student_samples=N trains (same samples, seeds, held-out set); sweep_seeds at the other N."""
    import numpy as np
    import torch

    import gem_model
    from gem_transfer import DistillConfig, run_transfer
    from gem_transfer._pipeline import data_config, teacher_config
    from gem_transfer.presets import tiny

    base = tiny(teacher_samples=256, student_samples=128, eval_samples=128, methods=("label_only", "sharing"),
                distill=DistillConfig(epochs=2))
    torch.manual_seed(0)
    teacher = gem_model.GEMModel(teacher_config(base, data_config(base))).eval()  # untrained: pairing only
    cfg = dataclasses.replace(base, student_samples_sweep=(32, 64), student_seeds=2, sweep_seeds=1)
    res = run_transfer(cfg, tmp_path / "sweep", teacher=teacher)
    sets = res["objects"]["sweep_sets"]
    assert sorted(sets) == [32, 64, 128] and res["objects"]["train_set"] is sets[128]
    for n in (32, 64):
        for name in ("teacher_logits", "teacher_repr", "labels"):
            assert torch.equal(getattr(sets[n], name), getattr(sets[128], name)[:n]), (n, name)
        assert np.array_equal(np.asarray(sets[n].host.lengths), np.asarray(sets[128].host.lengths)[:n])
    assert {n: e["seeds"] for n, e in res["sweep"].items()} == {32: 1, 64: 1, 128: 2}
    assert res["students"] is res["sweep"][128]["students"]
    alone = run_transfer(dataclasses.replace(base, student_samples=64), tmp_path / "alone", teacher=teacher)
    for m in ("label_only", "sharing"):
        assert alone["students"][m]["tasks"] == res["sweep"][64]["students"][m]["tasks"], m
    with pytest.raises(ValueError, match="student_samples_sweep"):
        dataclasses.replace(base, student_samples_sweep=(129,))


@pytest.mark.parametrize("value", ["0", "-64", "257", "1.5", "64,abc", "64,"])
def test_bad_sweep_values_name_the_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before the teacher trains, naming --student-samples-sweep (--quick: 256 student samples)."""
    with pytest.raises(SystemExit):
        bench(["--quick", "--device", "cpu", "--student-samples-sweep", value])
    err = capsys.readouterr().err
    assert "--student-samples-sweep" in err and ("not an integer" in err or "must be in [2, 256]" in err), err
