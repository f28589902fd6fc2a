"""Config validation and the CLI's argument handling (no training)."""
from __future__ import annotations

import dataclasses

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
