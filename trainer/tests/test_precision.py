"""Every --precision value reaches the model: the mxfp8_* values are gem_precision recipes."""
from __future__ import annotations

import sys

import pytest
import torch

import gem_model
import gem_parallel
from gem_precision import MXFP8Linear
from gem_trainer._loop import make_loader, data_config, model_config
from gem_trainer.config import PRECISIONS, tiny


@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p.startswith("mxfp8")])
def test_mxfp8_precisions_convert_and_train(precision: str) -> None:
    cfg = tiny(precision=precision, batch_size=16)
    dcfg = data_config(cfg)
    mcfg = model_config(cfg, dcfg)
    torch.manual_seed(0)
    model = gem_model.GEMModel(mcfg)
    torch.manual_seed(0)
    ref = gem_model.GEMModel(mcfg)
    # The tiny model's linears sit below the default 1024-feature threshold: lower it so the
    # conversion really happens, then run forward + backward on CPU (emulated MXFP8).
    done = gem_parallel.parallelize(model, precision=precision, mxfp8_min_features=32)
    mx = [m for m in model.modules() if isinstance(m, MXFP8Linear)]
    assert done.model is model and done.mxfp8_converted and len(mx) == len(done.mxfp8_converted)
    assert not any(n.startswith("heads") for n in done.mxfp8_converted)
    batch = next(iter(make_loader(cfg, dcfg, 0, 1, torch.device("cpu"))))
    out, out_ref = model(batch), ref(batch)
    assert torch.isfinite(out).all()
    # Same initial weights: the MXFP8 forward is the fp32 one up to E4M3 rounding.
    rel = ((out.float() - out_ref.float()).norm() / out_ref.float().norm()).item()
    # E4M3 rounding through the 2 layers of a random tiny model: 0.03-0.22 over seeds 0-7 for
    # every recipe (gem-model 0.4 and 0.5 alike; the bound was once 0.1, tuned to one
    # initialisation); a broken conversion is off by ~1.
    assert 0 < rel < 0.3, rel
    out.float().mean().backward()
    assert all(m.weight.grad is not None and torch.isfinite(m.weight.grad).all() for m in mx)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_trainer_passes_every_recipe_to_parallelize(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer hands each low-precision value to gem_parallel (fp8_block was dropped once:
    the run said fp8_block and trained in bf16); fp32 / bf16 are autocast, not a recipe."""
    from gem_trainer import _loop

    seen: dict[str, object] = {}
    real = gem_parallel.parallelize

    def spy(model: torch.nn.Module, meshes: object = None, **kw: object) -> object:
        seen.update(kw)
        kw["precision"] = None  # the tiny model's linears are below every recipe's threshold
        return real(model, meshes, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gem_parallel, "parallelize", spy)
    cfg = tiny(precision=precision, batch_size=16)
    model = gem_model.GEMModel(model_config(cfg, data_config(cfg)))
    _loop._parallelize(model, cfg, 1, torch.device("cpu"))
    assert seen["precision"] == (None if precision in ("fp32", "bf16") else precision)
    # the task heads and the per-sample linears stay bf16 by default
    assert seen["keep_bf16"] == ("heads*", "*interaction.*", "*summary.glu")
    # fp8_block converts by the cost model with a 5 % margin; other recipes by size alone
    assert seen["fp8_min_speedup"] == (1.05 if precision.startswith("fp8_block") else 0.0)


def test_keep_bf16_patterns_reach_the_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """--keep-bf16 names what a recipe leaves in bf16: here the interaction and summary
    linears too, which the conversion then skips (tiny model, threshold lowered)."""
    from gem_trainer import _loop
    from gem_trainer.__main__ import parse_args

    cfg = parse_args(["--precision", "mxfp8_rceil", "--keep-bf16", "heads*, *interaction*,*summary*",
                      "--batch-size", "16"])
    real = gem_parallel.parallelize
    done: list[object] = []

    def spy(model: torch.nn.Module, meshes: object = None, **kw: object) -> object:
        out = real(model, meshes, mxfp8_min_features=32, **kw)  # type: ignore[arg-type]
        done.append(out)
        return out

    monkeypatch.setattr(gem_parallel, "parallelize", spy)
    model = gem_model.GEMModel(model_config(cfg, data_config(cfg)))
    _loop._parallelize(model, cfg, 1, torch.device("cpu"))
    converted = done[0].mxfp8_converted  # type: ignore[attr-defined]
    assert converted and not any(k in n for n in converted for k in ("heads", "interaction", "summary"))
    mx = {n for n, m in model.named_modules() if isinstance(m, MXFP8Linear)}
    assert mx == set(converted)
    # the same model keeping only the heads: more linears convert
    model2 = gem_model.GEMModel(model_config(cfg, data_config(cfg)))
    _loop._parallelize(model2, tiny(precision="mxfp8_rceil", keep_bf16="heads*", batch_size=16), 1,
                       torch.device("cpu"))
    assert any("interaction" in n for n in done[1].mxfp8_converted)  # type: ignore[attr-defined]


def test_the_default_keeps_every_per_sample_linear_of_the_model() -> None:
    """The default keep_bf16 patterns name every linear of the interaction and summary
    modules that reads per-sample rows, and none of the stream's."""
    import fnmatch

    from gem_trainer.config import keep_bf16_patterns

    cfg = tiny()
    model = gem_model.GEMModel(model_config(cfg, data_config(cfg)))
    pats = keep_bf16_patterns(cfg)
    kept = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and any(fnmatch.fnmatchcase(n, p) for p in pats)}
    # (nonseq_summary.mix runs over the F feature tokens, F -> n_cls: below every recipe's size)
    per_sample = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                  and any(k in n for k in ("interaction", "summary", "heads")) and not n.endswith(".mix")}
    assert kept == per_sample and any("interaction" in n for n in kept) and any("summary" in n for n in kept)
    assert all(not any(k in n for k in ("seq_attention", "seq_ffn", "pooling")) for n in kept)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_fp8_min_speedup_refuses_bad_values(bad: float) -> None:
    with pytest.raises(ValueError, match=r"fp8_min_speedup=.* must be a finite number >= 0"):
        tiny(fp8_min_speedup=bad).validate()


@pytest.mark.parametrize("bad", ["", "heads*,", " ,x"])
def test_keep_bf16_refuses_empty_patterns(bad: str) -> None:
    with pytest.raises(ValueError, match=r"keep_bf16=.* must be comma-separated non-empty fnmatch patterns"):
        tiny(keep_bf16=bad).validate()


def test_run_info_says_how_the_jfa_backward_is_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the summary records the JFA backward rule (one-pass adds dQ with atomics); the
    rule follows GEM_JFA_BWD and torch's deterministic algorithms. No GPU needed: run_info
    only looks at the device type."""
    from gem_trainer import _preflight

    cfg = tiny()
    monkeypatch.delenv("GEM_JFA_BWD", raising=False)
    # an earlier deterministic run in this process may have left torch's switch on
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    assert "jfa_backward" not in _preflight.run_info(cfg, torch.device("cpu"), True, None)
    info = _preflight.run_info(cfg, torch.device("cuda"), False, None)
    from gem_kernels._triton_jfa import ONE_PASS_MAX_Q_LEN

    # FlashAttention-4 first (where flash-attn-4 imports), then ours (torch's FlashAttention-2
    # backward only when GEM_JFA_BWD=flash asks for it)
    assert info["jfa_backward"].startswith("flash4 (FlashAttention-4's backward)")
    assert "FlashAttention-2" not in info["jfa_backward"]
    assert info["jfa_backward"].endswith(
        f"else one_pass up to {ONE_PASS_MAX_Q_LEN} queries per sequence, two_pass above")
    monkeypatch.setenv("GEM_JFA_BWD", "two_pass")
    info = _preflight.run_info(cfg, torch.device("cuda"), False, None)
    assert info["jfa_backward"] == "two_pass (GEM_JFA_BWD, two_pass)"


def test_compile_notice_on_gpu_only() -> None:
    """A compiled GPU run says why its first step takes a minute; CPU and eager runs say nothing;
    the CLI rewrites the field names into its flags."""
    from gem_trainer import _preflight
    from gem_trainer.__main__ import cli_message
    from gem_trainer.config import h200

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert _preflight.compile_notice(h200(), cpu, False) is None
    assert _preflight.compile_notice(h200(compile=False), cuda, False) is None
    msg = _preflight.compile_notice(h200(compile_aot=""), cuda, False)
    assert msg is not None and "warm-up" in msg
    cli = cli_message(msg)
    assert cli.startswith("--compile:") and "--compile-cache" in cli and "--no-compile" in cli
    aot = _preflight.compile_notice(h200(compile_aot="/x/aot", compile_background=False), cuda, False)
    assert aot is not None and "warm-up" in aot and "'/x/aot'" in aot
    assert cli_message(aot).startswith("--compile, --compile-aot=") and "--no-compile" in cli_message(aot)
    bg = _preflight.compile_notice(h200(compile_aot="/x/aot"), cuda, False)  # the preset's default
    assert bg is not None and "eager blocks while a background thread loads" in bg and "'/x/aot'" in bg
    assert cli_message(bg).startswith("--compile, --compile-aot=/x/aot, --compile-background:")
    loaded = _preflight.compile_notice(h200(), cuda, True)
    assert loaded is not None and "loaded" in loaded


def test_compile_notice_names_a_python_that_keeps_no_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Python writes no bytecode caches (PYTHONDONTWRITEBYTECODE, as on the lent H200
    box) every start compiles torch's Python again: the compile notice says so and how to keep
    them; with bytecode caches it does not."""
    from gem_trainer import _preflight
    from gem_trainer.config import h200

    cuda = torch.device("cuda")
    for cfg, cached in ((h200(), False), (h200(compile_aot=""), False), (h200(), True)):
        monkeypatch.setattr(sys, "dont_write_bytecode", True)
        msg = _preflight.compile_notice(cfg, cuda, cached)
        assert msg is not None and "PYTHONDONTWRITEBYTECODE" in msg and "PYTHONPYCACHEPREFIX" in msg
        monkeypatch.setattr(sys, "dont_write_bytecode", False)
        msg = _preflight.compile_notice(cfg, cuda, cached)
        assert msg is not None and "PYTHONDONTWRITEBYTECODE" not in msg
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert _preflight.compile_notice(h200(), torch.device("cpu"), False) is None


def test_h200_fp8_defaults_convert_the_wide_stream_linears() -> None:
    """The h200 preset's model (built on the meta device: no memory, no data) under the
    trainer's fp8 defaults: the cost filter (--fp8-min-speedup 1.05) converts exactly the
    stream linears wider than 1024 -> 1024, the ones the H200 measured at 1.08-1.09x alone
    (trainer/BENCHMARKS.md); with the filter off every eligible stream linear converts."""
    import dataclasses

    pytest.importorskip("torchrec")  # the h200 model's tables, as the trainer imports them (no torchrec on the GPU box)

    import gem_precision
    from gem_trainer.config import h200, keep_bf16_patterns

    cfg = dataclasses.replace(h200(), precision="fp8_block_wgrad_bf16")
    cfg.validate()

    def converted(min_speedup: float) -> dict[str, tuple[int, int]]:
        with torch.device("meta"):
            model = gem_model.GEMModel(model_config(cfg, data_config(cfg)))
        names = gem_precision.convert(model, cfg.precision, keep_bf16=keep_bf16_patterns(cfg), min_speedup=min_speedup)
        shapes = {}
        for n in names:
            lin = model.get_submodule(n)
            assert isinstance(lin, gem_precision.FP8BlockLinear)
            shapes[n] = (lin.in_features, lin.out_features)
        return shapes

    wide = converted(cfg.fp8_min_speedup)
    kinds = sorted({".".join(p for p in n.split(".") if not p.isdigit()) for n in wide})
    assert kinds == ["layers.pooling.wkv", "layers.seq_attention.wqkv", "layers.seq_ffn.wkv"], kinds
    assert all(k == 1024 and n in (2048, 3072) for k, n in wide.values()), wide
    every = converted(0.0)
    assert set(wide) < set(every) and all(k == n == 1024 for name, (k, n) in every.items() if name not in wide)
    assert not any(p in n for n in every for p in ("heads", "interaction", "summary"))


@pytest.mark.parametrize("precision", ["fp8_block", "mxfp8_rceil"])
def test_a_recipe_on_cpu_runs_the_kunlun_blocks_under_bf16_autocast(precision: str) -> None:
    """Until gem-precision 0.3.7 a converted linear returned bf16 whatever its input. In the
    h200 structure (hierarchical pooling) a converted pooling `wo` feeds the plain token mix
    `down`, which then failed on fp32 weights without autocast: the trainer's step on a CPU
    raised a dtype error for every recipe that converted `wo` (seen at d_model 1024). Since
    0.3.7 a converted linear returns nn.Linear's dtype, so the fp32 step runs too; the trainer
    still puts the recipes' CPU step under bf16 autocast (`autocast_device`), as on the GPU;
    fp32 and plain bf16 stay fp32 on a CPU."""
    import dataclasses

    from gem_trainer._loop import autocast, autocast_device

    cpu = torch.device("cpu")
    assert autocast_device(tiny(precision=precision), cpu) == "cpu"
    assert autocast_device(tiny(precision="fp32"), cpu) is None
    assert autocast_device(tiny(precision="bf16"), cpu) is None
    cfg = tiny(precision=precision, batch_size=8)
    dcfg = data_config(cfg)
    mcfg = dataclasses.replace(model_config(cfg, dcfg), d_model=128, computation_skip=True, gdpa_ffn=True,
                               hierarchical_pooling=True, num_layers=4)
    model = gem_model.GEMModel(mcfg)
    done = gem_parallel.parallelize(model, precision=precision, mxfp8_min_features=128, fp8_min_speedup=0.0)
    assert "layers.0.pooling.wo" in done.mxfp8_converted and "layers.0.pooling.down" not in done.mxfp8_converted
    batch = next(iter(make_loader(cfg, dcfg, 0, 1, cpu)))
    out = model(batch)  # fp32, no autocast: converted outputs are fp32 (a dtype error before 0.3.7)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    with autocast(autocast_device(cfg, cpu)):
        out = model(batch)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.float(), batch.labels.float())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
