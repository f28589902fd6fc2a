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
