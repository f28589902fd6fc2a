"""`--compile-aot DIR`: the trainer's blocks compiled ahead of time by one run and loaded by the
next (gem_parallel.AotBlocks), so a warm start skips dynamo's tracing.

Two fresh processes train the tiny preset compiled, with the same store and the same inductor
cache folder (a second run on one machine): the first compiles and saves every variant, the
second loads them all, compiles none, and trains to the same losses and evaluation bit for bit
(CPU, deterministic). Bad settings are refused before anything is built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gem_trainer import _preflight, presets_tiny


def _gem(tmp: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "gem_trainer", "--no-progress", *args], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
    return out


def test_a_second_run_loads_every_block_and_trains_the_same(tmp_path: Path) -> None:
    store = tmp_path / "aot"
    args = ("--compile", "--compile-aot", str(store), "--steps", "8", "--eval-batches", "2")
    first = _gem(tmp_path, *args)
    aot = first["compile_aot"]
    assert aot["compiled"] >= 2 and aot["loaded"] == 0 and aot["save_errors"] == 0, aot
    files = sorted(p.name for p in store.rglob("*.bin"))
    assert len(files) == aot["compiled"], files

    second = _gem(tmp_path, *args)
    aot2 = second["compile_aot"]
    assert aot2["loaded"] == aot["compiled"] and aot2["compiled"] == 0, aot2
    assert aot2["stale"] == 0 and aot2["unreadable"] == 0, aot2
    assert sorted(p.name for p in store.rglob("*.bin")) == files  # nothing rewritten
    assert second["loss"] == first["loss"], (first["loss"], second["loss"])
    assert second["tasks"] == first["tasks"]
    assert second["recompiles_per_100_steps"] == 0.0


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compile_aot=.*needs compile=True"):
        presets_tiny(compile_aot=str(tmp_path)).validate()
    afile = tmp_path / "file"
    afile.write_text("keep me")
    with pytest.raises(ValueError, match="compile_aot=.*is a file"):
        _preflight.check_dirs(presets_tiny(compile=True, compile_aot=str(afile)))
    assert afile.read_text() == "keep me"
    with pytest.raises(ValueError, match="compile_aot=.*needs one process"):
        _preflight.check_compile_aot(presets_tiny(compile=True, compile_aot=str(tmp_path)), 2)
    _preflight.check_compile_aot(presets_tiny(compile=True, compile_aot=str(tmp_path)), 1)
