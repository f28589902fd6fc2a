"""Bench: how much of an eager call's time is host work, for issue 15's rows (GPU).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.eager [--iters 15] [--calls 200] [--profile]

Issue 15's table times eager calls: CUDA events around one call after a sync, so the figure
includes the host time between the start event and the first kernel (the checks, the path
rules, the launch) and any gap the host leaves between kernels. This bench puts three
figures side by side for each row, on the issue's batch (`torch.manual_seed(62)`, 64
log-normal lengths, H=4, D=128, bf16):

- `eager ms`: what `bench.table` measures (`bench_ms`, median);
- `graph ms`: the same call captured in a CUDA graph and replayed (device time alone);
- `host us`: CPU time per call with no sync (a loop of `--calls` calls), so how long Python
  needs to issue one call's kernels.

`eager - graph` is what the host costs the table's figure. `--profile` adds a cProfile of a
forward and a forward+backward row of each op (`PROFILED`; top functions by own time). The
compact table is printed last, then one JSON line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
from collections.abc import Callable

import torch

from gem_kernels import block_attention
from gem_kernels.bench._common import (attention_flops, bench_graph_ms, bench_ms, emit_json, env_info, host_us,
                                       issue_lengths, print_table, save_json, tflops, visible_pairs)
from gem_kernels.bench.table import H, D, Batch, _fwd, _fwd_bwd, gdpa, jfa


def cases(lengths: list[int], device: str) -> list[tuple[str, Callable[[], object], float]]:
    """(name, call, useful FLOPs) for the issue table's JFA, GDPA and Block rows: the calls
    `bench.table` times (its batch and call forms; backend "auto": the reference on a CPU)."""
    b = Batch(lengths, device)
    out: list[tuple[str, Callable[[], object], float]] = []
    for causal in (False, True):
        name = "causal" if causal else "full"
        f_fwd, f_all = attention_flops(visible_pairs(lengths, lengths, causal=causal), H, D)
        out += [(f"JFA fwd {name}", _fwd(jfa(causal, "auto"), b), f_fwd),
                (f"JFA fwd+bwd {name}", _fwd_bwd(jfa(causal, "auto"), b), f_all)]
    f_fwd, f_all = attention_flops(visible_pairs(lengths, lengths, causal=True), H, D)

    def bfwd() -> object:
        with torch.no_grad():
            return block_attention(b.q, b.k, b.v, b.off, b.max, block_size=64)

    out += [("GDPA SiLU causal fwd", _fwd(gdpa("auto"), b), f_fwd),
            ("GDPA SiLU causal fwd+bwd", _fwd_bwd(gdpa("auto"), b), f_all),
            ("BlockAttention(64) fwd", bfwd, 0.0)]
    return out


# The rows `--profile` profiles: one forward and one forward+backward of each op.
PROFILED = ("JFA fwd full", "JFA fwd+bwd causal", "GDPA SiLU causal fwd", "GDPA SiLU causal fwd+bwd")


def profile(fn: Callable[[], object], calls: int, top: int = 14) -> str:
    for _ in range(3):
        fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=15, help="timed calls per eager / graph figure (median)")
    p.add_argument("--calls", type=int, default=200, help="calls per host-time figure")
    p.add_argument("--profile", action="store_true", help="also cProfile the rows in PROFILED (a forward and a forward+backward of each op)")
    p.add_argument("--small", action="store_true", help="8 short sequences (the default without a GPU)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="directory for eager.json (default $OUT)")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = args.small or device == "cpu"
    lengths = [int(x) for x in torch.randint(4, 40, (8,)).tolist()] if small else issue_lengths()
    rows: list[dict[str, object]] = []
    profiles: dict[str, str] = {}
    for name, fn, flops in cases(lengths, device):
        eager = bench_ms(fn, iters=args.iters)
        graph = bench_graph_ms(fn, iters=args.iters)
        host = host_us(fn, args.calls)
        rows.append({"case": name, "eager_ms": eager, "graph_ms": graph, "host_us": host,
                     "eager_minus_graph_us": None if graph is None else (eager - graph) * 1e3,
                     "eager_tflops": tflops(flops, eager) if flops else None,
                     "graph_tflops": tflops(flops, graph) if flops and graph else None})
        print(rows[-1], flush=True)
        if args.profile and name in PROFILED:
            profiles[name] = profile(fn, args.calls)
    for name, text in profiles.items():
        print(f"=== cProfile, {name}, {args.calls} calls")
        print(text[-3000:])
    print_table(rows, ["case", "eager_ms", "graph_ms", "eager_minus_graph_us", "host_us", "eager_tflops",
                       "graph_tflops"])
    payload: dict[str, object] = {"bench": "eager", "env": env_info(), "lengths": lengths, "rows": rows}
    emit_json(payload)
    save_json(args.out, "eager.json", payload)


if __name__ == "__main__":
    main()
