"""The residual projection with and without `GEMConfig.inplace_residual_gemm`, compiled.

    python3 -m gem_model.bench.residual_gemm [--tokens 262144] [--iters 20]

The h200 preset's sequence FFN (`_layers.GDPAFFN`: layer norm, `wq`, GDPA over 32 keys per
sample, then `wo` with the residual added by the GEMM; 4 of the step's 7 residual GEMMs are
these), forward + backward under bf16 autocast, compiled by
inductor once per arm: "addmm" (`inplace_residual_gemm=False`: `torch.addmm(res, x, Wᵀ)`,
which copies the residual into its output before the GEMM) against "in place" (the default
since gem-model 0.6.3: a clone of the residual that inductor may write in the layer norm's
kernel, and `gem_model::addmm_into` adding into it).
The arms alternate (A, B, A, B, ...); each figure is the median of CUDA-event times. Checks
that both arms' outputs are equal bit for bit. Without CUDA it runs a toy size on the CPU
(not a speed claim).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from collections.abc import Callable

import torch

from gem_model import GEMConfig, presets
from gem_model._layers import GDPAFFN
from gem_model.bench._batch import FEATURES, median_timer


def _ffn_inputs(cfg: GEMConfig, tokens: int, samples: int, device: torch.device
                ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randint(1, tokens, (samples - 1,), generator=g)).values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([tokens])]).to(device)
    lengths = offsets[1:] - offsets[:-1]
    sample = torch.repeat_interleave(torch.arange(samples, device=device), lengths)
    seq = torch.randn(tokens, cfg.d_model, device=device).to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    x_sum = torch.randn(samples, cfg.num_cls, cfg.d_model, device=device)
    return seq, x_sum, offsets, sample


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=262_144)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two arms")
    a = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    d, tokens, samples = (1024, a.tokens, a.samples) if cuda else (64, 512, 8)
    cfg = presets.h200(**FEATURES) if cuda else presets.h200(**FEATURES, d_model=d, num_heads=2)
    torch.manual_seed(0)
    ffn = GDPAFFN(cfg).to(device)
    seq, x_sum, offsets, sample = _ffn_inputs(cfg, tokens, samples, device)
    max_len = int((offsets[1:] - offsets[:-1]).max())
    leaf = seq.clone().requires_grad_()
    grad = torch.randn_like(seq)

    def arm(in_place: bool) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
        # one module per arm (the same weights), each compiled on its own: no reset between
        # the arms, which would drop the first arm's graph and retrace it with the second's flag
        mod = copy.deepcopy(ffn)
        mod.in_place = in_place
        f = torch.compile(mod, dynamic=False)

        def fwd_bwd() -> torch.Tensor:
            # fresh gradients each call, as a training step's (no accumulating add into .grad)
            leaf.grad = None
            mod.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                out: torch.Tensor = f(leaf, x_sum, offsets, max_len, sample)
            out.backward(grad)  # type: ignore[no-untyped-call]
            return out

        first = fwd_bwd().detach().clone()
        for _ in range(3):
            fwd_bwd()
        return fwd_bwd, first

    timer = median_timer(device)
    steps: dict[str, Callable[[], torch.Tensor]] = {}
    firsts: dict[str, torch.Tensor] = {}
    for name, in_place in (("addmm", False), ("in place", True)):
        steps[name], firsts[name] = arm(in_place)
    equal = bool(torch.equal(firsts["addmm"], firsts["in place"]))
    res: dict[str, list[float]] = {"addmm": [], "in place": []}
    for _ in range(a.rounds):
        for name in res:
            res[name].append(timer(steps[name], 0, a.iters))
    med = {k: statistics.median(v) for k, v in res.items()}
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device: {gpu}; torch {torch.__version__}; "
          f"tokens {tokens}, samples {samples}, d {cfg.d_model}")
    print(f"{'arm':10s} {'fwd+bwd ms':>11s}  rounds (ms)")
    for k, v in med.items():
        print(f"{k:10s} {v * 1e3:11.3f}  " + " ".join(f"{x * 1e3:.3f}" for x in res[k]))
    print(f"in place / addmm: {med['in place'] / med['addmm']:.4f}; outputs equal bit for bit: {equal}")
    print(json.dumps({"bench": "residual_gemm", "device": gpu,
                      "torch": torch.__version__, "tokens": tokens, "ms": {k: v * 1e3 for k, v in med.items()},
                      "rounds_ms": {k: [x * 1e3 for x in v] for k, v in res.items()}, "equal": equal}))


if __name__ == "__main__":
    main()
