"""Where an eager BlockAttention call spends its host time (GPU only).

    PYTHONPATH=kernels python3 tools/probe_launch.py [--calls 300]

The Block forward's kernel takes ~60 us on the H200 (ncu); the public call is host-bound
(kernels/BENCHMARKS.md). This times, per call and on the CPU clock (no sync inside the loop,
few enough calls that the launch queue never fills), each layer of the call: the public
`block_attention`, the autograd.Function, the launcher `block_forward_triton`, the bare
`kernel[grid](...)`, the compiled kernel's own runner (Triton's binder and cache lookup
skipped), the cached launch that the launcher uses (`gem_kernels._launch`), and the argument
checks alone; then the event-to-event time of each in a loop (what
`bench.table` sees); then a cProfile of the public call.

The public call takes the eager fast path from its second call with a signature
(`gem_kernels._block._Plan`): "public block_attention" times that path, "public, first call
of a signature" the ordinary one (every check, then a new plan), and "plan's DirectLaunch" the
plan's launch alone (pointers as ints, no runner closure).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from collections.abc import Callable

import torch

from gem_kernels import _block, block_attention
from gem_kernels._block import _BlockFunction, _launch_common, _launchers, block_forward_triton
from gem_kernels._jagged import check_jagged, check_offsets
from gem_kernels._triton_block import _block_fwd_kernel
from gem_kernels.bench._common import bench_ms, host_us, issue_lengths, offsets_from_lengths


def _checks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, off: torch.Tensor, mx: int) -> None:
    check_jagged({"q": q, "k": k, "v": v})
    check_offsets(off, "offsets", total=q.shape[0], max_len=mx, max_len_name="max_len")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    lengths = issue_lengths()
    off = offsets_from_lengths(lengths, "cuda")
    mx = max(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), 4, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    scale = 128 ** -0.5
    out = torch.empty_like(q)
    grid, meta = _launch_common(q, off, mx, 64)
    kargs = (q, k, v, out, q, q, off, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
             out.stride(0), out.stride(1), 0, scale, len(lengths), 4)
    ck = _block_fwd_kernel[grid](*kargs, **meta)
    consts = {k_: v_ for k_, v_ in meta.items() if k_ not in ("num_warps", "num_stages")}
    names = list(_block_fwd_kernel.arg_names)
    full = list(kargs) + [consts[n] for n in names[len(kargs):]]
    runner = ck[(grid[0], 1, 1) if len(grid) == 1 else (grid[0], grid[1], 1)]
    ref = block_attention(q, k, v, off, mx, block_size=64)
    runner(*full)
    torch.cuda.synchronize()
    assert torch.equal(out, ref), "the compiled runner's output differs from the public call's"

    served = block_attention(q, k, v, off, mx, block_size=64)  # a second call: served by a plan
    torch.cuda.synchronize()
    assert torch.equal(served, ref), "the plan's output differs from the ordinary path's"
    (plan,) = _block._PLANS.values()
    direct = plan.direct
    assert direct is not None, "the plan has no direct launch (a launch hook set?)"
    ptrs = tuple(x.data_ptr() for x in kargs[:7])
    grid3 = (grid[0], grid[1] if len(grid) > 1 else 1, 1)

    def first_call() -> object:
        _block._PLANS.clear()
        return block_attention(q, k, v, off, mx, block_size=64)

    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    cases: dict[str, Callable[[], object]] = {
        "public block_attention": lambda: block_attention(q, k, v, off, mx, block_size=64),
        "public, inputs requiring grad": lambda: block_attention(qg, kg, vg, off, mx, block_size=64),
        "public, first call of a signature": first_call,
        "plan's DirectLaunch": lambda: direct(grid3, ptrs + kargs[7:]),
        "autograd.Function.apply": lambda: _BlockFunction.apply(  # type: ignore[no-untyped-call]
            q, k, v, off, mx, 64, None, None, scale),
        "launcher block_forward_triton": lambda: block_forward_triton(q, k, v, off, mx, 64, None, None, scale),
        "kernel[grid](...)": lambda: _block_fwd_kernel[grid](*kargs, **meta),
        "cached launch (gem_kernels._launch)": lambda: _launchers()[0](grid, kargs, meta),
        "compiled runner": lambda: runner(*full),
        "checks only": lambda: _checks(q, k, v, off, mx),
        "empty_like only": lambda: torch.empty_like(q),
        "_launch_common only": lambda: _launch_common(q, off, mx, 64),
    }
    rows = []
    for name, fn in cases.items():
        h = host_us(fn, args.calls, warmup=5)
        ev = bench_ms(fn, warmup=3, iters=50) * 1e3
        rows.append((name, h, ev))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        block_attention(q, k, v, off, mx, block_size=64)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
    print(s.getvalue())
    print(f"{'layer':34s} {'host us/call':>12s} {'event us/call':>13s}")
    for name, h, ev in rows:
        print(f"{name:34s} {h:12.1f} {ev:13.1f}")


if __name__ == "__main__":
    main()
