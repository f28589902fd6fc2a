"""Which batches of the trainer's data would make a new compiled variant of a layer, and why.

    python3 tools/aot_guards.py [--preset h200] [--batches 300] [--backend inductor]
                                [--small] [--bf16/--no-bf16]

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
code generation adds.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

import gem_model
from gem_model import _jagged
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="h200")
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--backend", default="inductor", help='"inductor" (the trainer\'s) or "eager" (dynamo\'s guards only)')
    p.add_argument("--small", action="store_true", help="the preset's structure at CPU widths")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="autocast to bf16 as the trainer does (default: on a GPU)")
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
                with torch.no_grad():
                    events = _jagged.events_of(comb, lay)
                    pooled_shape = tuple(model.layers[0].pooling(events, lay.seq_offsets, lay.seq_max_len).shape[1:])
            pooled = torch.randn(x.shape[0], *pooled_shape, device=device, dtype=comb.dtype, requires_grad=True)
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
