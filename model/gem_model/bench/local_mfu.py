"""Local MFU of the GEM-like model: each module alone, fwd+bwd, on a GEM-like jagged batch.

    python3 -m gem_model.bench.local_mfu [--quick]       (repo root, module dirs on PYTHONPATH)
    bazel run //model:bench_local_mfu -- --quick

For the `h200` preset (all Kunlun switches on, event-level personalization), one layer's
instance of every module is run alone with its real inputs (captured from a full forward),
forward + backward under bf16 autocast; model FLOPs = 3 x the analytic forward count
(`module.flops`), local MFU = model FLOPs / time / 989 TFLOP/s (H200 dense bf16 datasheet).
The weighted total is sum(FLOPs) / sum(time) over all module instances of the model. The same
model with the kernels' reference attention (plain PyTorch) runs side by side, and the full
model fwd+bwd is timed too. Without CUDA it runs a toy size on CPU (not a speed claim).

`--compile` runs the modules through `torch.compile` (each front-end module, each layer
module and the heads, compiled once per module for this fixed batch); the warm-up
iterations absorb the compiling. The default is eager. With it the whole model is also timed
a second time ("model e2e, layers"), on a copy whose layers are compiled whole (dynamic
sizes, one graph per layer, as the trainer compiles its blocks through gem_parallel): the
code between a layer's modules (residuals, casts, the CLS rows) is then fused with them,
where the per-module compile leaves it eager.

`--cuda-graph` also captures each timed fwd+bwd (every module alone and the whole model) in
a CUDA graph and times its replay beside the plain call: the same kernels with no Python or
launch overhead, i.e. what the GPU itself needs for the batch. The "graph" columns are that
figure; a step that cannot be captured prints why and leaves its graph column empty.

`--table-grads sparse`: the embedding tables' gradients hold one row per looked-up id
(`gem_model.sparse_table_grads`) instead of the full `[rows, dim]` ones (the default, as the
trainer's: ~1.8 GB zeroed and written per fwd+bwd at this preset). Sparse makes the fwd+bwd
faster, but the optimizer then sorts and sums the ids, outside this bench: in the trainer's
step the two cost the same, so a figure with it is not the step's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gem_model import GEMConfig, GEMModel, presets, sparse_table_grads
from gem_model._flops import Shapes
from gem_model.bench._batch import FEATURES, lognormal_lengths, make_batch, median_timer

PEAK = 989e12  # H200 dense bf16 datasheet
LAYER_MODULES = ("nonseq_summary", "seq_ffn", "seq_attention", "pooling", "seq_summary", "interaction")


def capture_graph(fn: Callable[[], None]) -> tuple[Callable[[], None] | None, str | None]:
    """(`fn` captured in a CUDA graph -> its replay, None) or (None, why it was not captured).

    `fn` runs twice on a side stream first (warm-up, as torch's capture rules ask), then once
    under capture; each replay re-runs the captured kernels on the same memory. (The kernels'
    benches have the same helper in `gem_kernels.bench._common`; that folder is not part of
    the gem_kernels library this package depends on, so it cannot be imported from here.)
    """
    if not torch.cuda.is_available():
        return None, "no CUDA"
    try:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported: the figure is left out, not faked
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return graph.replay, None


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    return []


def _fresh(x: Any) -> Any:
    """Detached copy of captured inputs; float tensors require grad (as inside the model)."""
    if isinstance(x, torch.Tensor):
        y = x.detach().clone()
        return y.requires_grad_(True) if y.is_floating_point() else y
    if isinstance(x, tuple):  # a NamedTuple (the layers' PrefixLayout) keeps its type
        ys = [_fresh(y) for y in x]
        return type(x)(*ys) if hasattr(x, "_fields") else tuple(ys)
    if isinstance(x, list):
        return [_fresh(y) for y in x]
    return x


def capture(model: GEMModel, batch: Any, autocast: Callable[[], Any]) -> dict[str, tuple[nn.Module, Any, Any]]:
    """Inputs of the front-end modules, layer 0's modules (layer 1's pooling if skipped), the
    last layer's attention when it attends from the rows it reads only (`seq_attention_last`,
    GEMConfig.last_layer_rows_only) and the heads."""
    mods: dict[str, nn.Module] = {"sparse": model.sparse, "dense": model.dense, "events": model.events, "heads": model.heads}
    for name in LAYER_MODULES:
        for layer in model.layers:
            m = getattr(layer, name)
            if m is not None and not (name == "seq_attention" and layer.last_rows):
                mods[name] = m
                break
    last = model.layers[-1]
    if last.last_rows and isinstance(last.seq_attention, nn.Module):  # it attends from the rows it reads only
        mods["seq_attention_last"] = last.seq_attention
    got: dict[str, tuple[nn.Module, Any, Any]] = {}
    hooks = []
    for name, m in mods.items():
        def hook(mod: nn.Module, args: Any, kwargs: Any, name: str = name) -> None:
            got.setdefault(name, (mod, _fresh(args), dict(kwargs)))
        hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad(), autocast():
        model(batch)
    for h in hooks:
        h.remove()
    return got


def count(model: GEMModel, name: str) -> int:
    if name in ("sparse", "dense", "events", "heads", "seq_attention_last"):
        return 1
    if name == "seq_attention":
        return sum(1 for layer in model.layers if layer.seq_attention is not None and not layer.last_rows)
    return sum(1 for layer in model.layers if getattr(layer, name) is not None)


def bench_modules(
    model: GEMModel, batch: Any, shapes: Shapes, autocast: Callable[[], Any],
    timer: Callable[[Callable[[], None], int, int], float], warmup: int, iters: int,
    graph: bool = False,
) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for name, (mod, args, kwargs) in capture(model, batch, autocast).items():
        leaves = [t for t in _tensors(args) if t.requires_grad]

        def step(mod: nn.Module = mod, args: Any = args, kwargs: Any = kwargs, leaves: list[torch.Tensor] = leaves) -> None:
            mod.zero_grad(set_to_none=True)
            for t in leaves:
                t.grad = None
            with autocast():
                outs = _tensors(mod(*args, **kwargs))
            outs = [o for o in outs if o.requires_grad]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

        n = count(model, name)
        sec = timer(step, warmup, iters)
        flops = 3.0 * mod.flops(shapes)  # type: ignore[operator]
        rows[name] = {"count": n, "ms": sec * 1e3, "tflops": flops / sec / 1e12, "mfu": flops / sec / PEAK,
                      "total_ms": n * sec * 1e3, "total_gflop": n * flops / 1e9}
        if graph:
            replay, why = capture_graph(step)
            if replay is None:
                print(f"{name}: not captured in a CUDA graph ({why})")
            else:
                gs = timer(replay, 1, iters)
                rows[name].update(graph_ms=gs * 1e3, graph_mfu=flops / gs / PEAK, graph_total_ms=n * gs * 1e3)
    tot_s = sum(r["total_ms"] for r in rows.values()) / 1e3
    tot_f = sum(r["total_gflop"] for r in rows.values()) * 1e9
    rows["weighted"] = {"count": 0, "ms": tot_s * 1e3, "tflops": tot_f / tot_s / 1e12, "mfu": tot_f / tot_s / PEAK,
                        "total_ms": tot_s * 1e3, "total_gflop": tot_f / 1e9}
    if graph and rows and all("graph_ms" in r for k, r in rows.items() if k != "weighted"):
        gt = sum(r["graph_total_ms"] for k, r in rows.items() if k != "weighted") / 1e3
        rows["weighted"].update(graph_ms=gt * 1e3, graph_mfu=tot_f / gt / PEAK)
    return rows


def bench_e2e(
    model: GEMModel, batch: Any, autocast: Callable[[], Any],
    timer: Callable[[Callable[[], None], int, int], float], warmup: int, iters: int,
    graph: bool = False,
) -> tuple[float, float | None]:
    """(seconds per whole-model fwd+bwd, the same replayed as a CUDA graph or None)."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast():
            logits = model(batch)
        nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()  # type: ignore[no-untyped-call]

    sec = timer(step, warmup, iters)
    if not graph:
        return sec, None
    replay, why = capture_graph(step)
    if replay is None:
        print(f"model e2e: not captured in a CUDA graph ({why})")
        return sec, None
    return sec, timer(replay, 1, iters)


def _outer_modules(model: GEMModel) -> list[nn.Module]:
    """The modules around the layers: the front end and the heads."""
    return [model.sparse, model.dense, model.events, model.heads]


def compile_modules(model: GEMModel, backend: str) -> None:
    """`torch.compile` (in place) of every module the bench times: the front end, each
    layer's modules and the heads; a whole-model run calls the same compiled modules."""
    mods = _outer_modules(model)
    for layer in model.layers:
        mods += [m for name in LAYER_MODULES if (m := getattr(layer, name)) is not None]
    for m in mods:
        m.compile(backend=backend)


def compile_layers(model: GEMModel, backend: str) -> None:
    """`torch.compile` (in place) of each layer whole, whole-graph with dynamic sizes (the
    trainer's block compile), and of the front end and the heads as `compile_modules` does."""
    for m in _outer_modules(model):
        m.compile(backend=backend)
    for layer in model.layers:
        layer.compile(backend=backend, fullgraph=True, dynamic=True)


def _logits_close(got: torch.Tensor, want: torch.Tensor, cuda: bool) -> tuple[float, bool]:
    """(max |got - want|, whether it is within the bench's tolerance: bf16 through every
    layer on the GPU, fp32 on the CPU)."""
    diff = float((got - want).abs().max())
    scale = float(want.abs().max())
    return diff, diff <= ((5e-2 + 5e-2 * scale) if cuda else 1e-4 * (1.0 + scale))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smaller batch, fewer iterations")
    ap.add_argument("--batch", type=int, default=None, help="samples (default 32, quick 16)")
    ap.add_argument("--mean-len", type=float, default=1000.0)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--cap", type=int, default=None, help="length cap (default 4096, quick 2048)")
    ap.add_argument("--window", type=int, default=None, help="sliding-window self-attention")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference-attention model")
    ap.add_argument("--mxfp8", default=None, help="gem_precision recipe for the linears, e.g. mxfp8_rceil")
    ap.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                    help="torch.compile every module (backend: inductor, or e.g. aot_eager)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="draw sequences (mean --mean-len, cap --cap) until this many tokens, as the "
                         "trainer's token-budgeted batches do (h200: --tokens 262144 --cap 16384); "
                         "overrides --batch")
    ap.add_argument("--table-grads", choices=("dense", "sparse"), default="dense",
                    help="embedding tables' gradients: dense [rows, dim] (the trainer's default) or sparse "
                         "(one row per looked-up id, gem_model.sparse_table_grads: the backward skips the "
                         "dense gradients, the optimizer then compacts the ids, outside this bench)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="also time each fwd+bwd replayed from a CUDA graph (no launch overhead; CUDA only)")
    ap.add_argument("--last-layer-every-row", action="store_true",
                    help="the last layer attends from every row (GEMConfig.last_layer_rows_only=False, "
                         "gem-model 0.3.9's computation; the same outputs): for an A/B against the default")
    ap.add_argument("--jfa-gluon", default="dkdv,dq",
                    help="which JFA kernels run as their Gluon twins on Hopper (gem_kernels.use_gluon_jfa: "
                         "'all', 'off' or a list of fwd,dkdv,dq; default the trainer's, 'dkdv,dq'; "
                         "GEM_JFA_GLUON wins where set)")
    args = ap.parse_args(argv)
    import gem_kernels

    try:  # what runs: GEM_JFA_GLUON, where set, wins over the flag
        jfa_gluon = ",".join(gem_kernels.use_gluon_jfa(args.jfa_gluon)) or "off"
    except ValueError as e:
        raise SystemExit(f"--jfa-gluon: {e}") from None

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    widths = (256, 256, 192, 128, 128, 64, 64, 32)
    if cuda:
        cfg = presets.h200(**FEATURES, window=args.window, event_widths=widths)
        b = args.batch or (16 if args.quick else 32)
        cap = args.cap or (2048 if args.quick else 4096)
        mean = args.mean_len
        warmup, iters = (2, 5) if args.quick else (3, 10)
    else:
        print("CPU run (no CUDA): toy size, tiny preset — not a speed claim")
        feats = dict(FEATURES, event_vocab=1000, sparse_features=(("user_id", 100), ("page", 10)))
        cfg = presets.tiny(**feats, gdpa_ffn=True, hierarchical_pooling=True, computation_skip=True,
                           window=args.window, event_widths=(16, 16, 12, 8, 8, 4, 4, 2))
        b, cap, mean = args.batch or 4, args.cap or 64, min(args.mean_len, 24.0)
        warmup, iters = 1, 2
    if args.last_layer_every_row:
        cfg = dataclasses.replace(cfg, last_layer_rows_only=False)
    if args.tokens:  # the trainer's batches: sequences until the token budget is reached
        if args.tokens < 1:
            raise SystemExit(f"--tokens={args.tokens} must be >= 1")
        lengths: list[int] = []
        seed = 0
        while sum(lengths) < args.tokens:
            lengths += lognormal_lengths(64, mean, args.sigma, cap, seed=seed)
            seed += 1
        while sum(lengths[:-1]) >= args.tokens:
            lengths.pop()
        b = len(lengths)
    else:
        lengths = lognormal_lengths(b, mean, args.sigma, cap, seed=0)
    batch = make_batch(cfg, lengths, device)
    shapes = Shapes(tuple(lengths))
    timer = median_timer(device)

    def autocast() -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def build(c: GEMConfig, mxfp8: str | None) -> GEMModel:
        """A model of `c` on the device with the run's table gradients and linear recipe."""
        m = GEMModel(c).to(device)
        if args.table_grads == "sparse":
            sparse_table_grads(m)
        if mxfp8:  # applied from outside, as gem_parallel.parallelize does in the trainer
            import gem_precision

            gem_precision.convert_to_mxfp8(m, mxfp8, keep_bf16=("heads*",))
        return m

    torch.manual_seed(0)
    model = build(cfg, args.mxfp8)
    results: dict[str, Any] = {}
    variants: list[tuple[str, GEMModel]] = [("kernels", model)]
    if not args.no_reference:
        ref = build(dataclasses.replace(cfg, attention_backend="reference"), None)
        ref.load_state_dict(model.state_dict())
        variants.append(("reference", ref))
    logits: dict[str, torch.Tensor] = {}
    for tag, m in variants:
        if args.compile:
            compile_modules(m, args.compile)
        with torch.no_grad(), autocast():
            logits[tag] = m(batch).float()
        try:
            rows = bench_modules(m, batch, shapes, autocast, timer, warmup, iters, graph=args.cuda_graph)
            e2e, e2e_graph = bench_e2e(m, batch, autocast, timer, warmup, iters, graph=args.cuda_graph)
        except torch.OutOfMemoryError:
            results[tag] = None
            print(f"{tag}: out of memory")
            continue
        finally:
            if cuda:
                torch.cuda.empty_cache()
        fl = 3.0 * m.flops_for(tuple(lengths))["total"]
        results[tag] = {"modules": rows, "e2e_ms": e2e * 1e3, "e2e_tflops": fl / e2e / 1e12, "e2e_mfu": fl / e2e / PEAK}
        if e2e_graph is not None:
            results[tag].update(e2e_graph_ms=e2e_graph * 1e3, e2e_graph_mfu=fl / e2e_graph / PEAK)
        if args.compile and tag == "kernels":  # the same weights, each layer compiled whole
            whole = build(cfg, args.mxfp8)
            whole.load_state_dict(m.state_dict())
            compile_layers(whole, args.compile)
            with torch.no_grad(), autocast():
                logits["layers"] = whole(batch).float()
            try:
                e2e_l, e2e_lg = bench_e2e(whole, batch, autocast, timer, warmup, iters, graph=args.cuda_graph)
                results[tag].update(e2e_layers_ms=e2e_l * 1e3, e2e_layers_mfu=fl / e2e_l / PEAK)
                if e2e_lg is not None:
                    results[tag].update(e2e_layers_graph_ms=e2e_lg * 1e3, e2e_layers_graph_mfu=fl / e2e_lg / PEAK)
            except torch.OutOfMemoryError:
                print("model e2e, layers: out of memory")
            finally:
                del whole
                if cuda:
                    torch.cuda.empty_cache()

    ok, diff = True, 0.0
    compared = "reference" in logits  # (not with --no-reference)
    if compared:  # Triton vs fp32-math reference attention
        diff, ok = _logits_close(logits["kernels"], logits["reference"], cuda)
    layers_diff: float | None = None
    if "layers" in logits:  # the layer-compiled copy computes the module-compiled model's logits
        layers_diff, layers_ok = _logits_close(logits["layers"], logits["kernels"], cuda)
        print(f"logits max |layers compiled whole - modules compiled| = {layers_diff:.3g} "
              f"({'ok' if layers_ok else 'MISMATCH'})")
        ok = ok and layers_ok

    fwd = model.flops_for(tuple(lengths))
    print(f"\nGEM local MFU — {torch.cuda.get_device_name() if cuda else 'CPU'}; B={b} tokens={sum(lengths)} "
          f"max_len={max(lengths)} d_model={cfg.d_model} heads={cfg.num_heads}x{cfg.head_dim} layers={cfg.num_layers} "
          f"window={cfg.window} mxfp8={args.mxfp8} compile={args.compile} cuda_graph={args.cuda_graph} "
          f"last_layer_rows_only={cfg.last_layer_rows_only} jfa_gluon={jfa_gluon}; "
          f"fwd GFLOP={fwd['total'] / 1e9:.1f}")
    gcols = f"{'graph ms':>10}{'graph MFU':>10}" if args.cuda_graph else ""
    hdr = f"{'module':<20}{'n':>3}{'GFLOP(3x)':>11}{'ms':>9}{'TFLOP/s':>9}{'MFU':>7}{'ref ms':>9}{'ref MFU':>8}{gcols}"
    print(hdr)
    print("-" * len(hdr))
    kr = results.get("kernels")
    rr = results.get("reference")
    if kr is not None:
        for name, r in kr["modules"].items():
            rf = rr["modules"].get(name) if rr else None
            ref_s = f"{rf['ms']:>9.2f}{rf['mfu'] * 100:>7.1f}%" if rf else f"{'-':>9}{'-':>8}"
            n = int(r["count"]) or ""
            g = _graph_cols(r.get("graph_ms"), r.get("graph_mfu")) if args.cuda_graph else ""
            print(f"{name:<20}{n:>3}{r['total_gflop'] / max(r['count'], 1):>11.1f}{r['ms']:>9.2f}{r['tflops']:>9.1f}"
                  f"{r['mfu'] * 100:>6.1f}%{ref_s}{g}")
        ref_e2e = f"{rr['e2e_ms']:>9.2f}{rr['e2e_mfu'] * 100:>7.1f}%" if rr else f"{'-':>9}{'-':>8}"
        g = _graph_cols(kr.get("e2e_graph_ms"), kr.get("e2e_graph_mfu")) if args.cuda_graph else ""
        print(f"{'model e2e':<20}{'':>3}{3 * fwd['total'] / 1e9:>11.1f}{kr['e2e_ms']:>9.2f}{kr['e2e_tflops']:>9.1f}"
              f"{kr['e2e_mfu'] * 100:>6.1f}%{ref_e2e}{g}")
        if "e2e_layers_ms" in kr:
            g = _graph_cols(kr.get("e2e_layers_graph_ms"), kr.get("e2e_layers_graph_mfu")) if args.cuda_graph else ""
            print(f"{'e2e, layers':<20}{'':>3}{3 * fwd['total'] / 1e9:>11.1f}{kr['e2e_layers_ms']:>9.2f}"
                  f"{3 * fwd['total'] / kr['e2e_layers_ms'] / 1e9:>9.1f}{kr['e2e_layers_mfu'] * 100:>6.1f}%"
                  f"{'-':>9}{'-':>8}{g}")
    if compared:
        print(f"logits max |kernels - reference| = {diff:.3g} ({'ok' if ok else 'MISMATCH'})")
    else:
        print("logits: not compared with the reference model (--no-reference)")
    out = {
        "bench": "gem_model.local_mfu", "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "triton": _triton_version(), "quick": args.quick,
        "batch": b, "tokens": sum(lengths), "max_len": max(lengths), "window": cfg.window,
        "d_model": cfg.d_model, "layers": cfg.num_layers, "mxfp8": args.mxfp8, "compile": args.compile,
        "cuda_graph": args.cuda_graph, "table_grads": args.table_grads,
        "last_layer_rows_only": cfg.last_layer_rows_only, "jfa_gluon": jfa_gluon,
        "peak_tflops": PEAK / 1e12,
        "fwd_gflop": {k: v / 1e9 for k, v in fwd.items()},
        "kernels": results.get("kernels"), "reference": results.get("reference"),
        # null without a reference model (--no-reference): nothing was compared
        "logits_max_abs_diff": diff if compared else None,
        "layers_logits_max_abs_diff": layers_diff,
        "correct": ok if compared else None,
    }
    print(json.dumps(_rounded(out)))
    if not ok:
        sys.exit(1)


def _graph_cols(ms: float | None, mfu: float | None) -> str:
    if ms is None or mfu is None:
        return f"{'-':>10}{'-':>10}"
    return f"{ms:>10.2f}{mfu * 100:>9.1f}%"


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def _triton_version() -> str | None:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return None


if __name__ == "__main__":
    main()
