"""Bench: the JFA backward paths side by side, on the issue batch, the trainer's batch and a
length-mix sweep.

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.bwd [--iters N] [--out DIR]

Why: `jfa_backward` can run our two-pass Triton backward, our one-pass one (dQ by atomics), or
torch's FlashAttention-2 varlen backward fed with our forward's output and lse
(`gem_kernels._flash2`; the default where it runs until gem-kernels 0.3.9, which went back to
ours after this bench measured two-pass faster). The forward is ours throughout
(`GEM_JFA_FWD=pointer` is set for the run: on short mixes the default forward is
FlashAttention-2's, which the `fa2` columns time on their own). This bench times each in the same run,
next to torch's own FlashAttention-2 forward+backward (`aten._flash_attention_forward` with
cu_seqlens, the best torch path for jagged softmax attention), so the default's pick is a
measurement. Forward+backward is timed whole (eager calls, warm-up, CUDA events, median); the
backward column is that minus our forward alone. Useful FLOPs: 4 * visible pairs * D * H
forward, x3.5 forward+backward. `err` = the largest relative difference of flash's out/dq/dk/dv
from our two-pass path's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable

import torch

from gem_kernels import jagged_flash_attention
from gem_kernels._jfa import FWD_ENV
from gem_kernels._triton_jfa import BWD_ENV
from gem_kernels.bench._common import (bench_ms, emit_json, env_info, issue_lengths, offsets_from_lengths, print_table,
                                       rel_err, save_json, trainer_lengths, visible_pairs)

D = 128
DT = torch.bfloat16
PATHS = ("two_pass", "one_pass", "flash")


def _case(name: str, lengths: list[int], heads: int, causal: bool, iters: int,
          q_lengths: list[int] | None = None) -> dict[str, object]:
    """`lengths` are the keys' (and, without `q_lengths`, the queries') per-sample lengths."""
    ql = lengths if q_lengths is None else q_lengths
    off, q_off = offsets_from_lengths(lengths, "cuda"), offsets_from_lengths(ql, "cuda")
    cu, q_cu = off.to(torch.int32), q_off.to(torch.int32)
    mx, t, q_mx = max(lengths), sum(lengths), max(ql)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, do = (torch.randn(sum(ql), heads, D, generator=g, device="cuda").to(DT) for _ in range(2))
    k, v = (torch.randn(t, heads, D, generator=g, device="cuda").to(DT) for _ in range(2))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    xq, xk, xv = xs
    flops = 4.0 * visible_pairs(ql, lengths, causal=causal) * D * heads

    def ours() -> torch.Tensor:
        return jagged_flash_attention(xq, xk, xv, q_off, off, q_mx, mx, causal=causal)

    def fa2() -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._flash_attention_forward(xq, xk, xv, q_cu, cu, q_mx, mx, 0.0, causal,
                                                                    False, scale=1 / math.sqrt(D))[0]
        return out

    def fb(fn: Callable[[], torch.Tensor]) -> Callable[[], object]:
        return lambda: torch.autograd.grad(fn(), xs, do)

    with torch.no_grad():
        fwd_ms = bench_ms(ours, warmup=2, iters=iters)
    row: dict[str, object] = {"case": name, "B": len(lengths), "q_mean": round(sum(ql) / len(ql)),
                              "mean": round(t / len(lengths)), "max": mx,
                              "H": heads, "causal": causal, "fwd_ms": round(fwd_ms, 3)}
    grads: dict[str, list[torch.Tensor]] = {}
    was = os.environ.get(BWD_ENV)
    try:
        for path in PATHS:
            os.environ[BWD_ENV] = path
            ms = bench_ms(fb(ours), warmup=2, iters=iters)
            row[f"{path}_bwd_ms"] = round(ms - fwd_ms, 3)
            row[f"{path}_fb_tf"] = round(3.5 * flops / ms / 1e9, 1)
            o = ours()
            grads[path] = [o.detach(), *torch.autograd.grad(o, xs, do)]
    finally:
        if was is None:
            os.environ.pop(BWD_ENV, None)
        else:
            os.environ[BWD_ENV] = was
    with torch.no_grad():
        fa2_fwd = bench_ms(fa2, warmup=2, iters=iters)
    fa2_fb = bench_ms(fb(fa2), warmup=2, iters=iters)
    row["fa2_fwd_tf"] = round(flops / fa2_fwd / 1e9, 1)
    row["fa2_fb_tf"] = round(3.5 * flops / fa2_fb / 1e9, 1)
    row["ours_fwd_tf"] = round(flops / fwd_ms / 1e9, 1)
    row["err"] = f"{max(rel_err(a, b) for a, b in zip(grads['flash'], grads['two_pass'])):.1e}"
    row["win"] = min(PATHS, key=lambda p: float(row[f"{p}_bwd_ms"]))  # type: ignore[arg-type]
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = p.parse_args()
    os.environ[FWD_ENV] = "pointer"
    if not torch.cuda.is_available():
        print("bwd bench needs CUDA")
        emit_json({"bench": "bwd", "skipped": "no CUDA", **env_info()})
        return
    tl = trainer_lengths()
    cases: list[tuple[str, list[int], int, bool, list[int] | None]] = [
        ("issue", issue_lengths(), 4, False, None),
        ("issue causal", issue_lengths(), 4, True, None),
        ("trainer+cls", [n + 4 for n in tl], 8, False, None),
        # The trainer's hierarchical pooling (PMA): 32 seed queries per sample over its events.
        ("trainer pma", tl, 8, False, [32] * len(tl)),
    ]
    for mean in (100, 300, 1000, 4000):  # LogNormal(log mean - 0.5, 1) at the trainer's ~262k tokens
        lengths = issue_lengths(max(8, 262144 // mean), mu=math.log(mean) - 0.5, seed=62)
        cases.append((f"mix {mean}", lengths, 8, False, None))
        if mean <= 1000:  # causal where the forward rule (FLASH_FWD_MAX_MEAN) decides
            cases.append((f"mix {mean} causal", lengths, 8, True, None))
    rows = [_case(name, lengths, heads, causal, args.iters, q_lengths=ql)
            for name, lengths, heads, causal, ql in cases if args.only in name]
    print("\nJFA backward paths (bwd ms = fwd+bwd - our fwd; fb TF = useful fwd+bwd TFLOP/s; "
          "fa2 = torch's FlashAttention-2 fwd / fwd+bwd):")
    print_table(rows, ["case", "B", "q_mean", "mean", "max", "H", "fwd_ms", "two_pass_bwd_ms", "one_pass_bwd_ms",
                       "flash_bwd_ms", "win", "ours_fwd_tf", "flash_fb_tf", "fa2_fwd_tf", "fa2_fb_tf", "err"])
    payload: dict[str, object] = {"bench": "bwd", **env_info(), "rows": rows}
    save_json(args.out, "bwd.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
