"""Loader bench: throughput from synthetic data and Parquet, and cross-rank balance.

    bazel run //data:bench_loader            # or: python3 -m gem_data.bench.loader [--quick]

Prints a table, then one JSON line. Figures:
- synthetic / Parquet samples/s and tokens/s through JaggedLoader (one worker thread),
- `parquet_tokens_per_s_per_core`: tokens decoded into flat numpy buffers per CPU-second of
  the whole process (Parquet -> HostBatch, pyarrow single-threaded; CPU time, so other jobs
  sharing the machine do not distort it; wall-clock rate reported beside it),
- imbalance (max rank cost / mean, cost = sum len^2) at 8 and 64 simulated ranks with and
  without base-batch shuffling, at GEM-like lengths (log-normal mean ~1,000, cap 16,384),
- on CUDA also the end-to-end rate with pinned memory + async copy to the GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch

try:
    import pyarrow as pa
except ImportError:  # the bench still measures synthetic data and balance
    pa = None

import gem_data
from gem_data import (JaggedLoader, ParquetSource, SyntheticSource, attention_cost, imbalance, presets,
                      shuffle_base_batches, write_parquet)


def _loader_rate(loader: JaggedLoader, warmup: int = 1) -> tuple[float, float, int]:
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    n_s = n_t = steps = 0
    t0 = time.perf_counter()
    for b in it:
        n_s += b.num_samples
        n_t += b.num_tokens
        steps += 1
    if loader.device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    loader.close()
    return n_s / dt, n_t / dt, steps


def _imbalance(src: SyntheticSource, world: int, per_rank: int, steps: int) -> dict[str, float]:
    bal, unbal = [], []
    for s in range(steps):
        base = s * world * per_rank
        costs = np.array([attention_cost(src.lengths(base + j)).sum() for j in range(world * per_rank)])
        ranks = shuffle_base_batches(costs, world)
        bal.append(imbalance([costs[r].sum() for r in ranks]))
        unbal.append(imbalance(costs.reshape(world, per_rank).sum(1)))
    return {"bal_mean": float(np.mean(bal)), "bal_max": float(np.max(bal)),
            "unbal_mean": float(np.mean(unbal)), "unbal_max": float(np.max(unbal))}


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (~10 s)")
    ap.add_argument("--dir", default=None, help="where to write the Parquet shards (default: a temp dir)")
    args = ap.parse_args(argv)
    q = args.quick
    cuda = torch.cuda.is_available()
    cfg = presets.gem(seed=1)
    block, per_rank = 4, 64  # sub-batch = 4 samples, 64 per rank -> 256 samples (~256k tokens) per rank
    rows: list[tuple[str, str]] = []
    res: dict[str, object] = {}

    # synthetic through the loader (CPU, one worker; samples made on the fly)
    n_syn = 8 if q else 32
    syn = SyntheticSource(cfg, block_size=64, num_blocks=n_syn)
    s_rate, t_rate, _ = _loader_rate(JaggedLoader(syn, blocks_per_batch=1, sparse_kind="native"))
    res.update(synthetic_samples_per_s=s_rate, synthetic_tokens_per_s=t_rate)
    rows.append(("synthetic -> Batch (1 worker)", f"{s_rate:,.0f} samples/s  {t_rate / 1e6:.2f} M tokens/s"))
    if cuda:
        # correctness of the pinned/async path in this run: GPU batches equal the CPU ones
        ref = list(JaggedLoader(syn, blocks_per_batch=1, sparse_kind="native", num_epochs=1))[:3]
        got = list(JaggedLoader(syn, blocks_per_batch=1, sparse_kind="native", device="cuda", num_workers=2))[:3]
        ok = all(torch.equal(g.event_ids.cpu(), r.event_ids) and torch.equal(g.dense.cpu(), r.dense)
                 and torch.equal(g.sparse.values().cpu(), r.sparse.values()) for g, r in zip(got, ref))
        res["cuda_batches_match_cpu"] = ok
        s_rate, t_rate, _ = _loader_rate(JaggedLoader(syn, blocks_per_batch=1, sparse_kind="native", device="cuda",
                                                      num_workers=2))
        res.update(synthetic_cuda_tokens_per_s=t_rate)
        rows.append(("synthetic -> GPU (pinned, async copy, 2 workers)",
                     f"{s_rate:,.0f} samples/s  {t_rate / 1e6:.2f} M tokens/s  match CPU: {ok}"))

    # Parquet: write shards, then read
    if pa is not None:
        tmp = tempfile.TemporaryDirectory() if args.dir is None else None
        out_dir = args.dir or (tmp.name if tmp else ".")
        n_blocks = 16 if q else 64
        t0 = time.perf_counter()
        paths = write_parquet((syn.read(i % n_syn) for i in range(n_blocks)),
                              os.path.join(out_dir, f"gem-{os.getpid()}"), tasks=cfg.tasks,
                              samples_per_shard=512, rows_per_group=16)
        w_dt = time.perf_counter() - t0
        total_tokens = sum(int(syn.lengths(i % n_syn).sum()) for i in range(n_blocks))
        size = sum(p.stat().st_size for p in paths)
        rows.append(("parquet write", f"{len(paths)} shards, {size / 2**20:.0f} MiB, {total_tokens / w_dt / 1e6:.2f} M tokens/s"))
        pa.set_cpu_count(1)
        src = ParquetSource(os.path.dirname(paths[0]))
        reps = 2 if q else 3
        best_core, best_wall = 0.0, 0.0
        for _ in range(reps):
            c0, w0, n_tok = time.process_time(), time.perf_counter(), 0
            for u in range(src.num_blocks):
                h = src.read(u)
                assert h is not None
                n_tok += h.num_tokens
            c1, w1 = time.process_time(), time.perf_counter()
            best_core = max(best_core, n_tok / max(c1 - c0, 1e-9))
            best_wall = max(best_wall, n_tok / (w1 - w0))
        assert n_tok == total_tokens, (n_tok, total_tokens)
        res.update(parquet_tokens_per_s_per_core=best_core, parquet_read_tokens_per_s=best_wall)
        rows.append(("parquet -> numpy (1 thread)", f"{best_core / 1e6:.2f} M tokens/s per CPU-s  ({best_wall / 1e6:.2f} M tokens/s wall)"))
        s_rate, t_rate, _ = _loader_rate(JaggedLoader(src, blocks_per_batch=4, sparse_kind="native"))
        res.update(parquet_loader_samples_per_s=s_rate, parquet_loader_tokens_per_s=t_rate)
        rows.append(("parquet -> Batch via JaggedLoader (1 worker)", f"{s_rate:,.0f} samples/s  {t_rate / 1e6:.2f} M tokens/s"))
        if cuda:
            s_rate, t_rate, _ = _loader_rate(JaggedLoader(src, blocks_per_batch=4, sparse_kind="native", device="cuda",
                                                          num_workers=2))
            res.update(parquet_cuda_tokens_per_s=t_rate)
            rows.append(("parquet -> GPU (pinned, async copy, 2 workers)", f"{s_rate:,.0f} samples/s  {t_rate / 1e6:.2f} M tokens/s"))
        if tmp is not None:
            tmp.cleanup()

    else:
        rows.append(("parquet", "skipped: pyarrow is not installed"))

    # balance at GEM-like lengths
    lens_src = SyntheticSource(cfg, block_size=block)
    allL = np.concatenate([lens_src.lengths(i) for i in range(2000)])
    rows.append(("lengths (gem preset)", f"mean {allL.mean():.0f}  p50 {np.median(allL):.0f}  p99 {np.percentile(allL, 99):.0f}  max {allL.max()}  cap {cfg.seq_len_cap}"))
    for world, steps in ((8, 10 if q else 40), (64, 2 if q else 8)):
        t0 = time.perf_counter()
        r = _imbalance(lens_src, world, per_rank, steps)
        dt = (time.perf_counter() - t0) / steps
        res[f"imbalance_{world}"] = r["bal_mean"]
        res[f"imbalance_{world}_max"] = r["bal_max"]
        res[f"imbalance_{world}_unbalanced"] = r["unbal_mean"]
        res[f"imbalance_{world}_unbalanced_max"] = r["unbal_max"]
        rows.append((f"imbalance {world} ranks (mean/max over {steps} steps)",
                     f"balanced {r['bal_mean']:.4f}/{r['bal_max']:.4f}  unbalanced {r['unbal_mean']:.3f}/{r['unbal_max']:.3f}"
                     f"  (plan {dt * 1e3:.0f} ms/step)"))

    res.update(
        device=torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        cpu_run=not cuda, quick=q, sub_batch_samples=block, sub_batches_per_rank=per_rank,
        torch=torch.__version__, pyarrow=pa.__version__ if pa is not None else None, numpy=np.__version__, python=platform.python_version(),
        gem_data=gem_data.__version__,
    )
    print(f"gem_data loader bench ({'CPU run' if not cuda else res['device']}{', quick' if q else ''})")
    w = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"  {a:<{w}}  {b}")
    print(json.dumps(res, sort_keys=True))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
