"""BlockAttention(64) launch layouts on issue 15's batch, beside a copy of the same bytes (GPU).

    python3 tools/sweep_block.py [--iters N]      (repo root, module dirs on PYTHONPATH)

For each layout (2-D (block, head) grid or heads-inner 1-D grid, x warps) it times the forward
and forward+backward three ways: the public call (what the module bench times: argument
checks, autograd, launch), the bare launcher, and the public call replayed from a CUDA graph
(the device time alone). Each layout's output is checked against the default layout's.
Bytes: forward q, k, v read + out written; forward+backward 11 x T*H*D*2.
"""

from __future__ import annotations

import argparse
import json

import torch

from gem_kernels import _block, block_attention
from gem_kernels.bench._common import bench_graph_ms, bench_ms, env_info, issue_lengths, offsets_from_lengths

H, D, BS = 4, 128, 64


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tools/sweep_block.py needs a CUDA GPU")
    lengths = issue_lengths()
    off = offsets_from_lengths(lengths, "cuda")
    mx, t = max(lengths), sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(t, H, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    fwd_bytes = 4 * q.numel() * q.element_size()
    all_bytes = 11 * q.numel() * q.element_size()
    src = torch.empty(fwd_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src), iters=args.iters)
    copy_graph = bench_graph_ms(lambda: dst.copy_(src), iters=args.iters)
    want = block_attention(q, k, v, off, mx, block_size=BS)
    rows = []
    default = dict(_block.LAUNCH)
    for inner in (False, True):
        for warps in (4, 8):
            for warps_bwd in (4, 8):
                if warps_bwd != warps and not inner:
                    continue
                _block.LAUNCH.update(heads_inner=inner, heads_inner_bwd=inner, num_warps=warps, num_warps_bwd=warps_bwd)
                try:
                    got = block_attention(q, k, v, off, mx, block_size=BS)
                    same = bool(torch.equal(got, want))

                    def fwd() -> object:
                        return block_attention(q, k, v, off, mx, block_size=BS)

                    def bare() -> object:
                        return _block.block_forward_triton(q, k, v, off, mx, BS, None, None, D ** -0.5)

                    def both() -> None:
                        out = block_attention(qg, kg, vg, off, mx, block_size=BS)
                        torch.autograd.grad(out, (qg, kg, vg), do)

                    f, fb, fg = bench_ms(fwd, iters=args.iters), bench_ms(bare, iters=args.iters), bench_graph_ms(fwd, iters=args.iters)
                    a, ag = bench_ms(both, iters=args.iters), bench_graph_ms(both, iters=args.iters)
                finally:
                    _block.LAUNCH.update(default)
                tb = lambda nb, ms: None if ms is None else round(nb / (ms * 1e-3) / 1e12, 3)  # noqa: E731
                rows.append({"layout": "heads-inner" if inner else "2-D", "warps": warps, "warps_bwd": warps_bwd,
                             "same_as_default": same, "fwd_ms": round(f, 4), "fwd_TBps": tb(fwd_bytes, f),
                             "fwd_bare_TBps": tb(fwd_bytes, fb), "fwd_graph_TBps": tb(fwd_bytes, fg),
                             "fwd_pct_copy": round(100 * copy_ms / f, 1),
                             "all_ms": round(a, 4), "all_TBps": tb(all_bytes, a), "all_graph_TBps": tb(all_bytes, ag)})
                print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"env": env_info(), "tokens": t, "copy_ms": copy_ms, "copy_TBps": fwd_bytes / (copy_ms * 1e-3) / 1e12,
                      "copy_graph_TBps": None if copy_graph is None else fwd_bytes / (copy_graph * 1e-3) / 1e12}))
    print(f"\nBlockAttention(64) fwd, T={t} H={H} D={D}; copy {fwd_bytes / (copy_ms * 1e-3) / 1e12:.2f} TB/s "
          f"(graph {0 if copy_graph is None else fwd_bytes / (copy_graph * 1e-3) / 1e12:.2f})")
    print(f"{'layout':<12}{'w':>3}{'wb':>3}{'same':>6}{'fwd TB/s':>10}{'bare':>7}{'graph':>7}{'% copy':>8}{'f+b TB/s':>10}{'graph':>7}")
    for r in rows:
        print(f"{r['layout']:<12}{r['warps']:>3}{r['warps_bwd']:>3}{str(r['same_as_default']):>6}{r['fwd_TBps']:>10}"
              f"{r['fwd_bare_TBps']:>7}{str(r['fwd_graph_TBps']):>7}{r['fwd_pct_copy']:>8}{r['all_TBps']:>10}{str(r['all_graph_TBps']):>7}")


if __name__ == "__main__":
    main()
