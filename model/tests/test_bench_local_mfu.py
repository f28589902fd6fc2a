"""The model's benches run end to end (CPU toy size here; the real size on the GPU): local MFU
and the residual GEMM.

The local-MFU bench captures each module's real inputs from a full forward and re-runs the
module alone, so a change to what a layer passes between modules (e.g. the CLS-prefixed
layout, a NamedTuple) must not break it: the H200 run of 2026-11-30 crashed there (the layout
came back as a plain tuple).
"""
import json

import pytest
import torch

from gem_model.bench import local_mfu


@pytest.fixture(autouse=True)
def _restore_gluon_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() sets the process's Gluon switch (--jfa-gluon): put it back after each test."""
    from gem_kernels import _gluon_jfa

    monkeypatch.setattr(_gluon_jfa, "_default", _gluon_jfa._default)


def test_jfa_gluon_is_set_and_recorded(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_kernels import _gluon_jfa

    monkeypatch.delenv(_gluon_jfa.ENV, raising=False)
    local_mfu.main(["--batch", "2", "--no-reference", "--jfa-gluon", "dq"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["jfa_gluon"] == "dq" and _gluon_jfa.requested_kernels() == ("dq",)
    monkeypatch.setenv(_gluon_jfa.ENV, "off")  # the variable wins: the record says what ran
    local_mfu.main(["--batch", "2", "--no-reference", "--jfa-gluon", "dq"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["jfa_gluon"] == "off"
    with pytest.raises(SystemExit, match=r"--jfa-gluon: use_gluon_jfa\(value\)='bwd' must be 'all', 'off'"):
        local_mfu.main(["--batch", "2", "--no-reference", "--jfa-gluon", "bwd"])


def test_local_mfu_bench_runs_and_matches_reference(capsys: pytest.CaptureFixture[str]) -> None:
    local_mfu.main(["--batch", "3"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["correct"] is True
    mods = out["kernels"]["modules"]
    # every layer module of the tiny switches was timed (seq_attention reads the layout)
    for name in local_mfu.LAYER_MODULES:
        assert mods[name]["ms"] > 0, name
    assert out["kernels"]["e2e_ms"] > 0 and out["reference"]["e2e_ms"] > 0


def test_fresh_keeps_namedtuple_types() -> None:
    from gem_model import _jagged

    fields = {f: torch.zeros(2) for f in _jagged.PrefixLayout._fields}
    lay = _jagged.PrefixLayout(**fields)  # type: ignore[arg-type]
    got = local_mfu._fresh((lay, torch.ones(3)))
    assert isinstance(got[0], _jagged.PrefixLayout)
    assert got[1].requires_grad and torch.equal(got[1], torch.ones(3))


def test_token_budget_batch_like_the_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    local_mfu.main(["--tokens", "150", "--no-reference"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    # without a reference model nothing is compared, and neither the table nor the JSON says "ok"
    assert "not compared with the reference model" in printed and "(ok)" not in printed
    assert out["correct"] is None and out["logits_max_abs_diff"] is None
    # sequences are drawn until the budget is met: at least 150 tokens, each under the CPU cap
    assert 150 <= out["tokens"] < 150 + 64 and out["batch"] > 3
    assert out["kernels"]["e2e_ms"] > 0 and not out.get("reference")


def test_compiled_modules(capsys: pytest.CaptureFixture[str]) -> None:
    """--compile: the same rows through torch.compile'd modules (aot_eager here: the graphs
    without inductor's codegen, so the CPU test stays quick), logits still match."""
    local_mfu.main(["--batch", "3", "--compile", "aot_eager"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["compile"] == "aot_eager" and out["correct"] is True
    for name in local_mfu.LAYER_MODULES:
        assert out["kernels"]["modules"][name]["ms"] > 0, name
    assert out["kernels"]["e2e_ms"] > 0
    # the copy with each layer compiled whole (as the trainer) is timed and computes the
    # same logits
    assert out["kernels"]["e2e_layers_ms"] > 0 and 0 < out["kernels"]["e2e_layers_mfu"]
    assert out["layers_logits_max_abs_diff"] is not None and out["layers_logits_max_abs_diff"] < 1e-3


def test_cuda_graph_flag_without_cuda_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """--cuda-graph on a machine without CUDA: every step says why it has no graph figure and
    no graph column is filled in (nothing is made up); on a GPU every step is captured."""
    local_mfu.main(["--batch", "3", "--no-reference", "--cuda-graph"])
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert out["cuda_graph"] is True
    mods = out["kernels"]["modules"]
    if torch.cuda.is_available():
        for name, row in mods.items():
            assert row["graph_ms"] > 0 and row["graph_mfu"] > 0, name
        assert out["kernels"]["e2e_graph_ms"] > 0
    else:
        assert "model e2e: not captured in a CUDA graph (no CUDA)" in printed
        assert not any("graph_ms" in row for row in mods.values())
        assert "e2e_graph_ms" not in out["kernels"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_computes_the_eager_step() -> None:
    """A captured fwd+bwd replayed on new input data gives the gradients an eager step
    computes on that data (the replay is the same work, not a cached result)."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 1)).cuda()
    ref = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 1)).cuda()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(512, 64, device="cuda")

    def step() -> None:
        net.zero_grad(set_to_none=True)
        net(x).square().mean().backward()  # type: ignore[no-untyped-call]

    replay, why = local_mfu.capture_graph(step)
    assert replay is not None and why is None
    x.copy_(torch.randn_like(x))
    replay()
    torch.cuda.synchronize()
    ref(x.clone()).square().mean().backward()  # type: ignore[no-untyped-call]
    for p, q in zip(net.parameters(), ref.parameters()):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_residual_gemm_bench_runs_and_both_arms_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """`gem_model.bench.residual_gemm` (the GDPA FFN compiled with addmm and with
    GEMConfig.inplace_residual_gemm) runs end to end at its CPU toy size, and its two arms'
    outputs are equal bit for bit."""
    from gem_model.bench import residual_gemm

    residual_gemm.main(["--iters", "1", "--rounds", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["equal"] is True
    assert set(out["ms"]) == {"addmm", "in place"} and all(v > 0 for v in out["ms"].values())
