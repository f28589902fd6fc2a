"""Bench: each of issue 15's kernels once, inside a profiler range, for Nsight Compute.

    cd kernels && ncu --profile-from-start off --clock-control none --set full -o /tmp/k \\
        python3 -m gem_kernels.bench.ncu_cases [--cases jfa_fwd_full,gdpa_fwd,...]
    python3 tools/ncu_summary.py /tmp/k.ncu-rep     # the compact table (on the GPU machine)

Why: issue 15 asks, for every target it misses, for a profile that shows what limits the
kernel. Timing benches (`table`, `schedule`) say how fast; ncu's counters say why (tensor
pipe busy, memory throughput, occupancy, where warps stall). Every case first runs twice
outside the range (Triton's JIT compile and autotune, cuDNN's plan), then exactly once
inside `cudaProfilerStart/Stop` under an NVTX range named after the case, so the report holds
one launch of each kernel of that call and nothing else. The batches and calls are
`bench.table`'s: the issue's (`torch.manual_seed(62)`, 64 log-normal lengths, H=4, D=128,
bf16); the dense case is 8 x 4096, 16 heads. The peers (cuDNN's dense forward, torch's
FlashAttention-2 backward) are profiled beside ours as what a kernel at the ceiling looks
like. Without `ncu` the script
only runs the calls. `--small --device cpu` runs them on a toy batch under Triton's CPU
interpreter (tests/test_bench_table.py does, so the bench cannot rot).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gem_kernels import block_attention
from gem_kernels.bench._common import issue_lengths
from gem_kernels.bench.table import H, Batch, _fwd, _fwd_bwd, gdpa, jfa

SMALL_LENGTHS = [40, 3, 17, 0, 33]  # `--small`: a toy batch for Triton's CPU interpreter


def _with_bwd(bwd: str, run: Callable[[], object]) -> Callable[[], object]:
    """`run` with `GEM_JFA_BWD=bwd` (which JFA backward runs), restored after."""
    def wrapped() -> object:
        old = os.environ.get("GEM_JFA_BWD")
        os.environ["GEM_JFA_BWD"] = bwd
        try:
            return run()
        finally:
            if old is None:
                os.environ.pop("GEM_JFA_BWD", None)
            else:
                os.environ["GEM_JFA_BWD"] = old
    return wrapped


def _cases(device: str, *, small: bool = False) -> dict[str, Callable[[], object]]:
    """Case name -> one call, on `bench.table`'s batches (D=128, bf16). `small`:
    SMALL_LENGTHS with H=2 and a 2 x 64 dense batch (a smoke run under TRITON_INTERPRET=1);
    cuDNN's dense case only on CUDA."""
    b = Batch(SMALL_LENGTHS if small else issue_lengths(), device, heads=2 if small else H)
    dense_b, dense_t, dense_h = (2, 64, 2) if small else (8, 4096, 16)
    dense = Batch([dense_t] * dense_b, device, heads=dense_h)
    qp, kp, vp = (x.view(dense_b, dense_t, dense_h, -1).transpose(1, 2).contiguous()
                  for x in (dense.q, dense.k, dense.v))

    def dense_cudnn() -> object:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp)

    cases: dict[str, Callable[[], object]] = {
        "jfa_fwd_full": _fwd(jfa(False), b),
        "jfa_fwd_causal": _fwd(jfa(True), b),
        "jfa_fb_full_two_pass": _with_bwd("two_pass", _fwd_bwd(jfa(False), b)),
        "jfa_fb_causal_two_pass": _with_bwd("two_pass", _fwd_bwd(jfa(True), b)),
        "jfa_fb_causal_one_pass": _with_bwd("one_pass", _fwd_bwd(jfa(True), b)),
        "jfa_fb_causal_flash2": _with_bwd("flash", _fwd_bwd(jfa(True), b)),
        "gdpa_fwd": _fwd(gdpa(), b),
        "gdpa_fb": _fwd_bwd(gdpa(), b),
        "block_fwd": lambda: block_attention(b.q, b.k, b.v, b.off, b.max, block_size=64),
        "dense_fwd_ours": _fwd(jfa(False), dense),
    }
    if device != "cpu":
        cases["dense_fwd_cudnn"] = dense_cudnn
    return cases


def main(argv: list[str] | None = None) -> list[str]:
    """Runs the cases; returns the names run (in order)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="a toy batch (a CPU smoke run under TRITON_INTERPRET=1)")
    args = p.parse_args(argv)
    cases = _cases(args.device, small=args.small)
    names = [c for c in args.cases.split(",") if c] or list(cases)
    unknown = sorted(set(names) - set(cases))
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; known: {sorted(cases)}")
    cuda = args.device != "cpu"
    for name in names:
        for _ in range(1 if not cuda else 2):
            cases[name]()
    if not cuda:  # no profiler: the warm-up calls were the run
        print(f"ran {', '.join(names)} (no profiler on {args.device})", flush=True)
        return names
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    for name in names:
        cudart.cudaProfilerStart()
        torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]
        cases[name]()
        torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        print(f"ran {name}", flush=True)
    return names


if __name__ == "__main__":
    main()
