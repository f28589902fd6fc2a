"""Which batches of the trainer's data would make a new compiled variant of a layer, and why.

    python3 tools/aot_guards.py [--preset h200] [--batches 300] [--backend inductor]
                                [--small] [--bf16/--no-bf16] [--largest K] [--stream-ops]

The trainer's ahead-of-time store (`--compile-aot`) compiles a new variant of a block kind
whenever no stored variant's guards accept a call. This tool walks the trainer's own batches
(the preset's data and token budget) and, for every batch, builds each layer's inputs: `x`,
the token stream and its layout are real (the model's embedding stage, run eagerly); the
`pooled` input of the computation-skip layers is random, of the right shape (guards read
shapes, not values). Each layer's call is checked against the variants so far with the
guards alone: the layers never run. A call that no variant accepts is compiled ahead of
time (`torch.compile(...).aot_compile`, the trainer's flags, whole graph, dynamic sizes) and
printed with the guard each earlier variant failed. So it answers "does some batch shape make
a new variant" without training, and in the compile time of the variants only.

`--small` shrinks the widths (d_model 64, 2 heads) so the h200 structure compiles on a CPU;
there the sequence attention is traced through the Triton kernels' custom ops
(run it with TRITON_INTERPRET=1), as on a GPU. What it cannot see: guards that depend on the run's state
rather than on a batch (grads, optimizer steps), and, on a CPU, guards that only the GPU's
code generation adds. One such was behind the h200 store's later variants until
gem-parallel 0.3.10: the strict mode of inductor's mix-order reduction (Triton code only)
guarded the sample count into 256..1279 (trainer/BENCHMARKS.md, thirty-first session).

`--largest K` answers one of those GPU-only guards on any machine: inductor's Triton code
uses 32-bit indices only where it can guard every kernel's and buffer's element count at
<= 2**31 - 1, so a batch past that bound would need a new variant. It traces the first
batch's pooling and computation-skip layers at the preset's real widths through
AOTAutograd (inductor's decompositions, the trainer's flags; nothing runs) and prints
the K largest tensors of each forward and backward graph, their element count as a
share of 2**31 - 1, and their size in the batch's symbols.

`--stream-ops` traces the same two layers the same way, and the last layer (rows only where
it does not pool), and prints every op of their forward and backward graphs that makes a
tensor of at least half the token stream's size, by op with counts and then in graph order
with each node's inputs: the passes over memory that inductor then fuses or not. Where a
layer's backward builds a gradient in a fresh buffer (`empty`/`full`, `index_put`) that a
separate `add` then sums, the two are a pass inductor cannot fuse (the forty-first session
found the stream reads' gradients this way: gem-model 0.6.1's `gather_stream_grads`). Run a
model switch through it with
`python3 tools/with_model.py FIELD=VALUE -- tools/aot_guards.py --bf16 --stream-ops`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

import gem_model
from gem_parallel._aot import _aot_compile_forward, _why_not, with_flags
from gem_parallel._parallelize import _compile_settings
from gem_trainer import _loop
from gem_trainer import config as tc

SMALL = dict(d_model=64, num_heads=2, emb_dim=16, event_emb_dim=32, ffn_mult=2, head_hidden=32)


class _Stop(Exception):
    """Raised by `layer_inputs`'s hook: the forward stops at the first layer's call."""


def layer_inputs(model: gem_model.GEMModel, batch: object) -> tuple[torch.Tensor, torch.Tensor, object]:
    """(x, token stream, layout) as `GEMModel.forward` hands them to its first layer: the
    forward runs up to that call (a pre-hook takes the arguments and stops it)."""
    got: list[tuple[object, ...]] = []

    def grab(module: torch.nn.Module, args: tuple[object, ...]) -> None:
        got.append(args)
        raise _Stop

    hook = model.layers[0].register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            model(batch)
    except _Stop:
        pass
    finally:
        hook.remove()
    x, comb, lay = got[0][:3]
    assert isinstance(x, torch.Tensor) and isinstance(comb, torch.Tensor)
    return x.requires_grad_(), comb.requires_grad_(), lay


class _Traced(Exception):
    """Raised by `largest_tensors`'s partitioner once it has the forward and backward graphs."""


def _trace(layer: torch.nn.Module, args: tuple[object, ...]) -> list[torch.fx.GraphModule]:
    """`layer`'s forward and backward graphs for `args`, as AOTAutograd hands them to inductor
    (inductor's decompositions, the trainer's flags, the min-cut partition); nothing runs."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    graphs: list[torch.fx.GraphModule] = []

    def partition(joint: torch.fx.GraphModule, inputs: object, **kw: object) -> object:
        graphs.extend(min_cut_rematerialization_partition(joint, inputs, **kw))  # type: ignore[arg-type]
        raise _Traced

    backend = aot_autograd(fw_compiler=lambda gm, _: gm, partition_fn=partition, decompositions=select_decomp_table())
    torch._dynamo.reset()
    try:
        with_flags(torch.compile(layer, backend=backend, fullgraph=True, dynamic=True), _compile_settings())(*args)
    except Exception as e:  # dynamo wraps the backend's exception
        if not graphs:
            raise RuntimeError(f"tracing failed before the partition: {e!r}") from e
    return graphs


def _numels(node: torch.fx.Node) -> list[tuple[int, str]]:
    """(element count as a hint, its expression) of each tensor `node` produces."""
    vals = node.meta.get("val")
    out = []
    for t in vals if isinstance(vals, (list, tuple)) else [vals]:
        if isinstance(t, torch.Tensor):
            num = t.numel()
            sym = isinstance(num, torch.SymInt)
            out.append((int(num.node.hint) if sym else int(num), str(num.node.expr if sym else num)))
    return out


def largest_tensors(layer: torch.nn.Module, args: tuple[object, ...], k: int) -> None:
    """Print the k largest tensors of `layer`'s forward and backward graphs for `args`."""
    limit = 2**31 - 1
    for name, g in zip(("forward", "backward"), _trace(layer, args)):
        rows = [(hint, n.name, expr) for n in g.graph.nodes for hint, expr in _numels(n)]
        rows.sort(key=lambda r: -r[0])
        print(f"  {name}: {len(rows)} tensors; the largest:")
        for hint, node, expr in rows[:k]:
            print(f"    {hint:>15,} elements  {hint / limit:5.2f} x 2**31  {node}  ({expr})")


# Ops that make no pass over memory (views, metadata, tuple items): left out of `--stream-ops`.
_FREE = ("view", "reshape", "_unsafe_view", "alias", "permute", "t", "transpose", "unsqueeze", "squeeze",
         "expand", "slice", "select", "split", "unbind", "getitem", "as_strided", "sym_size")


def stream_ops(layer: torch.nn.Module, args: tuple[object, ...], rows: int, d: int) -> None:
    """Print, for `layer`'s forward and backward graphs, every op that produces a tensor of at
    least half the token stream's size (`rows` x `d` elements): the passes over memory
    that inductor then fuses or not. By op, with counts, then in graph order with each node's
    inputs (what a fusion would have to join)."""
    floor = rows * d // 2
    for name, g in zip(("forward", "backward"), _trace(layer, args)):
        big = []
        for n in g.graph.nodes:
            if n.op != "call_function":
                continue
            op = getattr(n.target, "__name__", str(n.target)).split(".")[0]
            if op in _FREE:
                continue
            sizes = [(h, e) for h, e in _numels(n) if h >= floor]
            if sizes:
                big.append((n, op, sizes))
        counts: dict[str, int] = {}
        for _, op, _ in big:
            counts[op] = counts.get(op, 0) + 1
        print(f"  {name}: {len(big)} ops make a tensor of >= {floor:,} elements: "
              + ", ".join(f"{op} x{c}" for op, c in sorted(counts.items(), key=lambda kv: -kv[1])))
        for n, op, sizes in big:
            ins = ", ".join(a.name for a in n.all_input_nodes)[:110]
            print(f"    {n.name:28s} {op:34s} {sizes[0][1]:>14s}  <- {ins}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="h200")
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--backend", default="inductor", help='"inductor" (the trainer\'s) or "eager" (dynamo\'s guards only)')
    p.add_argument("--small", action="store_true", help="the preset's structure at CPU widths")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="autocast to bf16 as the trainer does (default: on a GPU)")
    p.add_argument("--largest", type=int, default=0, metavar="K",
                   help="print the K largest tensors of the first batch's layer graphs instead (see above)")
    p.add_argument("--stream-ops", action="store_true",
                   help="print the ops of the first batch's layer graphs that make stream-sized tensors instead")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("aot_guards: without a GPU, run it with TRITON_INTERPRET=1 (the attention is traced "
                 "through the Triton kernels' custom ops, as on a GPU)")
    device = torch.device("cuda" if cuda else "cpu")
    bf16 = cuda if a.bf16 is None else a.bf16
    cfg = tc.PRESETS[a.preset]()
    dcfg = _loop.data_config(cfg)
    mcfg = _loop.model_config(cfg, dcfg)
    if a.small:
        mcfg = dataclasses.replace(mcfg, **SMALL)
    if not cuda:
        mcfg = dataclasses.replace(mcfg, attention_backend="triton")  # the GPU's custom ops, interpreted
    torch.manual_seed(0)
    model = gem_model.GEMModel(mcfg).to(device)
    loader = _loop.make_loader(cfg, dcfg, 0, 1, device)
    flags = _compile_settings()
    variants: list[object] = []
    pooled_shape: tuple[int, ...] | None = None
    t_compile = 0.0
    for step, batch in zip(range(a.batches), loader):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            x, comb, lay = layer_inputs(model, batch)
            if pooled_shape is None:
                pool = model.layers[0].pooling  # [B, n_out, d] (SeqPooling, MeanPooling); not run:
                pooled_shape = (pool.n_out, pool.d)  # at full width the interpreter takes minutes
            pooled = torch.randn(x.shape[0], *pooled_shape, device=device, dtype=comb.dtype, requires_grad=True)
            if a.largest or a.stream_ops:
                # the pooling and the computation-skip kinds; --stream-ops adds the last layer
                # (rows-only where it does not pool: a kind of its own)
                last = len(model.layers) - 1
                for i in sorted({0, 1} | ({last} if a.stream_ops and last > 1 else set())):
                    kind = "pooling" if model.layers[i].pooling is not None else "computation skip"
                    kind += ", rows only" if getattr(model.layers[i], "last_rows", False) else ""
                    print(f"layer {i} (B={x.shape[0]} T={comb.shape[0]} max_len={lay.seq_max_len}; {kind}):",
                          flush=True)
                    args = (x, comb, lay, None if i == 0 else pooled)
                    if a.stream_ops:
                        stream_ops(model.layers[i], args, comb.shape[0], comb.shape[1])
                    else:
                        largest_tensors(model.layers[i], args, a.largest)
                return
            for i, layer in enumerate(model.layers):
                args = (x, comb, lay, None if i == 0 else pooled)  # as GEMModel.forward passes them
                if any(v.guard_check(layer, *args) for v in variants):  # type: ignore[attr-defined]
                    continue
                why = [f"variant {j + 1}: {_why_not(v, layer, args, {})}" for j, v in enumerate(variants)]
                t = time.perf_counter()
                variants.append(with_flags(_aot_compile_forward, flags)(a.backend, layer, args, {}))
                t_compile += time.perf_counter() - t
                print(f"batch {step} layer {i} (B={x.shape[0]} T={comb.shape[0]} max_len={lay.seq_max_len}): "
                      f"variant {len(variants)} compiled in {time.perf_counter() - t:.1f} s; {why or 'the first'}",
                      flush=True)
        if step % 25 == 0:
            print(f"batch {step}: B={x.shape[0]} T={comb.shape[0]} max_len={lay.seq_max_len}, "
                  f"{len(variants)} variants", flush=True)
    print(f"{len(variants)} variants over {a.batches} batches ({t_compile:.1f} s compiling), backend {a.backend}, "
          f"device {device.type}, bf16 {bf16}, small {a.small}")


if __name__ == "__main__":
    main()
