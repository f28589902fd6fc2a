"""The bench and the end-to-end command, at toy sizes (the numbers are not meaningful here)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gem_transfer import METHODS
from gem_transfer.__main__ import main as cli
from gem_transfer.bench.transfer import main as bench


def test_quick_bench_table_chart_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench(["--quick", "--out", str(tmp_path), "--device", "cpu", "--eval-samples", "256"])
    out = capsys.readouterr().out.strip().splitlines()
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
    else:
        assert "chart skipped: matplotlib is not installed" in out


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
