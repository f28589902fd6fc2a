"""Bench: the TMA / warp-specialized JFA forward vs `jfa_forward` and cuDNN (GPU only).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.fwd_tma [--out FILE] [--iters N]
        [--configs NAME,NAME] [--cases PREFIX,PREFIX] [--ws-sweep]

Why: `_triton_jfa_tma.jfa_forward_tma` is opt-in until measured. This prints useful TFLOP/s
(4 * visible pairs * D * H / time; `table.py`'s FLOP helpers) of the pointer forward
`jfa_forward` (its heuristic tiles) and of `jfa_forward_tma` with its heuristic and every
config of `TILES` (which pairs the same tiles with warp specialization on and off; with
`--ws-sweep` every config's WS-flipped twin is added too, ~2x the compile time), on
the issue batch (seed 62, H=4) full and causal, the trainer batch (`table.trainer_lengths()`,
H=8) full, and dense 8 x 4096 H=16 full (8 equal lengths), plus cuDNN SDPA on the dense case.
err = max |out - jfa_forward's out| (bf16). ws_ir: whether the compiled TTGIR holds a
`ttg.warp_specialize` op (the automatic pass may decline a loop silently); regs / smem: the
compiled kernel's registers per thread and shared memory bytes. A config that fails (shared
memory, a compiler pass, Triton 3.6 lacking an API) prints its error and the rest run on.
Timing: eager calls, warm-up, CUDA events, median (`_common.bench_ms`). Most of the wall
time is compiling (20 kernels by default, first_call_s per row); `--configs` / `--cases` trim.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import torch

from gem_kernels._triton_jfa import jfa_forward
from gem_kernels._triton_jfa_tma import TILES, TmaTiles, jfa_forward_tma, last_compiled, pick_tiles, tma_fallback_reason
from gem_kernels.bench._common import (attention_flops, bench_ms, emit_json, env_info, issue_lengths,
                                       offsets_from_lengths, print_table, save_json, tflops, trainer_lengths,
                                       visible_pairs)

D = 128
DT = torch.bfloat16


@dataclasses.dataclass
class Case:
    name: str
    lengths: list[int]
    heads: int
    causal: bool


def _cases() -> list[Case]:
    return [
        Case("issue H=4 full", issue_lengths(), 4, False),
        Case("issue H=4 causal", issue_lengths(), 4, True),
        Case("trainer H=8 full", trainer_lengths(), 8, False),
        Case("dense 8x4096 H=16 full", [4096] * 8, 16, False),
    ]


def _compiled_info() -> dict[str, object]:
    k = last_compiled()
    if k is None:
        return {"ws_ir": None, "regs": None, "smem": None}
    try:
        ttgir = k.asm.get("ttgir", "") if hasattr(k.asm, "get") else ""
        meta = k.metadata
        return {"ws_ir": "ttg.warp_specialize" in ttgir, "regs": getattr(k, "n_regs", None),
                "smem": getattr(meta, "shared", None)}
    except Exception as e:  # noqa: BLE001 - introspection only
        return {"ws_ir": f"? {type(e).__name__}", "regs": None, "smem": None}


def _variants(names: list[str] | None, ws_sweep: bool) -> list[tuple[str, TmaTiles | None]]:
    """(label, tiles) to time: the heuristic (None), then each chosen config and, with
    `ws_sweep`, its twin with warp specialization flipped (skipped when that twin is itself a
    listed config)."""
    chosen = [TILES[n] for n in (names if names is not None else list(TILES))]
    out: list[tuple[str, TmaTiles | None]] = [("tma heuristic", None)]
    seen: set[TmaTiles] = set()
    for t in chosen:
        for cand in ([t, dataclasses.replace(t, ws=not t.ws)] if ws_sweep else [t]):
            if cand not in seen:
                seen.add(cand)
                out.append((f"tma {cand.name}", cand))
    return out


def run_case(case: Case, variants: list[tuple[str, TmaTiles | None]], iters: int,
             device: str = "cuda") -> list[dict[str, object]]:
    """One case's rows; `device="cpu"` (under TRITON_INTERPRET=1) is a dry run of the logic."""
    cuda = device == "cuda"
    lengths, h = case.lengths, case.heads
    off = offsets_from_lengths(lengths, device)
    mx = max(lengths)
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), h, D, generator=g, device=device).to(DT) for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    flops = attention_flops(visible_pairs(lengths, lengths, causal=case.causal), h, D)[0]
    args = (q, k, v, off, off, mx, mx, case.causal, None, scale)
    print(f"{case.name}: B={len(lengths)} tokens={sum(lengths)} max={mx}", flush=True)
    rows: list[dict[str, object]] = []

    def add(path: str, ms: float | None, err: float | None, **extra: object) -> None:
        rows.append({"case": case.name, "path": path, "ms": ms, "tflops": tflops(flops, ms), "err": err, **extra})
        print(rows[-1], flush=True)

    with torch.no_grad():
        base, _ = jfa_forward(*args)
        add("jfa_forward (pointer)", bench_ms(lambda: jfa_forward(*args), warmup=2, iters=iters), 0.0)
        for label, tiles in variants:
            t0 = time.perf_counter()
            try:
                resolved = tiles if tiles is not None else pick_tiles(mx, mx, D, DT)
                why = tma_fallback_reason(q, k, v, torch.empty_like(q), resolved)
                if why is not None:
                    raise RuntimeError(f"would fall back: {why}")
                out, _ = jfa_forward_tma(*args, tiles=tiles)  # compiles
                if cuda:
                    torch.cuda.synchronize()
                info = _compiled_info()
                err = float((out.float() - base.float()).abs().max())

                def fn(tiles: TmaTiles | None = tiles) -> object:
                    return jfa_forward_tma(*args, tiles=tiles)

                ms = bench_ms(fn, warmup=2, iters=iters)
                add(label, ms, err, first_call_s=round(time.perf_counter() - t0, 1), **info)
            except Exception as e:  # noqa: BLE001 - one failing config must not stop the sweep
                add(label, None, None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                if cuda:
                    torch.cuda.synchronize()
        if cuda and case.name.startswith("dense"):
            add("cuDNN SDPA (dense)", *_cudnn(q, k, v, len(lengths), lengths[0], h, base, iters))
    del q, k, v, base
    if cuda:
        torch.cuda.empty_cache()
    return rows


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int, n: int, h: int, base: torch.Tensor,
           iters: int) -> tuple[float | None, float | None]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        qp, kp, vp = (x.view(b, n, h, D).transpose(1, 2).contiguous() for x in (q, k, v))

        def fn() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qp, kp, vp)

        out = fn().transpose(1, 2).reshape(b * n, h, D)
        return bench_ms(fn, warmup=2, iters=iters), float((out.float() - base.float()).abs().max())
    except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
        print(f"cuDNN SDPA failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None, None


def print_summary(rows: list[dict[str, object]]) -> None:
    print("\nJFA forward, pointer vs TMA (useful TFLOP/s = 4 * visible pairs * D * H / time; err = max |out - "
          "jfa_forward out|; ws_ir = TTGIR has ttg.warp_specialize):")
    print_table(rows, ["case", "path", "tflops", "ms", "err", "ws_ir", "regs", "smem", "error"])
    print("\nfastest TMA config per case (x = vs jfa_forward):")
    for case in dict.fromkeys(str(r["case"]) for r in rows):
        rs = [r for r in rows if r["case"] == case]
        base = next((r for r in rs if str(r["path"]).startswith("jfa_forward")), None)
        tma = [r for r in rs if str(r["path"]).startswith("tma") and isinstance(r["ms"], float)]
        if not tma or base is None or not isinstance(base["ms"], float):
            print(f"  {case}: no TMA config ran")
            continue
        best = min(tma, key=lambda r: float(r["ms"]))  # type: ignore[arg-type]
        print(f"  {case}: {best['path']}  {float(best['tflops']):.0f} TFLOP/s  "  # type: ignore[arg-type]
              f"{float(base['ms']) / float(best['ms']):.2f}x")  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=10, help="timed iterations per figure (median)")
    p.add_argument("--configs", default="", help=f"comma-separated TILES names (default all): {', '.join(TILES)}")
    p.add_argument("--ws-sweep", action="store_true", help="also time each config with warp specialization flipped")
    p.add_argument("--cases", default="", help="comma-separated case-name prefixes (default all)")
    p.add_argument("--out", default="", help="write the JSON payload to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fwd_tma bench needs CUDA")
        emit_json({"bench": "fwd_tma", "skipped": "no CUDA", **env_info()})
        return
    names = [n.strip() for n in args.configs.split(",") if n.strip()] or None
    for n in names or []:
        if n not in TILES:
            raise SystemExit(f"--configs: {n!r} is not one of {list(TILES)}")
    variants = _variants(names, args.ws_sweep)
    prefixes = [c.strip() for c in args.cases.split(",") if c.strip()]
    cases = [c for c in _cases() if not prefixes or any(c.name.startswith(x) for x in prefixes)]
    cap = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} sm{cap[0]}{cap[1]}; {len(variants)} TMA variants x {len(cases)} cases",
          flush=True)
    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    for case in cases:
        rows += run_case(case, variants, args.iters)
    print_summary(rows)
    payload: dict[str, object] = {"bench": "fwd_tma", **env_info(), "wall_s": round(time.perf_counter() - t0, 1),
                                  "rows": rows}
    if args.out:  # a file path here
        save_json(os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out), payload)
    emit_json(payload)


if __name__ == "__main__":
    main()
