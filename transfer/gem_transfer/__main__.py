"""`python -m gem_transfer`: the end-to-end transfer job, or teacher scoring alone.

    python -m gem_transfer                                 # tiny preset on CPU: teacher, scores, students, table
    python -m gem_transfer --save-teacher /tmp/t.pt --out /tmp/tr
    python -m gem_transfer --teacher /tmp/t.pt --methods label_only,combined --out /tmp/tr2
    python -m gem_transfer score --teacher /tmp/t.pt --out /tmp/scores --blocks 0:512

`score` scores blocks [a, b) of the synthetic stream (or of `--data parquet:DIR`) with a saved
teacher into resumable score shards; under torchrun each rank writes its share (RANK,
WORLD_SIZE). Rerun the same command after a crash: finished shards are kept.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any

import torch

import gem_data
from gem_transfer._distill import METHODS
from gem_transfer._pipeline import PRESETS, data_config, gains, run_transfer
from gem_transfer.presets import gem, tiny
from gem_transfer._scoring import score_to_parquet
from gem_transfer._teacher import load_teacher


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _score(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gem_transfer score", description="teacher scoring into score shards")
    p.add_argument("--teacher", required=True, help="a save_teacher file")
    p.add_argument("--out", required=True, help="score shard directory (resumed if it has shards)")
    p.add_argument("--preset", default="tiny", choices=PRESETS, help="data preset of the synthetic stream")
    p.add_argument("--data", default="synthetic", help="'synthetic' or 'parquet:DIR'")
    p.add_argument("--seed", type=int, default=0, help="data seed (synthetic)")
    p.add_argument("--block-size", type=int, default=64, help="samples per synthetic block")
    p.add_argument("--blocks", default=None, help="block range A:B (default: every block of a Parquet source)")
    p.add_argument("--blocks-per-shard", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    dev = _device(a.device)
    model = load_teacher(a.teacher, device=dev)
    dcfg = data_config(tiny(seed=a.seed) if a.preset == "tiny" else gem(seed=a.seed))
    source: Any
    if a.data == "synthetic":
        if a.blocks is None:
            p.error("--blocks A:B is required with synthetic data (the stream is endless)")
        source = gem_data.SyntheticSource(dcfg, block_size=a.block_size)
    elif a.data.startswith("parquet:"):
        source = gem_data.ParquetSource(a.data[len("parquet:"):], expect=dcfg)
    else:
        p.error(f"--data={a.data!r} must be 'synthetic' or 'parquet:DIR'")
    blocks = None
    if a.blocks is not None:
        lo, _, hi = a.blocks.partition(":")
        if not lo.isdigit() or not hi.isdigit() or int(hi) <= int(lo):
            p.error(f"--blocks={a.blocks!r} must be A:B with 0 <= A < B")
        blocks = range(int(lo), int(hi))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    rep = score_to_parquet(model, source, a.out, blocks=blocks, blocks_per_shard=a.blocks_per_shard, rank=rank,
                           world_size=world, device=dev, progress=not a.no_progress)
    print(json.dumps(rep))
    return 0


def _split_methods(text: str) -> tuple[str, ...]:
    out = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in out if m not in METHODS]
    if bad:
        raise SystemExit(f"--methods: {bad} not in {METHODS}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "score":
        return _score(argv[1:])
    p = argparse.ArgumentParser(prog="python -m gem_transfer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--data", default="synthetic", help="'synthetic' or 'parquet:DIR' (gem_data.write_parquet)")
    p.add_argument("--teacher", default=None, help="load this save_teacher file instead of training")
    p.add_argument("--save-teacher", default=None, help="write the trained teacher here")
    p.add_argument("--out", default=None, help="score shards directory (default: a temporary one)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    p.add_argument("--teacher-samples", type=int, default=None)
    p.add_argument("--student-samples", type=int, default=None)
    p.add_argument("--eval-samples", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU: a shared "
                   "small box runs one OpenMP thread much faster than two)")
    a = p.parse_args(argv)
    dev = _device(a.device)
    if a.threads or dev.type == "cpu":
        torch.set_num_threads(a.threads or 1)
    over: dict[str, Any] = {"data": a.data, "methods": _split_methods(a.methods), "seed": a.seed}
    for name in ("teacher_samples", "student_samples", "eval_samples"):
        if getattr(a, name) is not None:
            over[name] = getattr(a, name)
    cfg = (tiny if a.preset == "tiny" else gem)(**over)
    out = a.out or tempfile.mkdtemp(prefix="gem_transfer_")
    res = run_transfer(cfg, out, device=dev, teacher=a.teacher, save_teacher_to=a.save_teacher)
    print(res["table"])
    summary = {"tasks": {t: {"bayes": (res["bayes"] or {}).get(t, {}).get("auc"),
                             "teacher": res["teacher"][t]["auc"],
                             **{m: v["auc"] for m, v in row.items()}} for t, row in gains(res).items()},
               "scores_dir": out, "config": {k: v for k, v in dataclasses.asdict(cfg).items()
                                              if not isinstance(v, dict)}}
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
