"""`--compile-cache FILE`: torch.compile's portable cache artifacts carried between machines.

The round trip runs in two fresh processes with separate inductor cache folders (as two
machines would be): the first compiles and writes the file, the second loads it and its
compile hits the cache instead of generating code. A small function stands in for the
model's blocks (inductor's C++ codegen for the GEM blocks takes minutes on the 2-core CI
box); the H200 run of the trainer itself is in trainer/BENCHMARKS.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gem_trainer import _compile_cache, _preflight
from gem_trainer.config import TrainConfig

_CHILD = r"""
import json, sys, torch
from torch._dynamo.utils import counters
from gem_trainer import _compile_cache
mode, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
got = _compile_cache.load(path) if mode == "load" else {}
f = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w + 1.0).sum(-1), dynamic=True)
g = torch.Generator().manual_seed(seed)
x, w = torch.randn(7, 16, generator=g), torch.randn(16, 5, generator=g)
y = f(x, w)
ref = torch.nn.functional.gelu(x @ w + 1.0).sum(-1)
if mode == "save":
    got = _compile_cache.save(path)
got["hits"] = counters["inductor"]["fxgraph_cache_hit"]
got["misses"] = counters["inductor"]["fxgraph_cache_miss"]
got["max_err"] = float((y - ref).abs().max())
print(json.dumps(got))
"""


def _child(mode: str, path: Path, cache_dir: Path, seed: int) -> dict[str, object]:
    # The child sees this process's import path (Bazel sets it up in sys.path, not the env).
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TRITON_CACHE_DIR=str(cache_dir / "triton"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path), str(seed)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def test_round_trip_between_fresh_processes(tmp_path: Path) -> None:
    path = tmp_path / "compile.cache"
    seed = int(torch.randint(0, 10_000, ()).item())
    first = _child("save", path, tmp_path / "machine_a", seed)
    assert first["misses"] == 1 and first["hits"] == 0
    assert isinstance(first["compile_cache_saved_bytes"], int) and first["compile_cache_saved_bytes"] > 0
    assert path.stat().st_size == first["compile_cache_saved_bytes"]
    assert first["max_err"] < 1e-4  # type: ignore[operator]
    second = _child("load", path, tmp_path / "machine_b", seed + 1)  # other values, same graph
    assert second["compile_cache"] == "loaded" and second["compile_cache_entries"] >= 1  # type: ignore[operator]
    assert second["hits"] == 1 and second["misses"] == 0, second
    assert second["max_err"] < 1e-4  # type: ignore[operator]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".compile_cache.")]  # no temp left


def test_corrupt_or_absent_file_is_reported_not_raised(tmp_path: Path) -> None:
    assert _compile_cache.load(str(tmp_path / "none")) == {"compile_cache": "absent"}
    bad = tmp_path / "bad.cache"
    junk = os.urandom(257)
    bad.write_bytes(junk)
    got = _compile_cache.load(str(bad))
    assert str(got["compile_cache"]).startswith("unreadable: ")
    assert bad.read_bytes() == junk  # reading it changed nothing


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.cache"
    path.write_bytes(b"old artifacts")
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"new" * 1000, None))

    def killed(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # a kill between the write and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _compile_cache.save(str(path))
    assert path.read_bytes() == b"old artifacts"
    assert [p.name for p in tmp_path.iterdir()] == ["c.cache"]


def test_nothing_compiled_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    assert _compile_cache.save(str(tmp_path / "c.cache")) == {"compile_cache_saved_bytes": 0}
    assert not (tmp_path / "c.cache").exists()


def test_bad_settings_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"compile_cache=.*needs compile=True"):
        dataclasses.replace(TrainConfig(), compile_cache=str(tmp_path / "c")).validate()
    cfg = dataclasses.replace(TrainConfig(), compile=True, compile_cache=str(tmp_path))
    cfg.validate()
    with pytest.raises(ValueError, match=r"compile_cache=.*is a directory"):
        _preflight.check_dirs(cfg)


def test_trainer_loads_before_the_first_step_and_saves_once_after_the_warm_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's wiring, with the blocks compiled by "aot_eager" (no inductor code on the CPU
    box, so the artifacts themselves are stand-ins): load before any step compiles, one save
    by rank 0 right after the warm-up steps, the summary keys, and a loaded file not rewritten."""
    import gem_parallel
    from gem_trainer import presets_tiny, train
    from gem_trainer._metrics import WARMUP_STEPS

    real = gem_parallel.parallelize
    monkeypatch.setattr(gem_parallel, "parallelize",
                        lambda model, meshes=None, **kw: real(model, meshes, **{**kw, "compile": "aot_eager"}))
    events: list[tuple[str, int]] = []
    steps_done = {"n": 0}
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts of this run", None))

    class Info:
        artifacts = {"inductor": ["a", "b"]}

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda blob: Info() if blob == b"artifacts of this run" else None)
    real_save, real_load = _compile_cache.save, _compile_cache.load
    monkeypatch.setattr(_compile_cache, "save", lambda p: (events.append(("save", steps_done["n"])), real_save(p))[1])
    monkeypatch.setattr(_compile_cache, "load", lambda p: (events.append(("load", steps_done["n"])), real_load(p))[1])
    path = tmp_path / "c.cache"
    cfg = presets_tiny(steps=WARMUP_STEPS + 2, batch_size=16, eval_batches=0, progress=False,
                       compile=True, compile_cache=str(path))

    def hook(n: int) -> None:
        steps_done["n"] = n

    first = train(cfg, step_hook=hook)
    assert events == [("load", 0), ("save", WARMUP_STEPS)]
    assert first["compile_cache"] == "absent" and first["compile_cache_saved_bytes"] == len(b"artifacts of this run")
    assert path.read_bytes() == b"artifacts of this run"
    events.clear()
    steps_done["n"] = 0
    second = train(cfg, step_hook=hook)
    assert events == [("load", 0)]  # loaded, so not rewritten
    assert second["compile_cache"] == "loaded" and second["compile_cache_entries"] == 2
    assert second["loss"] == first["loss"]  # the same run: the cache changes nothing computed
