"""Bench: FlashAttention-4's Hopper kernels (`gem_kernels._flash4`) beside the JFA default paths.

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.flash4 [--iters N] [--out DIR]

Needs the optional `flash-attn-4` package (`pip install gem-kernels[flash4]`); without it or
without CUDA it prints why and emits a JSON line saying so. Per case, in the same run: the
forward of ours (Triton, `GEM_JFA_FWD=pointer`), torch's FlashAttention-2 and FlashAttention-4;
forward+backward of the default without flash-attn-4 (our forward and the backward its rule
picks: one-pass for query sequences of at most 32 rows, else two-pass; until kernels 0.3.9
FlashAttention-2's backward), of FlashAttention-4 for both, and of
ours forward + FlashAttention-4's backward. Eager calls through `jagged_flash_attention`
(so the lse conversions are timed too), warm-up (FlashAttention-4 JIT-compiles on first use),
CUDA events, median. Useful FLOPs: 4 * visible pairs * D * H forward, x3.5 forward+backward;
bwd columns are fwd+bwd minus that path's forward. `err`: the largest relative difference
(to the largest magnitude) of FlashAttention-4's out/dq/dk/dv from the default path's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gem_kernels import jagged_flash_attention
from gem_kernels._flash4 import unavailable_reason
from gem_kernels._jfa import FWD_ENV
from gem_kernels._triton_jfa import BWD_ENV, bwd_one_pass_from_env
from gem_kernels.bench._common import (bench_ms, emit_json, env_info, issue_lengths, offsets_from_lengths, print_table,
                                       rel_err, save_json, trainer_lengths, visible_pairs)

D = 128
DT = torch.bfloat16
# (forward switch, backward switch) per path. "default": what runs without flash-attn-4
# (kernels 0.3.9: our forward, and the backward the rule picks: one-pass where every query
# sequence has at most ONE_PASS_MAX_Q_LEN rows, two-pass otherwise; `_backward_of`).
# `GEM_JFA_BWD=flash` is FlashAttention-2's backward.
PATHS = {"default": ("pointer", "rule"), "fa4": ("flash4", "flash4"), "ours+fa4bwd": ("pointer", "flash4")}


def _backward_of(bwd: str, q_max_len: int) -> str:
    """A path's backward switch for a case: "rule" is the one of ours the default rule
    (`bwd_one_pass_from_env` with `GEM_JFA_BWD` unset) picks for it."""
    if bwd != "rule":
        return bwd
    with switches("pointer", ""):
        return "one_pass" if bwd_one_pass_from_env(q_max_len) else "two_pass"


@contextmanager
def switches(fwd: str, bwd: str) -> Iterator[None]:
    """`GEM_JFA_FWD=fwd`, `GEM_JFA_BWD=bwd` inside the block (restored after)."""
    was = {n: os.environ.get(n) for n in (FWD_ENV, BWD_ENV)}
    os.environ[FWD_ENV], os.environ[BWD_ENV] = fwd, bwd
    try:
        yield
    finally:
        for n, v in was.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def _case(name: str, lengths: list[int], heads: int, causal: bool, iters: int,
          q_lengths: list[int] | None = None) -> dict[str, object]:
    ql = lengths if q_lengths is None else q_lengths
    off, q_off = offsets_from_lengths(lengths, "cuda"), offsets_from_lengths(ql, "cuda")
    mx, t, q_mx = max(lengths), sum(lengths), max(ql)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, do = (torch.randn(sum(ql), heads, D, generator=g, device="cuda").to(DT) for _ in range(2))
    k, v = (torch.randn(t, heads, D, generator=g, device="cuda").to(DT) for _ in range(2))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    flops = 4.0 * visible_pairs(ql, lengths, causal=causal) * D * heads

    def run() -> torch.Tensor:
        return jagged_flash_attention(xs[0], xs[1], xs[2], q_off, off, q_mx, mx, causal=causal)

    def fb() -> object:
        return torch.autograd.grad(run(), xs, do)

    row: dict[str, object] = {"case": name, "B": len(lengths), "q_mean": round(sum(ql) / len(ql)),
                              "mean": round(t / len(lengths)), "max": mx, "H": heads, "causal": causal}
    res: dict[str, list[torch.Tensor]] = {}
    fwd_ms: dict[str, float] = {}
    for path, (fwd, bwd) in PATHS.items():
        with switches(fwd, _backward_of(bwd, q_mx)):
            if fwd not in fwd_ms:
                with torch.no_grad():
                    fwd_ms[fwd] = bench_ms(run, warmup=2, iters=iters)
            ms = bench_ms(fb, warmup=2, iters=iters)
            row[f"{path}_bwd_ms"] = round(ms - fwd_ms[fwd], 3)
            row[f"{path}_fb_tf"] = round(3.5 * flops / ms / 1e9, 1)
            o = run()
            res[path] = [o.detach(), *torch.autograd.grad(o, xs, do)]
    with switches("flash", "flash"):  # torch's FlashAttention-2 forward alone (where it runs)
        with torch.no_grad():
            fwd_ms["flash"] = bench_ms(run, warmup=2, iters=iters)
    for fwd, label in (("pointer", "ours"), ("flash", "fa2"), ("flash4", "fa4")):
        row[f"{label}_fwd_tf"] = round(flops / fwd_ms[fwd] / 1e9, 1)
    row["err"] = f"{max(rel_err(a, b) for a, b in zip(res['fa4'], res['default'])):.1e}"
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = p.parse_args()
    why = "no CUDA" if not torch.cuda.is_available() else unavailable_reason(
        torch.zeros(1, 1, D, dtype=DT, device="cuda"), None)
    if why is not None:
        print(f"flash4 bench: {why}")
        emit_json({"bench": "flash4", "skipped": why, **env_info()})
        return
    tl = trainer_lengths()
    cases: list[tuple[str, list[int], int, bool, list[int] | None]] = [
        ("issue", issue_lengths(), 4, False, None),
        ("issue causal", issue_lengths(), 4, True, None),
        ("trainer+cls", [n + 4 for n in tl], 8, False, None),
        ("trainer pma", tl, 8, False, [32] * len(tl)),
    ]
    for mean in (100, 300, 1000, 4000):
        lengths = issue_lengths(max(8, 262144 // mean), mu=math.log(mean) - 0.5, seed=62)
        cases.append((f"mix {mean}", lengths, 8, False, None))
    rows = [_case(name, lengths, heads, causal, args.iters, q_lengths=ql)
            for name, lengths, heads, causal, ql in cases if args.only in name]
    print("\nFlashAttention-4 beside the JFA default (fwd TF = useful forward TFLOP/s; fb TF = forward+backward; "
          "bwd ms = fwd+bwd - that path's forward):")
    cols: list[str] = ["case", "B", "mean", "max", "H", "causal", "ours_fwd_tf", "fa2_fwd_tf", "fa4_fwd_tf"]
    cols += [f"{p}_{c}" for c in ("bwd_ms", "fb_tf") for p in PATHS] + ["err"]
    print_table(rows, cols)
    payload: dict[str, object] = {"bench": "flash4", **env_info(), "rows": rows}
    save_json(args.out, "flash4.json", payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
