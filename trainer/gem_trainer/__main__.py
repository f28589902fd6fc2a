"""`python3 -m gem_trainer` / `bazel run //trainer:gem`: train a GEM-like model.

With no arguments: the tiny preset on the embedded synthetic task, on CPU, ~1 minute.
Prints per-task NE/AUC next to the planted task's Bayes-optimal values, then one JSON line.
Several processes: `torchrun --nproc-per-node N -m gem_trainer ...` (gloo on CPU, NCCL on GPU).
"""
from __future__ import annotations

import argparse
import json
import sys

from gem_trainer.config import PRECISIONS, PRESETS, SPARSE_SHARDINGS, TrainConfig


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="gem", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--batch-tokens", type=int)
    p.add_argument("--data", help="'synthetic' (default) or 'parquet:DIR'")
    p.add_argument("--ckpt-dir")
    p.add_argument("--ckpt-every", type=int)
    p.add_argument("--keep-last", type=int)
    p.add_argument("--resume", action="store_true", default=None)
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--seed", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--log-dir")
    p.add_argument("--log-every", type=int)
    p.add_argument("--eval-batches", type=int)
    p.add_argument("--max-bad-steps", type=int)
    p.add_argument("--sparse-sharding", choices=SPARSE_SHARDINGS)
    p.add_argument("--sparse-lr", type=float)
    p.add_argument("--sparse-mp", type=int,
                   help="ranks per embedding model-parallel group; < world size = 2-D sparse "
                        "parallelism (DMPCollection); 0 = every rank")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    a = vars(p.parse_args(argv))
    preset = a.pop("preset")
    overrides = {k: v for k, v in a.items() if v is not None}
    return PRESETS[preset](**overrides)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
        cfg.validate()
    except ValueError as e:
        print(f"gem: error: {e}", file=sys.stderr)
        return 2
    from gem_trainer._loop import train

    try:
        summary = train(cfg)
    except ValueError as e:
        print(f"gem: error: {e}", file=sys.stderr)
        return 2
    if summary.get("world_size", 1) == 1 or _rank() == 0:
        for task, m in summary["tasks"].items():
            print(f"{task:>12}: NE {m['ne']:.4f} (Bayes {m['ne_bayes']:.4f})  "
                  f"AUC {m['auc']:.4f} (Bayes {m['auc_bayes']:.4f})")
        print(json.dumps(summary))
    return 1 if summary.get("stop_reason") == "nan" else 0


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


if __name__ == "__main__":
    sys.exit(main())
