"""Communication volume per step for GEM-like presets, 1 host x 8 GPUs up to 512 x 8.

Analytic (no device is used, so it runs the same on CPU and GPU): for each preset and
topology, dense HSDP (shard = 8 GPUs of a host, replicate across hosts) and embeddings either
1-D (model-parallel over the whole world) or 2-D (the smallest model-parallel group whose
table shard fits the per-GPU embedding budget, replicated). Prints a table per preset, then
one JSON line.

    python3 -m gem_parallel.bench.comm_volume [--quick] [--sync-every N]
    bazel run //parallel:bench_comm_volume
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform

import torch

from gem_parallel import CommConfig, ParallelDims, comm_table, comm_volume

GPUS_PER_HOST = 8
HOSTS = (1, 2, 8, 64, 512)
EMB_BUDGET_BYTES = 40e9  # of an H200's 141 GB: tables + optimizer state per GPU

# GEM-like presets (public GEM / Kunlun descriptions: ~1e9-1e10 dense params, 100 GB-1 TB of
# tables, D=256, user histories of ~1k events (DESIGN.md: mean 863), dozens of id features).
PRESETS = {
    "gem-1b/100GB": CommConfig(dense_params=1_000_000_000, embedding_bytes=100_000_000_000,
                               embedding_dim=256, lookups_per_sample=64 + 1024,
                               batch_per_rank=128, optimizer_state_ratio=1 / 256),
    "gem-10b/1TB": CommConfig(dense_params=10_000_000_000, embedding_bytes=1_000_000_000_000,
                              embedding_dim=256, lookups_per_sample=128 + 2048,
                              batch_per_rank=128, optimizer_state_ratio=1 / 256),
}


def smallest_mp(cfg: CommConfig, world: int) -> int:
    """Smallest model-parallel group (a multiple of a host, dividing world) that fits."""
    need = cfg.embedding_bytes * (1 + cfg.optimizer_state_ratio)
    mp = min(GPUS_PER_HOST, world)
    while mp < world and need / mp > EMB_BUDGET_BYTES:
        mp *= 2
    return mp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1, 8 and 512 hosts only")
    ap.add_argument("--sync-every", type=int, default=1,
                    help="2-D sparse replica sync period in steps (default 1: every step)")
    args = ap.parse_args()
    hosts = (1, 8, 512) if args.quick else HOSTS
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"# analytic communication-volume model (no device timing; run on {device}); "
          f"dense HSDP shard={GPUS_PER_HOST} per host, 2-D sparse budget "
          f"{EMB_BUDGET_BYTES / 1e9:.0f} GB/GPU, sync every {args.sync_every} step(s)")
    records = []
    for name, base in PRESETS.items():
        cfg = dataclasses.replace(base, sparse_sync_every=args.sync_every)
        rows = []
        for h in hosts:
            world = h * GPUS_PER_HOST
            for mode, mp in (("1-D", world), ("2-D", smallest_mp(cfg, world))):
                if mode == "2-D" and mp == world:
                    continue  # 2-D degenerates to 1-D
                dims = ParallelDims(hosts=h, gpus_per_host=GPUS_PER_HOST, sparse_mp=mp)
                items = comm_volume(cfg, dims)
                shard_gb = cfg.embedding_bytes * (1 + cfg.optimizer_state_ratio) / mp / 1e9
                fits = shard_gb * 1e9 <= EMB_BUDGET_BYTES
                rows.append((mode if fits else f"{mode} (>budget)", dims, items))
                records.append({
                    "preset": name, "hosts": h, "gpus_per_host": GPUS_PER_HOST, "sparse": mode,
                    "sparse_mp": mp, "emb_shard_gb": round(shard_gb, 3), "fits": fits,
                    **{i.name: round(i.bytes_per_rank / 1e9, 4) for i in items},
                    "offhost_gb": round(sum(i.offhost_bytes_per_rank for i in items) / 1e9, 4),
                    "est_ms": round(sum(i.seconds for i in items) * 1e3, 2)})
        print(f"\n## {name}: dense {cfg.dense_params / 1e9:g}B params, tables "
              f"{cfg.embedding_bytes / 1e9:g} GB, D={cfg.embedding_dim}, "
              f"{cfg.lookups_per_sample} lookups/sample, {cfg.batch_per_rank} samples/GPU")
        print(comm_table(rows))
    print(json.dumps({"bench": "comm_volume", "analytic": True, "device": device,
                      "torch": torch.__version__, "python": platform.python_version(),
                      "sync_every": args.sync_every, "rows": records}))


if __name__ == "__main__":
    main()
