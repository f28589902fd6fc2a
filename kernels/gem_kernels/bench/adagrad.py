"""Bench: `rowwise_adagrad_` (one Triton pass) vs its plain-PyTorch reference on the h200
preset's embedding tables.

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.adagrad [--iters N] [--out DIR] [--sparse]

Tables (rows x dim, fraction of rows with a gradient in one step): the event item table
1M x 256 at 10 % (a step's ~262k Zipf-distributed event ids), the user / ad / advertiser /
page / country tables (1M, 500k, 50k, 1k, 200 rows x 128) at ~800 ids each (the step's ~260
samples x ~3 ids). Timing: CUDA events, median; every iteration updates the same tables in
place (the update's cost does not depend on their values). `GB/s` counts the bytes the reference's rule must move at least once: the
gradient read, plus the weight read and written for the rows it changes.

`--sparse`: what a training step's tables cost from the lookups' output gradient to the updated
tables, dense against sparse table gradients (the trainer's `table_grads`). Dense: torch's
embedding backward builds the `[rows, dim]` gradient (what autograd does for a plain lookup),
then the one-pass update. Sparse: the sparse COO gradient of the lookups (one row per id),
updated through `rowwise_adagrad_`'s compaction. The item table takes 262,144 ids drawn
log-uniformly (Zipf with exponent 1: a few ids repeat thousands of times), the user / ad /
advertiser / page / country tables ~800 ids each.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from gem_kernels import rowwise_adagrad_, rowwise_adagrad_reference_
from gem_kernels.bench._common import bench_ms, emit_json, env_info, print_table, save_json

TABLES = (("item", 1_000_000, 256, 0.10), ("user_id", 1_000_000, 128, 800), ("ad_id", 500_000, 128, 800),
          ("advertiser", 50_000, 128, 800), ("page", 1_000, 128, 800), ("country", 200, 128, 200))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--sparse", action="store_true", help="dense vs sparse table gradients, backward + update")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("adagrad bench needs CUDA")
        emit_json({"bench": "adagrad", "skipped": "no CUDA", **env_info()})
        return
    if args.sparse:
        sparse_vs_dense(args.iters, args.out)
        return
    g = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict[str, object]] = []
    tabs = []
    for name, n, d, hit in TABLES:
        w = torch.randn(n, d, generator=g, device="cuda")
        acc = torch.zeros(n, device="cuda")
        grad = torch.zeros(n, d, device="cuda")
        k = int(hit * n) if isinstance(hit, float) else min(n, hit)
        idx = torch.randperm(n, generator=g, device="cuda")[:k]
        grad[idx] = torch.randn(k, d, generator=g, device="cuda")
        tabs.append((w, acc, grad))
        skip = torch.zeros((), dtype=torch.bool, device="cuda")
        tri = bench_ms(lambda: rowwise_adagrad_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip, backend="triton"),
                       warmup=3, iters=args.iters)
        ref = bench_ms(lambda: rowwise_adagrad_reference_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip),
                       warmup=3, iters=args.iters)
        need = grad.numel() * 4 + 2 * k * d * 4
        rows.append({"table": name, "rows": n, "dim": d, "rows_hit": k, "triton_ms": round(tri, 3),
                     "torch_ms": round(ref, 3), "speedup": round(ref / tri, 2),
                     "triton_GB/s": round(need / tri / 1e6, 1)})
        print(json.dumps(rows[-1]), flush=True)
    skip = torch.zeros((), dtype=torch.bool, device="cuda")

    def all_tri() -> None:
        for w, acc, grad in tabs:
            rowwise_adagrad_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip, backend="triton")

    def all_ref() -> None:
        for w, acc, grad in tabs:
            rowwise_adagrad_reference_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip)

    tri, ref = bench_ms(all_tri, warmup=3, iters=args.iters), bench_ms(all_ref, warmup=3, iters=args.iters)
    rows.append({"table": "all (one step)", "triton_ms": round(tri, 3), "torch_ms": round(ref, 3),
                 "speedup": round(ref / tri, 2)})
    print("\nrow-wise Adagrad, one step per table (ms, CUDA events, median):")
    print_table(rows, ["table", "rows", "dim", "rows_hit", "triton_ms", "torch_ms", "speedup", "triton_GB/s"])
    payload: dict[str, object] = {"bench": "adagrad", **env_info(), "rows": rows}
    save_json(args.out, "adagrad.json", payload)
    emit_json(payload)


def sparse_vs_dense(iters: int, out: str | None) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    skip = torch.zeros((), dtype=torch.bool, device="cuda")
    rows: list[dict[str, object]] = []
    steps = []
    for name, n, d, hit in TABLES:
        k = 262_144 if name == "item" else int(hit)
        u = torch.rand(k, generator=g, device="cuda", dtype=torch.float64)
        ids = (torch.exp(u * torch.log(torch.tensor(float(n)))).long() - 1).clamp(0, n - 1)  # P(id) ~ 1/(id+1)
        vals = torch.randn(k, d, generator=g, device="cuda")
        w = torch.randn(n, d, generator=g, device="cuda")
        acc = torch.zeros(n, device="cuda")

        def dense(w: torch.Tensor = w, acc: torch.Tensor = acc, ids: torch.Tensor = ids, vals: torch.Tensor = vals,
                  n: int = n) -> None:
            grad = torch.ops.aten.embedding_dense_backward(vals, ids, n, -1, False)
            rowwise_adagrad_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip)

        def sparse(w: torch.Tensor = w, acc: torch.Tensor = acc, ids: torch.Tensor = ids, vals: torch.Tensor = vals,
                   n: int = n, d: int = d) -> None:
            grad = torch.sparse_coo_tensor(ids[None], vals, (n, d), check_invariants=False)
            rowwise_adagrad_(w, acc, grad, lr=0.05, eps=1e-8, skip=skip)

        steps.append((dense, sparse))
        dm, sm = bench_ms(dense, warmup=3, iters=iters), bench_ms(sparse, warmup=3, iters=iters)
        rows.append({"table": name, "rows": n, "dim": d, "ids": k, "distinct": int(torch.unique(ids).numel()),
                     "dense_ms": round(dm, 3), "sparse_ms": round(sm, 3), "speedup": round(dm / sm, 2)})
        print(json.dumps(rows[-1]), flush=True)
    dm = bench_ms(lambda: [s[0]() for s in steps], warmup=3, iters=iters)
    sm = bench_ms(lambda: [s[1]() for s in steps], warmup=3, iters=iters)
    rows.append({"table": "all (one step)", "dense_ms": round(dm, 3), "sparse_ms": round(sm, 3),
                 "speedup": round(dm / sm, 2)})
    print("\ntables' backward + row-wise Adagrad, dense vs sparse gradients (ms, CUDA events, median):")
    print_table(rows, ["table", "rows", "dim", "ids", "distinct", "dense_ms", "sparse_ms", "speedup"])
    payload: dict[str, object] = {"bench": "adagrad_sparse", **env_info(), "rows": rows}
    save_json(out, "adagrad_sparse.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
