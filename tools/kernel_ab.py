"""Times our Triton attention kernels in whichever `gem_kernels` comes first on PYTHONPATH, for
an A/B of two trees run as alternating processes (a kernel change cannot be switched inside
one process: Triton compiles the source it finds).

    python3 tools/kernel_ab.py --tag new > new1.log       # tree A first on PYTHONPATH
    python3 tools/kernel_ab.py --tag old > old1.log       # tree B first
    python3 tools/kernel_ab.py --summarize new1.log old1.log new2.log old2.log

Cases (bf16, D=128, eager calls, CUDA events, median of `--iters` after 3 warm-ups): issue 15's
batch (64 log-normal lengths, seed 62, H=4) for JFA forward full / causal with our forward
(`GEM_JFA_FWD=pointer`), JFA forward+backward with our two-pass and one-pass backwards
(`GEM_JFA_BWD`), GDPA SiLU causal forward and forward+backward (two-pass and one-pass,
`GEM_GDPA_BWD`); the trainer's token budget of lengths (H=8) for GDPA's FFN shape (32 keys per
sample: the short-kv kernels) and JFA's causal forward; and the pooling shape (32 queries per
sample over those lengths, H=8). Each run prints one JSON line
per case (useful TFLOP/s = 4 · visible pairs · D · H forward, x3.5 forward+backward) and a
checksum of the outputs, so two trees' rows can be compared for values too. `--summarize`
prints, per case, each tag's median over its runs and the ratio of the first tag to the second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable

import torch

D = 128


def run(tag: str, iters: int, only: list[str] | None = None) -> None:
    from gem_kernels import generalized_dot_product_attention, jagged_flash_attention
    from gem_kernels.bench._common import bench_ms, issue_lengths, offsets_from_lengths, trainer_lengths, visible_pairs

    def env(**kw: str) -> None:
        for k in ("GEM_JFA_FWD", "GEM_JFA_BWD", "GEM_GDPA_BWD"):
            os.environ.pop(k, None)
        os.environ.update(kw)

    def tensors(lq: list[int], lk: list[int], heads: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, do = (torch.randn(sum(lq), heads, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(sum(lk), heads, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do

    def case(name: str, lq: list[int], lk: list[int], heads: int, causal: bool, op: str, bwd: bool,
             switches: dict[str, str]) -> None:
        if only and not any(o in name for o in only):
            return
        env(**switches)
        q, k, v, do = tensors(lq, lk, heads)
        qo, ko = offsets_from_lengths(lq, "cuda"), offsets_from_lengths(lk, "cuda")

        def call() -> torch.Tensor:
            if op == "jfa":
                return jagged_flash_attention(q, k, v, qo, ko, max(lq), max(lk), causal=causal)
            return generalized_dot_product_attention(q, k, v, qo, ko, max(lq), max(lk), activation="silu",
                                                     causal=causal)

        fn: Callable[[], object]
        if bwd:
            def fn() -> object:
                return torch.autograd.grad(call(), (q, k, v), do)
        else:
            def fn() -> object:
                with torch.no_grad():
                    return call()
        ms = bench_ms(fn, iters=iters)
        outs = fn()
        sums = [float(x.float().abs().sum()) for x in (outs if isinstance(outs, tuple) else (outs,))]
        flops = 4.0 * visible_pairs(lq, lk, causal=causal) * D * heads * (3.5 if bwd else 1.0)
        print(json.dumps({"tag": tag, "case": name, "ms": ms, "tflops": flops / ms / 1e9, "abs_sums": sums}),
              flush=True)
        env()

    issue = issue_lengths()
    trainer = trainer_lengths()
    for causal in (False, True):
        c = "causal" if causal else "full"
        case(f"jfa fwd {c}, issue", issue, issue, 4, causal, "jfa", False, {"GEM_JFA_FWD": "pointer"})
        for b in ("two_pass", "one_pass"):
            case(f"jfa fwd+bwd {c} ({b}), issue", issue, issue, 4, causal, "jfa", True,
                 {"GEM_JFA_FWD": "pointer", "GEM_JFA_BWD": b})
    case("gdpa fwd causal, issue", issue, issue, 4, True, "gdpa", False, {})
    for b in ("two_pass", "one_pass"):
        case(f"gdpa fwd+bwd causal ({b}), issue", issue, issue, 4, True, "gdpa", True, {"GEM_GDPA_BWD": b})
    ffn_kv = [32] * len(trainer)  # the trainer's GDPA FFN: 32 keys per sample (the short-kv kernels)
    case("gdpa fwd, trainer FFN (32 kv) H=8", trainer, ffn_kv, 8, False, "gdpa", False, {})
    case("gdpa fwd+bwd, trainer FFN (32 kv) H=8", trainer, ffn_kv, 8, False, "gdpa", True, {})
    case("jfa fwd causal, trainer H=8", trainer, trainer, 8, True, "jfa", False, {"GEM_JFA_FWD": "pointer"})
    case("jfa fwd pooling (32 q), trainer H=8", [32] * len(trainer), trainer, 8, False, "jfa", False,
         {"GEM_JFA_FWD": "pointer"})


def summarize(paths: list[str]) -> None:
    rows = [json.loads(line) for p in paths for line in open(p) if line.startswith("{")]
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    print(f"{'case':44s} " + " ".join(f"{t + ' TF/s':>16s}" for t in tags) + "  ratio  sums equal")
    for c in cases:
        med = {}
        sums = {}
        for t in tags:
            xs = [r["tflops"] for r in rows if r["case"] == c and r["tag"] == t]
            med[t] = statistics.median(xs) if xs else float("nan")
            sums[t] = [r["abs_sums"] for r in rows if r["case"] == c and r["tag"] == t][:1]
        ratio = med[tags[0]] / med[tags[1]] if len(tags) > 1 and med[tags[1]] else float("nan")
        same = "-" if len(tags) < 2 else str(sums[tags[0]] == sums[tags[1]])
        runs = " ".join(f"{med[t]:16.1f}" for t in tags)
        print(f"{c:44s} {runs}  {ratio:5.3f}  {same}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--tag", default="run", help="the label of this tree's rows")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--summarize", nargs="+", metavar="LOG", help="summarize logs of earlier runs instead")
    p.add_argument("--only", nargs="+", metavar="TEXT", help="only the cases whose name contains one of these")
    args = p.parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
        return 0
    if not torch.cuda.is_available():
        print("kernel_ab needs CUDA", file=sys.stderr)
        return 2
    run(args.tag, args.iters, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
