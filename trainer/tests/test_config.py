"""Config validation and the CLI's argument handling (no training)."""
from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from gem_trainer.__main__ import main, parse_args
from gem_trainer.config import PRESETS, TrainConfig, h200, multi, tiny


def test_presets_are_frozen_and_valid() -> None:
    for make in PRESETS.values():
        cfg = make()
        cfg.validate()
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.steps = 3  # type: ignore[misc]
    assert tiny().preset == "tiny" and h200().preset == "h200" and multi().preset == "multi"
    assert h200().precision == "bf16" and tiny().precision == "fp32"


@pytest.mark.parametrize("field,value,rule", [
    ("steps", 0, "steps=0 must be an int >= 1"),
    ("batch_size", -1, "batch_size=-1 must be an int >= 1"),
    ("batch_tokens", -5, "batch_tokens=-5 must be >= 0"),
    ("lr", 0.0, "lr=0.0 must be > 0"),
    ("data", "csv:x", "must be 'synthetic' or 'parquet:DIR'"),
    ("data", "parquet:", "'parquet:' needs a directory"),
    ("precision", "fp4", "precision='fp4' must be one of"),
    ("preset", "huge", "preset='huge' must be one of"),
    ("sparse_mp", -1, "sparse_mp=-1 must be an int >= 0 (0 = every rank)"),
    ("sparse_mp", 2, "sparse_mp=2 needs sparse_sharding other than 'none'"),
    ("ckpt_writer", "fork", "ckpt_writer='fork' must be one of"),
    ("triton_precompile", "/no/such/manifest.json", "triton_precompile='/no/such/manifest.json' must be '', "
                                                    "'auto' or a manifest file"),
    ("jfa_gluon", "dkdv,bwd", "jfa_gluon='dkdv,bwd' must be 'all', 'off' or a comma-separated list"),
])
def test_bad_fields_name_the_field_and_rule(field: str, value: object, rule: str) -> None:
    cfg = dataclasses.replace(TrainConfig(), **{field: value})
    with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        cfg.validate()


def test_resume_needs_a_checkpoint_dir() -> None:
    with pytest.raises(ValueError, match="resume=True needs ckpt_dir"):
        tiny(resume=True).validate()


def test_cli_overrides_map_onto_the_preset() -> None:
    cfg = parse_args(["--preset", "h200", "--steps", "7", "--data", "parquet:/x", "--precision",
                      "mxfp8_rceil", "--no-progress", "--resume", "--ckpt-dir", "/c"])
    assert (cfg.preset, cfg.steps, cfg.data, cfg.precision, cfg.progress, cfg.resume, cfg.ckpt_dir) == (
        "h200", 7, "parquet:/x", "mxfp8_rceil", False, True, "/c")
    assert cfg.batch_tokens == h200().batch_tokens  # untouched fields keep the preset's value


def test_cli_bad_value_exits_2_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", "0"]) == 2
    assert "steps=0 must be an int >= 1" in capsys.readouterr().err


def test_cli_sparse_mp_selects_2d() -> None:
    cfg = parse_args(["--sparse-sharding", "row_wise", "--sparse-mp", "2"])
    assert (cfg.sparse_sharding, cfg.sparse_mp) == ("row_wise", 2)
    cfg.validate()
    assert parse_args([]).sparse_mp == 0  # default: 1-D over every rank


@pytest.mark.parametrize("writer,world,device,expect", [
    ("auto", 1, "cuda", "process"),   # one process on a GPU: its own GIL (kept --ckpt-every 50 on the H200)
    ("auto", 2, "cuda", "thread"),    # several ranks: the process writer is single-process only
    ("auto", 1, "cpu", "thread"),     # CPU runs: small states, torch ops drop the GIL
    ("thread", 1, "cuda", "thread"),  # an explicit choice is kept
    ("process", 1, "cpu", "process"),
])
def test_auto_ckpt_writer_resolves_by_world_and_device(writer: str, world: int, device: str, expect: str) -> None:
    import torch

    from gem_trainer.config import resolve_ckpt_writer
    assert resolve_ckpt_writer(writer, world, torch.device(device)) == expect
    assert TrainConfig().ckpt_writer == "auto"
    assert parse_args(["--ckpt-writer", writer]).ckpt_writer == writer


def test_triton_precompile_starts_nothing_on_cpu_and_refuses_a_bad_manifest(tmp_path: Path) -> None:
    import torch

    from gem_trainer import _preflight

    cpu = torch.device("cpu")
    for value in ("", "auto"):
        assert _preflight.start_precompile(tiny(triton_precompile=value), cpu) is None
    assert parse_args(["--triton-precompile", ""]).triton_precompile == ""
    bad = tmp_path / "m.json"
    bad.write_text('{"format": 1, "kernels": "x"}')
    cfg = tiny(triton_precompile=str(bad))
    cfg.validate()  # a file: read when the run starts, where it is refused with the field's name
    with pytest.raises(ValueError, match=r"triton_precompile='.*m.json': precompile manifest .*'kernels' must be"):
        _preflight.start_precompile(cfg, torch.device("cuda"))
    assert bad.read_text() == '{"format": 1, "kernels": "x"}'


def test_shipped_triton_manifests_are_manifests() -> None:
    import gem_kernels.precompile
    from gem_trainer import _preflight

    shipped = sorted(Path(_preflight.MANIFESTS).glob("*.json"))
    assert shipped, "no manifest shipped for triton_precompile='auto'"
    for path in shipped:
        doc = gem_kernels.precompile.load_manifest(path)
        target, version = doc["target"], doc["triton"]
        assert path.name == f"{target['backend']}{target['arch']}-triton{version}.json"
        assert doc["kernels"] and all(k["module"].startswith("gem_") for k in doc["kernels"])
        # Each entry still fits its kernel: the same arguments in the same order. A kernel whose
        # arguments changed since the recording makes its entries fail in the workers (the run
        # then compiles them itself): record the manifest again (tools/triton_compiles.py).
        for entry in doc["kernels"]:
            kernel = getattr(importlib.import_module(entry["module"]), entry["name"])
            assert list(json.loads(entry["spec"])["signature"]) == list(kernel.arg_names), (path.name, entry["name"])


def test_jfa_gluon_is_set_for_the_process_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_kernels import _gluon_jfa

    from gem_trainer import train

    monkeypatch.setattr(_gluon_jfa, "_default", ())  # restored after the test
    monkeypatch.delenv(_gluon_jfa.ENV, raising=False)
    assert TrainConfig().jfa_gluon == h200().jfa_gluon == "dkdv,dq"
    assert parse_args(["--jfa-gluon", "off"]).jfa_gluon == "off"
    s = train(tiny(steps=1, batch_size=8, eval_batches=0, progress=False, jfa_gluon="dq"))
    assert s["steps"] == 1
    # On CPU the Triton kernels run (no Gluon twin serves there), but the switch is the run's.
    assert [k for k in _gluon_jfa.KERNELS if _gluon_jfa.requested(k)] == ["dq"]
