"""Bench: each of issue 15's kernels once, inside a profiler range, for Nsight Compute.

    cd kernels && ncu --profile-from-start off --clock-control none --set full -o /tmp/k \\
        python3 -m gem_kernels.bench.ncu_cases [--cases jfa_fwd_full,gdpa_fwd,...]
    python3 tools/ncu_summary.py /tmp/k.ncu-rep     # the compact table (on the GPU machine)

Why: issue 15 asks, for every target it misses, for a profile that shows what limits the
kernel. Timing benches (`table`, `schedule`) say how fast; ncu's counters say why (tensor
pipe busy, memory throughput, occupancy, where warps stall). Every case first runs twice
outside the range (Triton's JIT compile and autotune, cuDNN's plan), then exactly once
inside `cudaProfilerStart/Stop` under an NVTX range named after the case, so the report holds
one launch of each kernel of that call and nothing else. The batch is the issue's
(`torch.manual_seed(62)`, 64 log-normal lengths, H=4, D=128, bf16); the dense case is
8 x 4096, 16 heads. The peers (cuDNN's dense forward, torch's FlashAttention-2 backward) are
profiled beside ours as what a kernel at the ceiling looks like. Without `ncu` the script
only runs the calls. `--small --device cpu` runs them on a toy batch under Triton's CPU
interpreter (tests/test_bench_table.py does, so the bench cannot rot).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gem_kernels import block_attention, generalized_dot_product_attention, jagged_flash_attention
from gem_kernels.bench._common import issue_lengths, offsets_from_lengths

H, D = 4, 128
DT = torch.bfloat16


SMALL_LENGTHS = [40, 3, 17, 0, 33]  # `--small`: a toy batch for Triton's CPU interpreter


def _cases(device: str, *, small: bool = False) -> dict[str, Callable[[], object]]:
    """Case name -> one call. `small`: SMALL_LENGTHS, H=2, D=32 and a 2 x 64 dense batch (a
    smoke run under TRITON_INTERPRET=1); cuDNN's dense case only on CUDA."""
    lengths = SMALL_LENGTHS if small else issue_lengths()
    heads, d = (2, 32) if small else (H, D)
    dense_b, dense_t, dense_h = (2, 64, 2) if small else (8, 4096, 16)
    off = offsets_from_lengths(lengths, device)
    mx = max(lengths)
    g = torch.Generator(device=device).manual_seed(1)
    t = sum(lengths)
    q, k, v, do = (torch.randn(t, heads, d, generator=g, device=device).to(DT) for _ in range(4))

    def jfa_fwd(causal: bool) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return jagged_flash_attention(q, k, v, off, off, mx, mx, causal=causal, backend="triton")
        return run

    def fwd_bwd(fn: Callable[..., torch.Tensor], bwd_env: str | None) -> Callable[[], object]:
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

        def run() -> object:
            old = os.environ.get("GEM_JFA_BWD")
            if bwd_env is not None:
                os.environ["GEM_JFA_BWD"] = bwd_env
            try:
                o = fn(qg, kg, vg)
                return torch.autograd.grad(o, (qg, kg, vg), do)
            finally:
                if old is None:
                    os.environ.pop("GEM_JFA_BWD", None)
                else:
                    os.environ["GEM_JFA_BWD"] = old
        return run

    def jfa(causal: bool) -> Callable[..., torch.Tensor]:
        return lambda a, b, c: jagged_flash_attention(a, b, c, off, off, mx, mx, causal=causal, backend="triton")

    def gdpa(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return generalized_dot_product_attention(a, b, c, off, off, mx, mx, activation="silu", causal=True,
                                                 backend="triton")

    def gdpa_fwd() -> object:
        with torch.no_grad():
            return gdpa(q, k, v)

    def block() -> object:
        return block_attention(q, k, v, off, mx, block_size=64)

    gd = torch.Generator(device=device).manual_seed(3)
    qd, kd, vd = (torch.randn(dense_b * dense_t, dense_h, d, generator=gd, device=device).to(DT) for _ in range(3))
    offd = offsets_from_lengths([dense_t] * dense_b, device)
    qp, kp, vp = (x.view(dense_b, dense_t, dense_h, d).transpose(1, 2).contiguous() for x in (qd, kd, vd))

    def dense_ours() -> object:
        with torch.no_grad():
            return jagged_flash_attention(qd, kd, vd, offd, offd, dense_t, dense_t, backend="triton")

    def dense_cudnn() -> object:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qp, kp, vp)

    cases: dict[str, Callable[[], object]] = {
        "jfa_fwd_full": jfa_fwd(False),
        "jfa_fwd_causal": jfa_fwd(True),
        "jfa_fb_full_two_pass": fwd_bwd(jfa(False), "two_pass"),
        "jfa_fb_causal_two_pass": fwd_bwd(jfa(True), "two_pass"),
        "jfa_fb_causal_one_pass": fwd_bwd(jfa(True), "one_pass"),
        "jfa_fb_causal_flash2": fwd_bwd(jfa(True), "flash"),
        "gdpa_fwd": gdpa_fwd,
        "gdpa_fb": fwd_bwd(gdpa, None),
        "block_fwd": block,
        "dense_fwd_ours": dense_ours,
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
