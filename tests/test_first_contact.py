"""First contact (issue #20): what a user sees from `python3 -m gem_trainer` with its output
going to a pipe or a file (a batch job, `| tee`): progress lines on stderr instead of
silence, a notice when the run will be slow, and a strict-JSON summary recording the
precision. (Checkpoint misuse and flag-named errors: trainer/tests/test_cli_faults.py.)"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from _run import gem


def _strict(line: str) -> dict[str, Any]:
    def refuse(name: str) -> Any:
        raise AssertionError(f"bare {name} in the summary: not JSON")

    return json.loads(line, parse_constant=refuse)  # type: ignore[no-any-return]


def test_piped_output_shows_progress_and_a_strict_summary(tmp_path: Path) -> None:
    res = gem("--steps", "4", "--batch-size", "16", "--eval-batches", "1", "--log-every", "2",
              "--precision", "mxfp8_rceil", "--log-dir", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"gem: note: --precision=mxfp8_rceil on CPU is emulated", res.stderr), res.stderr
    lines = re.findall(r"^step (\d+)/4  loss [\d.]+  [\d,]+ tokens/s  ETA \S+$", res.stderr, flags=re.M)
    assert lines == ["2", "4"], res.stderr
    s = _strict(res.stdout.strip().splitlines()[-1])
    assert s["precision"] == "mxfp8_rceil" and s["precision_effective"] == "mxfp8_rceil (emulated)"
    assert s["steps"] == 4 and isinstance(s["loss"], float)
    recs = [_strict(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [2, 4]
    assert any("eval" in r for r in recs) and "summary" in recs[-1]


def test_help_lists_every_flag_with_its_default() -> None:
    res = gem("--help")
    assert res.returncode == 0, res.stderr
    flags = re.findall(r"^  (--[a-z-]+)", res.stdout, flags=re.M)
    assert {"--steps", "--ckpt-dir", "--resume", "--deterministic", "--log-every"} <= set(flags)
    text = " ".join(res.stdout.split())  # argparse wraps lines anywhere
    assert text.count("(default: ") >= len(flags)
    assert "(default: preset's; tiny " in text
