"""Microbench: a layer's three reads of the stream (CLS rows, recent tokens, event rows) and
their backward, separate (`unique_rows` + `recent_tokens` + `events_of`) vs one autograd node
(`_jagged.stream_reads`, GEMConfig.merged_stream_reads), eager and compiled.

    python3 tools/bench_stream_reads.py            # GPU: the h200 step's shape, bf16
    python3 tools/bench_stream_reads.py --cpu      # CPU: a smaller stream, fp32

Each case: forward + backward of `sum(read * upstream) + sum(stream * upstream)` (the last
term stands for the rest of the block, whose gradient the reads' gradients are added to);
median of --reps timings (CUDA events on the GPU). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from gem_model import _jagged
from gem_model._layers import recent_tokens


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--batch", type=int, default=None, help="samples (GPU 64, CPU 64)")
    p.add_argument("--mean-len", type=int, default=None, help="mean events per sample (GPU 4096, CPU 200)")
    p.add_argument("--d", type=int, default=None, help="stream width (GPU 1024, CPU 256)")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cpu" if a.cpu or not torch.cuda.is_available() else "cuda")
    gpu = dev.type == "cuda"
    b = a.batch or 64
    mean = a.mean_len or (4096 if gpu else 200)
    d = a.d or (1024 if gpu else 256)
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(0)
    lengths = torch.randint(0, 2 * mean, (b,)).tolist()
    offsets = torch.tensor([0] + lengths).cumsum(0).to(dev)
    total, n, k = int(sum(lengths)), 4, 8
    lay = _jagged.prefix_layout(offsets, max(lengths), total, n, head_dim=8, rope_base=100.0)
    tc = lay.sample.shape[0]
    comb = torch.randn(tc, d, device=dev, dtype=dtype, requires_grad=True)
    ups = [torch.randn(s, device=dev, dtype=dtype) for s in ((b * n, d), (b, k, d), (total, d), (tc, d))]

    def make(merged: bool) -> Callable[..., torch.Tensor]:
        def f(c: torch.Tensor, *u: torch.Tensor) -> torch.Tensor:
            if merged:
                cls, rec, ev = _jagged.stream_reads(c, lay, k, events=True)
            else:
                cls = _jagged.unique_rows(c, lay.cls_rows)
                rec = recent_tokens(c, lay.offsets, k, lay.n)
                ev = _jagged.events_of(c, lay)
            assert ev is not None
            return (cls * u[0]).sum() + (rec * u[1]).sum() + (ev * u[2]).sum() + (c * u[3]).sum()
        return f

    def timed(f: Callable[..., torch.Tensor]) -> float:
        out = []
        for i in range(a.reps + 3):
            comb.grad = None
            if gpu:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                f(comb, *ups).backward()
                e.record()
                torch.cuda.synchronize()
                ms = s.elapsed_time(e)
            else:
                t = time.perf_counter()
                f(comb, *ups).backward()
                ms = (time.perf_counter() - t) * 1e3
            if i >= 3:
                out.append(ms)
        return statistics.median(out)

    rows: dict[str, Any] = {}
    for compiled in (False, True):
        for merged in (False, True):
            f = make(merged)
            if compiled:
                torch._dynamo.reset()
                f = torch.compile(f, fullgraph=True, dynamic=True)
            rows[f"{'compiled' if compiled else 'eager'} {'merged' if merged else 'separate'}"] = timed(f)
    print(f"device={dev} dtype={dtype} stream=[{tc}, {d}] batch={b} k={k} torch={torch.__version__}")
    for name, ms in rows.items():
        print(f"{name:>20}: {ms:8.3f} ms")
    print(json.dumps({"device": str(dev), "tc": tc, "d": d, "ms": rows}))


if __name__ == "__main__":
    main()
