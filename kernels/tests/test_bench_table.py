"""The issue-15 table bench's JFA backward comparison runs end to end on CPU (Triton's
interpreter, tiny lengths): every path and sweep row gives gradients that match (timings on
CPU mean nothing; the H200 figures are in BENCHMARKS.md). And its trainer case draws the
trainer's length law. The Nsight Compute bench (`bench.ncu_cases --small`) runs every case on a
toy batch."""

from __future__ import annotations

import os

import pytest

from gem_kernels.bench import table

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 on CPU")


def test_bwd_compare_runs_every_path_and_agrees() -> None:
    rows = table.bwd_compare(1, cases=[("tiny", [17, 3, 40], 2, False), ("tiny causal", [9, 33], 1, True)],
                             device="cpu")
    paths = {(r["case"], r["path"]) for r in rows}
    for case in ("tiny", "tiny causal"):
        assert {(case, "two-pass"), (case, "one-pass"), (case, "one-pass tma"), (case, "one-pass tma+loads")} <= paths
        assert sum(1 for r in rows if r["case"] == case and r["path"] == "one-pass sweep") >= len(table.BWD_SWEEP) - 1
        assert sum(1 for r in rows if r["case"] == case and r["path"] == "two-pass sweep") >= len(table.BWD2_SWEEP) - 1
    for r in rows:
        err = r["err"]
        assert isinstance(err, float) and err < 2e-2, r  # bf16 gradients vs fp32 / two-pass
    # the interpreter has no TMA reduce: `tma` runs the atomic path there, the loads run
    assert {r["tma"] for r in rows if r["path"] == "one-pass tma"} == {"-"}
    assert {r["tma"] for r in rows if r["path"] == "one-pass tma+loads"} == {"loads"}
    table.print_bwd_compare(rows)


def test_bwd_compare_case_filter_and_no_sweep() -> None:
    cases = [("tiny", [17, 3], 1, False), ("tiny causal", [9, 33], 1, True), ("other", [5], 1, False)]
    assert [c[0] for c in table.select_cases(cases, ["tiny c", "oth"])] == ["tiny causal", "other"]
    assert table.select_cases(cases, None) == cases
    with pytest.raises(ValueError, match="matches none of"):
        table.select_cases(cases, ["trainer"])
    assert [c[0] for c in table.select_cases(table.bwd_cases(), ["trainer", "long"])] == [
        "trainer H=8 full", "long H=8 full"]
    rows = table.bwd_compare(1, cases=cases, device="cpu", case_prefixes=["tiny c"], sweep=False)
    assert [(r["case"], r["path"]) for r in rows] == [
        ("tiny causal", p) for p in ("two-pass", "one-pass", "one-pass tma", "one-pass tma+loads")]


def test_trainer_lengths_follow_the_trainer_batches() -> None:
    t = table.trainer_lengths()
    assert 262144 <= sum(t) < 262144 + 16384 and all(16 <= n <= 16384 for n in t)
    assert 800 < sum(t) / len(t) < 1250  # the GEM data preset's mean 1,000
    assert table.trainer_lengths(seed=1) != t
    long = table.long_lengths()
    assert sum(long) / len(long) > 3 * sum(t) / len(t)


def test_ncu_cases_small_runs_every_case() -> None:
    # The Nsight Compute bench on a toy batch: every case runs (cuDNN's only on CUDA) and gives
    # finite values; the forward cases agree with the ops' plain-PyTorch references.
    import torch

    from gem_kernels import block_attention, generalized_dot_product_attention, jagged_flash_attention
    from gem_kernels.bench import ncu_cases

    names = ncu_cases.main(["--small", "--device", "cpu"])
    assert "dense_fwd_cudnn" not in names and len(names) == 10
    cases = ncu_cases._cases("cpu", small=True)
    outs = {n: cases[n]() for n in names}
    for n, o in outs.items():
        for t in (o if isinstance(o, tuple) else (o,)):
            assert isinstance(t, torch.Tensor) and torch.isfinite(t.float()).all(), n
    b = table.Batch(ncu_cases.SMALL_LENGTHS, "cpu", heads=2)  # the inputs _cases draws
    q, k, v, off, mx = b.q, b.k, b.v, b.off, b.max
    refs = {
        "jfa_fwd_full": jagged_flash_attention(q, k, v, off, off, mx, mx, backend="reference"),
        "jfa_fwd_causal": jagged_flash_attention(q, k, v, off, off, mx, mx, causal=True, backend="reference"),
        "gdpa_fwd": generalized_dot_product_attention(q, k, v, off, off, mx, mx, activation="silu", causal=True,
                                                      backend="reference"),
        "block_fwd": block_attention(q, k, v, off, mx, block_size=64, backend="reference"),
    }
    for n, want in refs.items():
        got = outs[n]
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2, msg=lambda m: f"{n}: {m}")


def test_jfa_path_names_the_kernels_the_switches_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    # The table's `path` column: on CPU (no FlashAttention-2 or -4) our forward always, and our
    # backward by the one-pass rule, or as `GEM_JFA_BWD` asks; the flash switches fall back.
    from gem_kernels import _triton_jfa
    from gem_kernels.bench.flash4 import switches

    b = table.Batch([17, 3, 40], "cpu", heads=1)
    short_max = _triton_jfa.ONE_PASS_MAX_Q_LEN  # (self-attention: the queries' longest is b.max)
    monkeypatch.delenv("GEM_JFA_FWD", raising=False)
    monkeypatch.delenv("GEM_JFA_BWD", raising=False)
    assert b.max > short_max and table.jfa_path(b.q, b.k, b.off, b.max) == "triton / triton two-pass"
    assert table.jfa_path(b.q, b.k, b.off, short_max) == "triton / triton one-pass"
    with switches("flash4", "flash4"):  # asked for, but flash-attn-4 cannot run on CPU
        assert table.jfa_path(b.q, b.k, b.off, short_max) == "triton / triton one-pass"
    with switches("pointer", "two_pass"):
        assert table.jfa_path(b.q, b.k, b.off, short_max) == "triton / triton two-pass"
    with switches("pointer", "bogus"), pytest.raises(ValueError, match="GEM_JFA_BWD"):
        table.jfa_path(b.q, b.k, b.off, b.max)
    assert "GEM_JFA_BWD" not in os.environ  # the switches are restored, also after an error


def test_flash4_bench_default_path_takes_the_rules_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench.flash4's "default" row times what runs without flash-attn-4: the backward the rule
    # picks for the case's longest query sequence, the same as `bwd_one_pass_from_env` says.
    import random

    from gem_kernels import _triton_jfa
    from gem_kernels.bench.flash4 import _backward_of

    edge = _triton_jfa.ONE_PASS_MAX_Q_LEN
    rng = random.Random()
    # The default's rule whatever switch the caller's environment holds, and restored after.
    for caller in (None, "two_pass", "one_pass"):
        if caller is None:
            monkeypatch.delenv("GEM_JFA_BWD", raising=False)
        else:
            monkeypatch.setenv("GEM_JFA_BWD", caller)
        for q_max in [1, edge, edge + 1, *(rng.randint(1, 4 * edge) for _ in range(20))]:
            want = "one_pass" if q_max <= edge else "two_pass"
            assert _backward_of("rule", q_max) == want, (caller, q_max)
        assert os.environ.get("GEM_JFA_BWD") == caller
    assert _backward_of("flash4", 1) == "flash4"  # the other paths name their backward


def test_eager_bench_times_every_row(tmp_path: object) -> None:
    # bench.eager (how much of an eager call is host time) on CPU: every row of issue 15's table
    # gets an eager time and a host time per call; the CUDA-graph figure exists only on a GPU.
    import json

    from gem_kernels.bench import eager

    eager.main(["--small", "--iters", "1", "--calls", "2", "--out", str(tmp_path)])
    with open(os.path.join(str(tmp_path), "eager.json")) as f:
        rows = json.load(f)["rows"]
    assert [r["case"] for r in rows] == ["JFA fwd full", "JFA fwd+bwd full", "JFA fwd causal", "JFA fwd+bwd causal",
                                         "GDPA SiLU causal fwd", "GDPA SiLU causal fwd+bwd", "BlockAttention(64) fwd"]
    for r in rows:
        assert r["eager_ms"] > 0 and r["host_us"] > 0, r
        assert r["graph_ms"] is None and r["eager_minus_graph_us"] is None, r
