"""Training parity: one MLP trained in bf16, in MXFP8 (each recipe) and in fp8_block, same data and seed.

    PYTHONPATH=precision python3 -m gem_precision.bench.parity [--quick]
    bazel run //precision:bench_parity -- --quick

The model is `layers` hidden nn.Linear(d, d) + GELU and a small bf16 head (d -> 64), trained
with AdamW (warm-up + cosine) on planted regression data: x ~ N(0, 1) [B, d], target =
teacher(x) + noise, a fixed random 2-layer tanh teacher, so the loss has a known floor (the
noise variance) that neither run can beat. Every run sees the same batches (one seeded
generator) and starts from the same weights. bf16 = fp32 master weights under bf16 autocast;
MXFP8 / fp8_block = the same with the hidden layers swapped by `gem_precision.convert` (the
head stays bf16: under 1024 features, and d -> 64 is no multiple of fp8_block's 128). A
second bf16 run from another init seed shows how much two bf16 runs differ on their own.

Reported per run: final train loss (mean of the last 10 % of steps), held-out loss on a fixed
batch, relative difference vs bf16 (target: within 1 %), ms per step. On CUDA: d=2048, 4
layers (the MXFP8 GEMMs take the CUDA path: Triton casts, exact bf16 dequantization, cuBLAS;
fp8_block: cuBLAS's blockwise FP8 GEMM on SM90); without CUDA: a toy size (d=128) with the
dequantize-and-matmul emulations, and it says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any

import torch
from torch import nn

from gem_precision import MXRecipe, convert

TARGET_REL = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParityConfig:
    """Size and optimizer of the parity run."""

    d: int = 2048
    layers: int = 4
    batch: int = 8192
    steps: int = 400
    out: int = 64
    teacher_hidden: int = 256
    noise: float = 0.5
    lr: float = 5e-4
    warmup: int = 20


def _teacher(cfg: ParityConfig, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(1234)
    w1 = torch.randn(cfg.d, cfg.teacher_hidden, generator=g) / cfg.d**0.5 * 2
    w2 = torch.randn(cfg.teacher_hidden, cfg.out, generator=g) / cfg.teacher_hidden**0.5
    return w1.to(device), w2.to(device)


def _batch(cfg: ParityConfig, teacher: tuple[torch.Tensor, torch.Tensor], g: torch.Generator,
           device: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(cfg.batch, cfg.d, device=device, generator=g)
    y = torch.tanh(x @ teacher[0]) @ teacher[1]
    return x, y + cfg.noise * torch.randn(y.shape, device=device, generator=g)


def _model(cfg: ParityConfig, seed: int, device: str) -> nn.Module:
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(cfg.layers):
        mods += [nn.Linear(cfg.d, cfg.d), nn.GELU()]
    mods.append(nn.Linear(cfg.d, cfg.out))
    return nn.Sequential(*mods).to(device)


def train(cfg: ParityConfig, recipe: MXRecipe | str | None, device: str, init_seed: int = 0) -> dict[str, Any]:
    """Trains one model; recipe None = bf16 autocast only. Returns losses and timing."""
    model = _model(cfg, init_seed, device)
    converted = convert(model, recipe, min_features=min(1024, cfg.d)) if recipe is not None else []
    teacher = _teacher(cfg, device)
    g = torch.Generator(device=device).manual_seed(99)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    losses: list[torch.Tensor] = []
    dev_type = "cuda" if device.startswith("cuda") else "cpu"

    def step() -> None:
        x, y = _batch(cfg, teacher, g, device)
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            out = model(x)
        loss = (out.float() - y).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())

    step()  # first step: Triton / torch.compile compilation and tile tuning, not timed
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(cfg.steps - 1):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / max(1, cfg.steps - 1)
    hx, hy = _batch(cfg, teacher, torch.Generator(device=device).manual_seed(7), device)
    with torch.no_grad(), torch.autocast(dev_type, dtype=torch.bfloat16):
        held = float((model(hx).float() - hy).square().mean())
    curve = torch.stack(losses).float().cpu()
    tail = max(1, cfg.steps // 10)
    return {
        "converted": converted, "final_loss": float(curve[-tail:].mean()), "heldout_loss": held,
        "first_loss": float(curve[0]), "ms_per_step": ms,
        "curve": [round(float(curve[i]), 5) for i in range(0, cfg.steps, max(1, cfg.steps // 8))],
    }


def _tuning_off() -> None:
    """First-candidate kernels: tile choice changes speed, not results (the same FP8 codes,
    and the GEMM's fp32 sums only in order), and timing every candidate costs ~30 s at start."""
    from gem_precision import _triton_quant

    _triton_quant.TUNE["enabled"] = False
    try:
        from gem_precision import _triton_gemm
    except ImportError:
        return
    tune = getattr(_triton_gemm, "TUNE", None)
    if isinstance(tune, dict) and "enabled" in tune:
        tune["enabled"] = False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="smaller batch, fewer steps")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--tune", action="store_true",
                   help="let the quant and GEMM kernels time their tile candidates on first use (slower start; "
                        "by default the first candidate is used: numerics are the same either way)")
    args = p.parse_args(argv)
    if not args.tune:
        _tuning_off()
    t_start = time.time()
    if torch.cuda.is_available():
        import triton

        device = "cuda"
        cfg = ParityConfig(batch=4096, steps=200) if args.quick else ParityConfig()
        where = f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    else:
        device = "cpu"
        torch.set_num_threads(1)  # toy GEMMs: threads only add contention
        cfg = ParityConfig(d=128, layers=4, batch=128, steps=200, out=32, teacher_hidden=32, lr=3e-3)
        if args.quick:
            cfg = dataclasses.replace(cfg, steps=100)
        where = (f"CPU run (no CUDA): toy size d={cfg.d}, MXFP8 and fp8_block through their dequantize-and-matmul emulations, "
                 f"torch {torch.__version__}")
    cfg = dataclasses.replace(cfg, steps=args.steps or cfg.steps, batch=args.batch or cfg.batch)
    print(where, flush=True)
    print(f"config: {dataclasses.asdict(cfg)} (loss floor = noise^2 = {cfg.noise**2:.3f})", flush=True)
    runs: list[tuple[str, MXRecipe | str | None, int]] = [
        ("bf16", None, 0), ("bf16 (other init seed)", None, 1), ("fp8_block", "fp8_block", 0),
        ("mxfp8 rceil", MXRecipe.RCEIL, 0), ("mxfp8 floor", MXRecipe.FLOOR, 0)]
    if not args.quick:
        runs += [("fp8_block, wgrad bf16", "fp8_block_wgrad_bf16", 0), ("mxfp8 rceil, wgrad bf16", MXRecipe.RCEIL_WGRAD_BF16, 0)]
    results: dict[str, dict[str, Any]] = {}
    for name, recipe, seed in runs:
        t0 = time.time()
        results[name] = r = train(cfg, recipe, device, init_seed=seed)
        base = results["bf16"]
        r["rel_diff_final"] = (r["final_loss"] - base["final_loss"]) / base["final_loss"]
        r["rel_diff_heldout"] = (r["heldout_loss"] - base["heldout_loss"]) / base["heldout_loss"]
        r["within_1pct"] = abs(r["rel_diff_final"]) <= TARGET_REL and abs(r["rel_diff_heldout"]) <= TARGET_REL
        print(f"  {name:<24} done in {time.time() - t0:5.1f} s; loss curve {r['curve']}", flush=True)
    print(f"\n{'run':<24} {'final loss':>10} {'held-out':>10} {'rel diff (final / held-out)':>28} {'ms/step':>8}  within 1 %")
    for name, r in results.items():
        rel = f"{100 * r['rel_diff_final']:+.2f} % / {100 * r['rel_diff_heldout']:+.2f} %"
        print(f"{name:<24} {r['final_loss']:10.4f} {r['heldout_loss']:10.4f} {rel:>28} {r['ms_per_step']:8.2f}  {r['within_1pct']}")
    low = [n for n in results if n.startswith(("mxfp8", "fp8_block"))]
    verdict = all(results[n]["within_1pct"] for n in low)
    print(f"\nconverted layers: {results[low[0]]['converted']}; all fp8_block / MXFP8 runs within 1 % of bf16: {verdict}")
    summary = {"where": where, "device": device, "quick": args.quick, "tuned": args.tune, "config": dataclasses.asdict(cfg),
               "runs": {n: {k: v for k, v in r.items() if k != "curve"} for n, r in results.items()},
               "all_within_1pct": verdict, "seconds": round(time.time() - t_start, 1)}
    print(f"total {summary['seconds']} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
