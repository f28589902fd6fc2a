"""Issue #20, trainer side: every fault a user can cause gets a clear answer that names the
flag; the summary and the JSONL log are strict JSON; --help documents every flag; a run
without a terminal prints progress lines. Runs in-process (`main([...])`), a few steps each."""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gem_trainer import _preflight
from gem_trainer.__main__ import build_parser, cli_message, main
from gem_trainer._metrics import MetricLog, ProgressLine, dumps, strict
from gem_trainer.config import PRESETS, TrainConfig, tiny

FAST = ["--batch-size", "16", "--eval-batches", "0", "--log-every", "1", "--no-progress"]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main([*FAST, *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _summary(out: str) -> dict[str, Any]:
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


# ---- checkpoint directory misuse ------------------------------------------------------------
def test_a_new_run_into_a_checkpoint_directory_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    rc, _, err = _run(capsys, "--steps", "3", "--ckpt-dir", str(ck))
    assert rc == 0, err
    before = {p.name: p.stat().st_mtime_ns for p in ck.rglob("*")}
    rc, out, err = _run(capsys, "--steps", "5", "--ckpt-dir", str(ck))
    assert rc == 2 and out == ""
    assert f"--ckpt-dir={ck} holds checkpoints (newest: step 3)" in err, err
    assert "pass --resume to continue that run" in err and "another or an empty --ckpt-dir" in err, err
    assert "ckpt_dir" not in err and "resume=True" not in err, err  # flags, not field names
    assert {p.name: p.stat().st_mtime_ns for p in ck.rglob("*")} == before  # nothing touched


def test_resume_on_an_empty_directory_says_it_starts_at_step_0(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "empty"
    rc, out, err = _run(capsys, "--steps", "2", "--ckpt-dir", str(ck), "--resume")
    assert rc == 0, err
    assert f"gem: note: --resume: no checkpoint in --ckpt-dir={ck} yet; starting at step 0" in err, err
    s = _summary(out)
    assert s["steps"] == 2 and s["resumed_from"] is None
    import gem_model  # the summary names the model version its MFU's FLOP count belongs to

    assert s["model_version"] == gem_model.__version__, s["model_version"]
    # ... and a second --resume continues from that run's checkpoint.
    rc, out, err = _run(capsys, "--steps", "3", "--ckpt-dir", str(ck), "--resume")
    assert rc == 0 and "no checkpoint" not in err, err
    assert _summary(out)["resumed_from"] == 2 and _summary(out)["steps"] == 3


def test_steps_below_the_checkpoint_is_refused_and_equal_evaluates_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    assert _run(capsys, "--steps", "4", "--ckpt-dir", str(ck))[0] == 0
    rc, out, err = _run(capsys, "--steps", "2", "--ckpt-dir", str(ck), "--resume")
    assert rc == 2 and out == ""
    assert "--steps=2 is below the checkpoint's step 4" in err and "pass --steps > 4" in err, err
    # At the checkpoint's step: nothing to train; exit 0, loss null with the reason.
    rc, out, err = _run(capsys, "--steps", "4", "--ckpt-dir", str(ck), "--resume")
    assert rc == 0 and "already at --steps=4" in err, err
    s = _summary(out)
    assert s["steps"] == 4 and s["loss"] is None and "no step completed" in s["loss_note"]
    json.dumps(s, allow_nan=False)


@pytest.mark.parametrize("case", ["under_a_file", "is_a_file", "read_only"])
def test_an_unwritable_ckpt_dir_is_refused_at_start_up(case: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    if case == "under_a_file":
        path, rule = f / "ck", "cannot be created"
    elif case == "is_a_file":
        path, rule = f, "is a file, not a directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        path, rule = ro / "ck", "cannot be created"
    rc, out, err = _run(capsys, "--steps", "1000000", "--ckpt-dir", str(path))
    assert rc == 2 and out == "", err
    assert err.startswith(f"gem: error: --ckpt-dir={path} {rule}"), err
    assert "Traceback" not in err
    # The same check for --log-dir.
    rc, _, err = _run(capsys, "--steps", "1000000", "--log-dir", str(path))
    assert rc == 2 and err.startswith(f"gem: error: --log-dir={path} {rule}"), err


def test_check_checkpoints_rules() -> None:
    """The decision table without training (field names: the library's view)."""
    cfg = tiny(ckpt_dir="/c", steps=10)
    _preflight.check_checkpoints(cfg, None)  # fresh directory, new run: fine
    with pytest.raises(ValueError, match=r"ckpt_dir='/c' holds checkpoints \(newest: step 7\)"):
        _preflight.check_checkpoints(cfg, 7)
    res = dataclasses.replace(cfg, resume=True)
    _preflight.check_checkpoints(res, 7)
    _preflight.check_checkpoints(res, 10)
    with pytest.raises(ValueError, match="steps=10 is below the checkpoint's step 11"):
        _preflight.check_checkpoints(res, 11)
    with pytest.raises(ValueError, match="steps=10 is below the loaded checkpoint's step 12"):
        _preflight.check_resumed_step(res, 12)


# ---- errors name flags ----------------------------------------------------------------------
_BAD = [("steps", 0), ("batch_size", -1), ("batch_tokens", -5), ("lr", 0.0), ("data", "csv:x"),
        ("ckpt_every", 0), ("keep_last", 0), ("log_every", 0), ("eval_batches", -1),
        ("max_bad_steps", 0), ("sparse_lr", -1.0), ("sparse_mp", -1), ("sparse_mp", 2),
        ("warmup_steps", -1), ("lr_final_frac", 2.0), ("resume", True), ("triton_precompile", "/no/such.json"),
        ("jfa_gluon", "bwd")]


@pytest.mark.parametrize("field,value", _BAD)
def test_every_validate_error_names_the_flag(field: str, value: object) -> None:
    if field not in {f.name for f in dataclasses.fields(TrainConfig)}:
        pytest.skip(f"{field} is not a TrainConfig field here")
    with pytest.raises(ValueError) as e:
        dataclasses.replace(TrainConfig(), **{field: value}).validate()
    msg = cli_message(str(e.value))
    flag = "--" + field.replace("_", "-")
    assert flag in msg, (str(e.value), msg)
    # No snake_case field name is left over (those only exist in the config, not the CLI).
    fields = {f.name for f in dataclasses.fields(TrainConfig) if "_" in f.name}
    assert not [w for w in re.findall(r"(?<![\w-])[a-z]+(?:_[a-z]+)+", msg) if w in fields], msg


def test_cli_message_forms() -> None:
    assert cli_message("resume=True needs ckpt_dir") == "--resume needs --ckpt-dir"
    assert cli_message("progress=False is odd") == "--no-progress is odd"
    assert cli_message("steps=0 must be an int >= 1") == "--steps=0 must be an int >= 1"
    assert cli_message("ckpt_dir='/a b' x") == "--ckpt-dir='/a b' x"
    assert cli_message("pass `steps` > 4; bad data in steps") == "pass --steps > 4; bad data in steps"
    assert cli_message("column 'event_ids' is bad") == "column 'event_ids' is bad"  # not a field


def test_cli_bad_value_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--resume"]) == 2
    assert "gem: error: --resume needs --ckpt-dir" in capsys.readouterr().err


# ---- --help -----------------------------------------------------------------------------------
def test_help_has_a_line_and_a_default_for_every_flag() -> None:
    parser, flags = build_parser()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert fields <= set(flags), fields - set(flags)  # every config field has a flag
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and "(default: " in action.help, action.option_strings
    text = parser.format_help()
    differing = [f for f in fields - {"preset"}
                 if len({repr(getattr(m(), f)) for m in PRESETS.values()}) > 1]
    assert differing  # e.g. steps: the presets disagree, so --help says so
    for f in differing:
        action = next(a for a in parser._actions if a.dest == f)
        assert "(default: preset's; tiny " in str(action.help), action.help
    assert "--deterministic" in text and "on for CPU" in text


# ---- strict JSON --------------------------------------------------------------------------------
def test_strict_replaces_non_finite_numbers_with_null_and_a_note() -> None:
    raw = {"loss": math.nan, "mfu": None, "tasks": {"a": {"auc": math.inf, "ne": 0.9}},
           "list": [1.0, -math.inf], "ok": 1}
    s = strict(raw, {"loss": "no step completed"})
    assert s == {"loss": None, "loss_note": "no step completed", "mfu": None,
                 "tasks": {"a": {"auc": None, "auc_note": "was inf", "ne": 0.9}},
                 "list": [1.0, None], "ok": 1}
    json.dumps(s, allow_nan=False)
    assert json.loads(dumps(raw))["loss"] is None
    with pytest.raises(ValueError):
        json.dumps(raw, allow_nan=False)  # what strict() is for


def test_a_run_with_no_finite_step_prints_strict_json(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    import gem_trainer._loop as loop

    real = loop.loss_fn

    def nan_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return real(logits, labels) * math.nan

    monkeypatch.setattr(loop, "loss_fn", nan_loss)
    rc, out, err = _run(capsys, "--steps", "5", "--max-bad-steps", "2")
    assert rc == 1, err  # the NaN guard's exit code
    line = out.strip().splitlines()[-1]
    assert "NaN" not in line and "Infinity" not in line, line
    s = json.loads(line)
    assert s["stop_reason"] == "nan" and s["steps"] == 0
    assert s["loss"] is None and s["loss_note"] == "no step completed (2 non-finite)", s


class _FakeTB:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, v: float, step: int) -> None:
        self.scalars.append((tag, v, step))

    def close(self) -> None:
        pass


def test_metric_log_is_strict_and_puts_eval_in_tensorboard(tmp_path: Path) -> None:
    log = MetricLog(str(tmp_path), rank=0)
    tb = _FakeTB()
    log._tb = tb
    log.write(3, loss=math.nan, samples=4)
    log.write(3, eval={"click": {"ne": 0.9, "auc": 0.7, "auc_bayes": math.nan}})
    log.close()
    recs = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["loss"] is None and recs[1]["eval"]["click"]["auc"] == 0.7
    assert ("eval/click/auc", 0.7, 3) in tb.scalars and ("eval/click/ne", 0.9, 3) in tb.scalars
    assert not [t for t, _, _ in tb.scalars if t in ("loss", "eval/click/auc_bayes")]  # NaN: no point


# ---- first contact -------------------------------------------------------------------------------
def test_progress_line_every_n_steps_and_at_the_end() -> None:
    buf = io.StringIO()
    p = ProgressLine(total=7, start=0, every=3, stream=buf)
    printed = [p.update(s, 0.5, 100) for s in range(1, 8)]
    assert [s for s, x in zip(range(1, 8), printed) if x] == [3, 6, 7]
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"step 3/7  loss 0\.5000  [\d,]+ tokens/s  ETA \d+m\d\ds", lines[0]), lines[0]
    assert lines[-1].startswith("step 7/7") and lines[-1].endswith("ETA 0m00s")


def test_a_run_without_a_terminal_prints_progress_lines_and_logs_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--batch-size", "16", "--eval-batches", "1", "--steps", "5", "--log-every", "2",
               "--log-dir", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    lines = [ln for ln in cap.err.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["2/5", "4/5", "5/5"], cap.err
    recs = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    loss_steps = [r["step"] for r in recs if "loss" in r]
    assert loss_steps == [2, 4, 5]  # the last step once
    evals = [r for r in recs if "eval" in r]
    assert len(evals) == 1 and {"ne", "auc"} <= set(evals[0]["eval"]["click"])
    s = _summary(cap.out)
    assert (s["precision"], s["precision_effective"], s["deterministic"]) == ("fp32", "fp32", True)


def test_slow_runs_say_so() -> None:
    import torch

    cpu = torch.device("cpu")
    notes = _preflight.slow_run_notices(tiny(precision="mxfp8_rceil"), cpu)
    assert len(notes) == 1 and "emulated" in notes[0] and "mxfp8_rceil" in notes[0]
    assert "runs in fp32" in _preflight.slow_run_notices(tiny(precision="bf16"), cpu)[0]
    assert _preflight.slow_run_notices(tiny(), cpu) == []
    assert _preflight.slow_run_notices(tiny(precision="mxfp8_rceil"), torch.device("cuda")) == []
    assert _preflight.effective_precision(tiny(precision="bf16"), cpu) == "fp32"
    assert _preflight.effective_precision(tiny(precision="mxfp8_floor"), cpu) == "mxfp8_floor (emulated)"


# ---- shutdown ---------------------------------------------------------------------------------
def test_a_finished_run_destroys_its_process_group(capsys: pytest.CaptureFixture[str]) -> None:
    # One process with torchrec tables trains in a world of one (a process group); a run that
    # leaves it alive can abort at interpreter exit (Gloo threads), so main() destroys it.
    import torch.distributed as dist

    pytest.importorskip("torchrec")  # in the project's lock; the GPU box has none

    assert not dist.is_initialized()
    rc, out, err = _run(capsys, "--steps", "1", "--sparse-sharding", "table_wise")
    assert rc == 0, err
    assert _summary(out)["sparse"]["sharding"] == "table_wise"
    assert not dist.is_initialized()
