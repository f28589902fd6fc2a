"""The packed-kv and rotary-qkv bench (`bench.kv --small`) runs end to end under Triton's interpreter, and its
two paths agree (timings on CPU mean nothing; the GPU figures are in BENCHMARKS.md)."""

from __future__ import annotations

import os

import pytest

from gem_kernels.bench import kv

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 on CPU")


def test_kv_bench_runs_and_the_paths_agree() -> None:
    rows = kv.main(["--small", "--iters", "1", "--rounds", "2"])
    assert {r["case"] for r in rows} == {"self causal", "pooling", "rope qkv"} and len(rows) == 6
    for r in rows:
        assert isinstance(r["err"], float) and r["err"] < 1e-5, r  # fp32: the same kernels
        assert isinstance(r["packed ms"], float) and isinstance(r["unpacked ms"], float), r
