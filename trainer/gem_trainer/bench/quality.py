"""Quality bench: does the GEM model learn more than plain rankers from the same samples?

    bazel run //trainer:bench_quality                      # tiny preset, CPU
    python3 -m gem_trainer.bench.quality --preset h200 --steps 1000 --out /tmp/q   # GPU

Every model trains on the trainer's own sample stream (same seed, same batches, same order,
same number of updates) and is scored at the same sample counts on one held-out set of
`--eval-batches` batches (>= 4,096 samples by default) against the planted Bayes-optimal AUC:

- gem: the trainer's model and optimizer, exactly as `//trainer:gem` trains it;
- gem_no_attention: the same with sequence attention off (mean pooling instead);
- pooled_mlp: DLRM-style pooled embeddings + MLP (gem_model.PooledMLP);
- logreg: logistic regression on sparse ids + dense + domain (gem_model.LogisticRegression).

Baselines get the trainer's optimizer recipe (row-wise Adagrad tables, AdamW dense with
warm-up and cosine decay) and the best of a dense-lr sweep (`--baseline-lrs`), picked on
the held-out set: a choice in the baselines' favour, so a GEM win is not a tuning artefact.

Output: a table, `quality.json` and `quality.png` (AUC lift vs samples, one line per model)
under `--out`, and a final one-line JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import torch

import gem_model
from gem_trainer import _loop
from gem_trainer import _quality as Q
from gem_trainer.config import PRESETS


def _points(steps: int, n: int) -> list[int]:
    """n evaluation steps, geometric from ~steps/16 to steps (always includes steps)."""
    if n <= 1:
        return [steps]
    lo = max(1, steps // 16)
    pts = {round(lo * (steps / lo) ** (i / (n - 1))) for i in range(n)}
    return sorted(pts | {steps})


_TRAINER_FIELDS = ("precision", "lr", "sparse_lr", "warmup_steps", "lr_final_frac")


def _literal(v: str) -> Any:
    import ast

    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v


def _mean_auc(row: dict[str, Any]) -> float:
    return float(sum(m["auc"] for m in row["tasks"].values()) / len(row["tasks"]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    over: dict[str, Any] = {"steps": args.steps, "eval_batches": args.eval_batches}
    if device.type == "cpu" and args.preset != "tiny":
        over["precision"] = "fp32"
    cfg = PRESETS[args.preset](**over)
    cfg.validate()
    torch.manual_seed(cfg.seed)
    dcfg = _loop.data_config(cfg)
    mcfg = _loop.model_config(cfg, dcfg)
    ho = Q.held_out(cfg, dcfg, device)
    points = sorted(set(args.eval_at) | {cfg.steps}) if args.eval_at else _points(cfg.steps, args.points)
    print(f"quality bench: preset={args.preset} steps={cfg.steps} held-out={ho.num_samples} samples "
          f"device={device} eval at {points}", file=sys.stderr, flush=True)
    makers: dict[str, Any] = {"gem": lambda: gem_model.GEMModel(mcfg)}
    makers.update(Q.baselines(mcfg))
    run_cfg: dict[str, Any] = {}
    for var in args.gem_variants:  # ablations: "gem[k=v;k=v]" (precision=... is a trainer field)
        kv = dict(x.split("=", 1) for x in var.split(";"))
        trainer_kw = {k: _literal(kv.pop(k)) for k in list(kv) if k in _TRAINER_FIELDS}
        model_kw = {k: _literal(v) for k, v in kv.items()}
        name = f"gem[{var}]"
        vcfg = dataclasses.replace(mcfg, **model_kw)
        makers[name] = lambda vcfg=vcfg: gem_model.GEMModel(vcfg)
        run_cfg[name] = trainer_kw
        args.models.append(name)
    curves: dict[str, list[dict[str, Any]]] = {}
    # The first model reads the loader and keeps its batches; the others replay them.
    stream: list[Any] | None = [] if args.cache_stream else None
    chosen_lr: dict[str, float] = {}
    for name in args.models:
        lrs = [run_cfg.get(name, {}).pop("lr", cfg.lr)] if name.startswith("gem") else args.baseline_lrs
        best: list[dict[str, Any]] | None = None
        for lr in lrs:
            torch.manual_seed(cfg.seed)
            with torch.device(device):
                model = makers[name]()
            t0 = time.perf_counter()
            rows = Q.curve(name, model, dataclasses.replace(cfg, lr=lr, **run_cfg.get(name, {})), dcfg,
                           device, ho, points,
                           stream=stream)
            aucs = " ".join(f"{t}={m['auc']:.4f}" for t, m in rows[-1]["tasks"].items())
            print(f"  {name:>17} lr={lr:g}: mean AUC {_mean_auc(rows[-1]):.4f} [{aucs}] "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            if best is None or _mean_auc(rows[-1]) > _mean_auc(best[-1]):
                best, chosen_lr[name] = rows, lr
            del model
        assert best is not None
        curves[name] = best
    result = {
        "preset": args.preset, "steps": cfg.steps, "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "torch": torch.__version__, "held_out_samples": ho.num_samples,
        "bayes": {t: m["auc"] for t, m in ho.bayes.items()},
        "dense_lr": chosen_lr, "curves": curves,
        "final": {n: {t: {"auc": m["auc"], "auc_se": m["auc_se"], "ne": m["ne"],
                          "lift": Q.lift(m["auc"], ho.bayes[t]["auc"])}
                      for t, m in rows[-1]["tasks"].items()} for n, rows in curves.items()},
    }
    result["gem_margin"] = _margins(result)
    return result


def _margins(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """GEM's AUC minus the best other model's, per task and per evaluation step."""
    curves = result["curves"]
    if "gem" not in curves:
        return {}
    out: dict[str, dict[str, float]] = {}
    for i, row in enumerate(curves["gem"]):
        per: dict[str, float] = {}
        for task, m in row["tasks"].items():
            others = [c[i]["tasks"][task]["auc"] for n, c in curves.items() if n != "gem"]
            per[task] = m["auc"] - max(others) if others else math.nan
        out[str(row["samples"])] = per
    return out


def _table(result: dict[str, Any]) -> str:
    tasks = list(result["bayes"])
    head = f"{'model':>17} | " + " | ".join(f"{t} AUC (lift)" for t in tasks)
    lines = [head, "-" * len(head)]
    for name, fin in result["final"].items():
        cells = [f"{fin[t]['auc']:.4f}±{fin[t]['auc_se']:.4f} ({fin[t]['lift']:.2f})" for t in tasks]
        lines.append(f"{name:>17} | " + " | ".join(cells))
    lines.append(f"{'Bayes':>17} | " + " | ".join(f"{result['bayes'][t]:.4f}" for t in tasks))
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> bool:
    """AUC lift vs samples, one panel per task, one line per model. False if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tasks = list(result["bayes"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        bayes = result["bayes"][task]
        for name, rows in result["curves"].items():
            xs = [r["samples"] for r in rows]
            ys = [Q.lift(r["tasks"][task]["auc"], bayes) for r in rows]
            ax.plot(xs, ys, marker="o", ms=3, label=name, lw=2.2 if name == "gem" else 1.2)
        ax.axhline(1.0, color="k", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_title(f"{task} (Bayes AUC {bayes:.3f})")
        ax.set_xlabel("training samples")
        ax.set_ylabel("AUC lift (auc-0.5)/(bayes-0.5)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"quality bench, preset {result['preset']}, held-out {result['held_out_samples']} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_quality", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=None, help="updates per model (default: the preset's)")
    p.add_argument("--eval-batches", type=int, default=64, help="held-out batches (64 x 64 = 4,096 samples)")
    p.add_argument("--points", type=int, default=6, help="evaluation points on the learning curve")
    p.add_argument("--eval-at", default=None, type=lambda s: [int(x) for x in s.split(",")],
                   help="explicit evaluation steps (default: --points geometric ones)")
    p.add_argument("--models", default="gem,gem_no_attention,pooled_mlp,logreg",
                   type=lambda s: [x for x in s.split(",") if x], help="comma-separated subset")
    p.add_argument("--baseline-lrs", default="1e-3,3e-3,1e-2",
                   type=lambda s: [float(x) for x in s.split(",")], help="dense-lr sweep of baselines")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gem_quality"), help="JSON + PNG folder")
    p.add_argument("--gem-variants", nargs="*", default=[],
                   help="extra GEM ablations, each 'field=value;field=value' of GEMConfig "
                        f"(or a trainer field {_TRAINER_FIELDS}), e.g. 'sequence_attention=False'")
    p.add_argument("--cache-stream", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the first model's batches and replay them for the others")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = PRESETS[args.preset]().steps
    known = {"gem", "gem_no_attention", "pooled_mlp", "logreg"}
    if not set(args.models) <= known:
        p.error(f"--models {args.models} must be a subset of {sorted(known)}")
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quality.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    png = os.path.join(args.out, "quality.png")
    print(_table(result))
    print(f"curves: {png}" if plot(result, png) else "curves: matplotlib not importable, no PNG")
    print(json.dumps({"preset": result["preset"], "steps": result["steps"], "gpu": result["gpu"],
                      "torch": result["torch"], "bayes": result["bayes"], "final": result["final"],
                      "gem_margin_final": list(result["gem_margin"].values())[-1] if result["gem_margin"] else {}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
