"""`--compile-aot DIR`: the trainer's blocks compiled ahead of time by one run and loaded by the
next (gem_parallel.AotBlocks), so a warm start skips dynamo's tracing.

Two fresh processes train the tiny preset compiled, with the same store and the same inductor
cache folder (a second run on one machine): the first compiles and saves every variant, the
second (`--compile-aot auto`, which must find the same folder through GEM_CACHE_DIR) loads them
all, compiles none, and trains to the same losses and evaluation bit for bit (CPU,
deterministic). With `--compile-background` the first steps run eager blocks while they
compile in a thread, the warm-up lasts until the compiled blocks have taken over, and no step
after it runs an eager block; under deterministic algorithms, or without a folder, it is off. "auto" resolves to the cache folder only where a run can use it, and an
unwritable cache turns it off with a notice instead of stopping the run. Bad settings are
refused before anything is built.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gem_trainer import _preflight, presets_h200, presets_tiny


def _gem(tmp: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), GEM_CACHE_DIR=str(tmp / "gem"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-m", "gem_trainer", "--no-progress", *args], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
    return out


def test_a_second_run_loads_every_block_and_trains_the_same(tmp_path: Path) -> None:
    store = tmp_path / "gem" / "aot"  # where "auto" looks with GEM_CACHE_DIR=tmp/gem
    args = ("--compile", "--steps", "8", "--eval-batches", "2")
    first = _gem(tmp_path, *args, "--compile-aot", str(store))
    aot = first["compile_aot"]
    assert aot["compiled"] >= 2 and aot["loaded"] == 0 and aot["save_errors"] == 0, aot
    assert Path(aot["dir"]).parent == store, aot
    files = sorted(p.name for p in store.rglob("*.bin"))
    assert len(files) == aot["compiled"], files

    second = _gem(tmp_path, *args, "--compile-aot", "auto")
    aot2 = second["compile_aot"]
    assert aot2["dir"] == aot["dir"], aot2
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


def test_auto_is_the_cache_folder_where_a_run_can_use_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GEM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    auto = presets_h200(compile_aot="auto")
    assert presets_h200().compile_aot == "auto"
    want = str(tmp_path / "xdg" / "gem" / "aot")
    assert _preflight.resolve_compile_aot(auto, 1) == want and os.path.isdir(want)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _preflight.resolve_compile_aot(auto, 1) == str(tmp_path / "home" / ".cache" / "gem" / "aot")
    monkeypatch.setenv("GEM_CACHE_DIR", str(tmp_path / "mine"))
    assert _preflight.resolve_compile_aot(auto, 1) == str(tmp_path / "mine" / "aot")
    # off where a run cannot use it: several processes (HSDP), torchrec tables, no compile
    assert _preflight.resolve_compile_aot(auto, 2) == ""
    assert _preflight.resolve_compile_aot(presets_h200(sparse_sharding="table_wise"), 1) == ""
    no_compile = presets_h200(compile=False)
    no_compile.validate()  # "auto" with compile off is not an error: it is off
    assert _preflight.resolve_compile_aot(no_compile, 1) == ""
    # an explicit folder is the user's, as given
    assert _preflight.resolve_compile_aot(presets_h200(compile_aot=str(tmp_path / "x")), 2) == str(tmp_path / "x")
    assert _preflight.resolve_compile_aot(presets_h200(compile_aot=""), 1) == ""
    # a cache that cannot be written: off, with a notice naming the folder, and the file kept
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me")
    monkeypatch.setenv("GEM_CACHE_DIR", str(blocker))
    capsys.readouterr()
    assert _preflight.resolve_compile_aot(auto, 1) == ""
    err = capsys.readouterr().err
    assert "auto" in err and "is off for this run" in err and str(blocker) in err, err
    assert blocker.read_text() == "keep me"


def test_background_compile_trains_eagerly_until_the_blocks_are_compiled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gem_parallel._aot as aot_mod
    from gem_trainer import train

    made: list[Any] = []
    real_init = aot_mod.AotBlocks.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    eager_at: dict[int, int] = {}

    def hook(n: int) -> None:
        # Each step waits for the compiles it queued, so the switch comes at a known step.
        for a in made:
            assert a.wait(timeout=600)
        eager_at[n] = made[0].stats.eager_calls

    monkeypatch.setattr(aot_mod.AotBlocks, "__init__", init)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    steps = 12
    cfg = presets_tiny(compile=True, compile_aot=str(tmp_path / "aot"), compile_background=True, steps=steps,
                       batch_size=16, eval_batches=0, progress=False)
    s = train(cfg, deterministic=False, step_hook=hook)
    assert len(made) == 1 and made[0].background
    aot = s["compile_aot"]
    assert aot["eager_calls"] > 0 and aot["compiled"] >= 1 and aot["fallbacks"] == 0, s
    assert aot["pending"] == [] and made[0].wait(timeout=0), s  # (the process's flags are restored)
    warm = s["warmup_steps"]
    assert 5 < warm < steps, s  # longer than the usual 5: the first steps ran eager blocks
    assert eager_at[1] > 0 and eager_at[steps] == eager_at[warm], eager_at  # none after the warm-up
    assert s["compiled_from_step"] == warm + 1, s
    assert s["steps"] == steps and math.isfinite(s["loss"]), s
    assert s["recompiles_per_100_steps"] == 0.0, s
    assert len(list((tmp_path / "aot").rglob("*.bin"))) >= aot["compiled"]

    # A second run over the filled folder compiles nothing: its first steps run eager blocks
    # while the thread loads the files, then the loaded blocks take over.
    made.clear()
    eager_at.clear()
    again = train(cfg, deterministic=False, step_hook=hook)
    aot2 = again["compile_aot"]
    assert aot2["compiled"] == 0 and aot2["loaded"] >= 1 and aot2["eager_calls"] > 0, again
    assert aot2["pending"] == [] and aot2["fallbacks"] == 0, again
    assert eager_at[again["warmup_steps"]] == eager_at[steps] and again["steps"] == steps, (eager_at, again)


def test_background_compile_is_off_under_deterministic_algorithms(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gem_parallel
    from gem_trainer import train

    got: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def parallelize(*args: Any, **kwargs: Any) -> Any:
        got.update(kwargs)
        raise Stop

    monkeypatch.setattr(gem_parallel, "parallelize", parallelize)
    cfg = presets_tiny(compile=True, compile_aot=str(tmp_path / "aot"), compile_background=True, steps=2,
                       progress=False)
    with pytest.raises(Stop):
        train(cfg, deterministic=True)
    assert got["compile_background"] is False and got["compile_aot"] == str(tmp_path / "aot")
    assert "compile_background is off under deterministic algorithms" in capsys.readouterr().err
    with pytest.raises(Stop):
        train(cfg, deterministic=False)
    assert got["compile_background"] is True
    # Without a folder (`--compile-aot ""`, or "auto" resolved off) it has nothing to compile
    # into: the h200 preset, whose default it is, still runs, compiling in the foreground.
    got.clear()
    with pytest.raises(Stop):
        train(dataclasses.replace(cfg, compile_aot=""), deterministic=False)
    assert got["compile_background"] is False and got["compile_aot"] is None


def test_a_run_shorter_than_its_background_compile_waits_for_it_and_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Two steps end long before the blocks' compile (~30 s on the CPU box): the summary names
    # the compile as pending, and train() then waits for it (with a note), so its variant is
    # kept for the next run and no thread is left compiling at the interpreter's exit.
    import gem_parallel._aot as aot_mod
    from gem_trainer import train

    made: list[Any] = []
    real_init = aot_mod.AotBlocks.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(aot_mod.AotBlocks, "__init__", init)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = presets_tiny(compile=True, compile_aot=str(tmp_path / "aot"), compile_background=True, steps=2,
                       batch_size=16, eval_batches=0, progress=False)
    s = train(cfg, deterministic=False)
    assert s["steps"] == 2 and s["compile_aot"]["pending"], s["compile_aot"]
    assert s["compile_aot"]["compiled"] == 0 and s["compile_aot"]["eager_calls"] > 0, s["compile_aot"]
    assert len(made) == 1 and made[0].pending_compiles() == [] and made[0].stats.compiled >= 1
    assert len(list((tmp_path / "aot").rglob("*.bin"))) == made[0].stats.compiled
    assert "waiting for the background load or compile of" in capsys.readouterr().err
