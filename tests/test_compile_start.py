"""What a compiled start costs: each block kind traced once, and its graph in AOTAutograd's cache.

`gem_parallel.parallelize(compile=...)` compiles every block with `dynamic=True`. Two things
made every start (cold or warm) slower than it needs to be, both found on this CPU box with
`tools/ttfs.py --preset tiny --compile` and checked here on fresh random blocks:

1. every float attribute (a LayerNorm's `eps`) became a symbolic input, AOTAutograd
   specialized it and dynamo restarted its analysis: each block kind was traced twice;
2. the block holding the model's `_jagged.unique_rows` (a custom autograd.Function) bypassed
   AOTAutograd's cache, so even a warm start re-traced its joint forward+backward graph.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import gem_parallel
from gem_model import _jagged


class _Block(nn.Module):
    """A GEM-like block: norm -> linear -> the layout's unique-row gather, on jagged sizes."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        return _jagged.unique_rows(h, rows) * 2.0


def _inputs(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    rows = torch.randperm(n, generator=g)[: n // 2 + 1]
    return x, rows


def _run(model: nn.Module, x: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.detach().clone().requires_grad_(True)
    out = model(x, rows)
    (out.float() ** 2).sum().backward()
    assert x.grad is not None
    return out.detach(), x.grad


def test_each_block_kind_is_traced_once() -> None:
    """The backend sees each block kind's graph once: no restart of dynamo's analysis."""
    torch._dynamo.reset()
    calls: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        calls.append(len(gm.graph.nodes))
        from torch._dynamo.backends.debugging import aot_eager
        return aot_eager(gm, example_inputs)

    torch._dynamo.register_backend(counting, name="gem_test_counting")
    torch.manual_seed(0)
    model = nn.ModuleList([_Block(16), _Block(16)])
    eager = copy.deepcopy(model)
    gem_parallel.compile_blocks([(model, 0), (model, 1)], "gem_test_counting")
    for step, n in enumerate([37, 52, 45]):
        x, rows = _inputs(n, 16, seed=step)
        for i in range(2):
            got, got_dx = _run(model[i], x, rows)
            want, want_dx = _run(eager[i], x, rows)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got_dx, want_dx, rtol=1e-5, atol=1e-6)
    # Two blocks of one class share one dynamic graph: one backend call for all three sizes
    # (a restart would call it twice, a recompile per size once more each).
    assert len(calls) == 1, calls


def test_the_block_graph_reaches_the_autograd_cache(tmp_path: pytest.TempPathFactory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor on CPU: the first compile saves the block's AOTAutograd entry (no bypass), and
    after dynamo forgets everything (what a new process sees) the same block loads it from the
    cache instead of re-tracing, with the same numbers as eager."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(1)
    block = _Block(8)
    eager = copy.deepcopy(block)
    x, rows = _inputs(29, 8, seed=7)
    want, want_dx = _run(eager, x, rows)
    seen = []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        model = nn.ModuleList([copy.deepcopy(block)])
        gem_parallel.compile_blocks([(model, 0)], "inductor")
        got, got_dx = _run(model[0], x, rows)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_dx, want_dx, rtol=1e-5, atol=1e-5)
        seen.append(dict(counters["aot_autograd"]))
    assert seen[0].get("autograd_cache_bypass", 0) == 0, seen
    assert seen[0].get("autograd_cache_saved", 0) == 1, seen
    assert seen[1].get("autograd_cache_hit", 0) == 1 and seen[1].get("autograd_cache_bypass", 0) == 0, seen


@pytest.mark.parametrize("units, backend, err, words", [
    ("blocks", 3, TypeError, "backend=3 must be a torch.compile backend name"),
    ("blocks", "", TypeError, "backend='' must be"),
    ("index", "aot_eager", ValueError, "units[0]="),
    ("module", "aot_eager", ValueError, "must be a (nn.ModuleList, index) pair"),
])
def test_bad_arguments_name_the_argument_and_compile_nothing(units: str, backend: object,
                                                             err: type, words: str) -> None:
    blocks = nn.ModuleList([_Block(4)])
    given = {"blocks": [(blocks, 0)], "index": [(blocks, 1)], "module": [(_Block(4), 0)]}[units]
    with pytest.raises(err) as e:
        gem_parallel.compile_blocks(given, backend)  # type: ignore[arg-type]
    assert words in str(e.value)
    assert not hasattr(blocks[0], "_compiled_call_impl") or blocks[0]._compiled_call_impl is None


@pytest.mark.parametrize("precision, non_strict", [(None, True), ("bf16", True), ("fp8_block", False),
                                                   ("mxfp8_rceil", False)])
def test_blocks_trace_under_the_flags_of_their_precision(precision: str | None, non_strict: bool) -> None:
    """compile_blocks(precision=) traces the blocks with inductor's non-strict mix-order
    reduction for unconverted blocks and torch's strict default for low-precision ones, as
    parallelize does; the process's own setting is untouched outside the call."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode"):
        pytest.skip("this torch has no mix_order_reduction_non_strict_mode")
    torch._dynamo.reset()
    seen: list[bool] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        seen.append(inductor_config.triton.mix_order_reduction_non_strict_mode)
        return gm.forward

    name = f"gem_test_flags_{precision}"  # (a backend name is registered once per process)
    torch._dynamo.register_backend(recording, name=name)
    model = nn.ModuleList([_Block(16)])
    gem_parallel.compile_blocks([(model, 0)], name, precision=precision)
    x, rows = _inputs(21, 16, seed=3)
    _run(model[0], x, rows)
    assert seen and set(seen) == {non_strict}
    assert inductor_config.triton.mix_order_reduction_non_strict_mode is False


def test_the_flags_hold_only_inside_a_block_call() -> None:
    """The compile flags are the process's own again after a block call returns or raises: a
    user's other torch.compile calls keep torch's defaults."""
    from gem_parallel._parallelize import _compile_settings, _with_compile_settings

    flags = _compile_settings()
    before = [getattr(mod, name) for mod, name, _ in flags]
    seen: list[list[object]] = []

    def block_call(x: torch.Tensor) -> torch.Tensor:
        seen.append([getattr(mod, name) for mod, name, _ in flags])
        if x.shape[0] == 3:
            raise ValueError("x must not have 3 rows")
        return x * 2

    call = _with_compile_settings(block_call, flags)
    assert torch.equal(call(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="3 rows"):
        call(torch.ones(3))
    assert seen == [[value for _, _, value in flags]] * 2
    assert [getattr(mod, name) for mod, name, _ in flags] == before
    assert before != [value for _, _, value in flags]  # the test would see a leak


_SEEN: list[dict[str, bool]] = []  # the fp8_block flags at each graph the backend below compiled


def _inductor_flags() -> dict[str, bool]:
    import torch._inductor.config as inductor_config
    from gem_parallel._parallelize import FP8_BLOCK_INDUCTOR_OFF

    return {n: getattr(inductor_config.triton, n) for n in FP8_BLOCK_INDUCTOR_OFF if hasattr(inductor_config.triton, n)}


def _recording(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
    from torch._dynamo.backends.debugging import aot_eager

    _SEEN.append(_inductor_flags())
    return aot_eager(gm, example_inputs)


torch._dynamo.register_backend(_recording, name="gem_test_recording")


class _Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin(x)


@pytest.mark.parametrize("precision", ["fp8_block", "bf16"])
def test_blocks_compile_with_torchs_inductor_features(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """parallelize(compile=...) keeps inductor's coalescing tiling analysis and mix-order
    reductions at torch's settings for every precision, fp8_block included (gem-parallel
    0.3.3-0.3.4 turned them off for fp8_block: a 5 % slower h200 step); the converted
    blocks still match the unconverted ones, and the flags are the process's own afterwards."""
    monkeypatch.delenv("GEM_INDUCTOR_OFF", raising=False)
    default = _inductor_flags()
    if not default:
        pytest.skip("this torch has neither inductor feature")  # pragma: no cover
    torch._dynamo.reset()
    _SEEN.clear()
    torch.manual_seed(2)
    net = nn.Module()
    net.blocks = nn.ModuleList([_Wide(), _Wide()])
    ref = copy.deepcopy(net)
    done = gem_parallel.parallelize(net, None, precision=precision, compile="gem_test_recording",
                                    mxfp8_min_features=128)
    x = torch.randn(200, 128)
    got = net.blocks[1](net.blocks[0](x))
    assert _SEEN and all(seen == default for seen in _SEEN), _SEEN
    assert _inductor_flags() == default
    assert len(done.mxfp8_converted) == (2 if precision == "fp8_block" else 0)
    want = ref.blocks[1](ref.blocks[0](x))
    tol = 0.1 if precision == "fp8_block" else 1e-6  # E4M3 operands
    assert float((got - want).norm() / want.norm()) < tol



@pytest.mark.parametrize(("env", "precision", "off"), [
    ("", "fp8_block", ()),  # set but empty: torch's settings
    ("none", "fp8_block", ()),
    ("coalesce_tiling_analysis,mix_order_reduction", "fp8_block", ("coalesce_tiling_analysis", "mix_order_reduction")),
    ("mix_order_reduction", "bf16", ("mix_order_reduction",)),  # the A/B: bf16 with a feature off
    (" coalesce_tiling_analysis , mix_order_reduction", "fp8_block", ("coalesce_tiling_analysis", "mix_order_reduction")),
])
def test_inductor_off_follows_the_environment(env: str, precision: str, off: tuple[str, ...],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """GEM_INDUCTOR_OFF overrides which inductor features are off while the blocks compile,
    for any precision; the graphs compiled see exactly those off and the rest at torch's."""
    from gem_parallel._parallelize import inductor_off

    default = _inductor_flags()
    if not default:
        pytest.skip("this torch has neither inductor feature")  # pragma: no cover
    monkeypatch.setenv("GEM_INDUCTOR_OFF", env)
    assert inductor_off() == off
    torch._dynamo.reset()
    _SEEN.clear()
    net = nn.Module()
    net.blocks = nn.ModuleList([_Wide()])
    gem_parallel.parallelize(net, None, precision=precision, compile="gem_test_recording", mxfp8_min_features=128)
    net.blocks[0](torch.randn(130, 128))
    want = {n: (False if n in off else v) for n, v in default.items()}
    assert _SEEN and all(seen == want for seen in _SEEN), _SEEN
    assert _inductor_flags() == default


@pytest.mark.parametrize("bad", ["mix_order", "coalesce_tiling_analysis,max_autotune_gemm_search_space"])
def test_inductor_off_refuses_unknown_features(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_parallel._parallelize import inductor_off

    monkeypatch.setenv("GEM_INDUCTOR_OFF", bad)
    with pytest.raises(ValueError, match=r"GEM_INDUCTOR_OFF=.* must name a bool of torch._inductor.config.triton"):
        inductor_off()