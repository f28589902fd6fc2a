"""Bench: the order programs take tiles in, and the tiles, on issue 15's batch (GPU).

    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.schedule [--iters N] [--out DIR]
    cd kernels && PYTHONPATH=. python3 -m gem_kernels.bench.schedule --jfa-ab 7 --gdpa-ab 7   # interleaved A/Bs only
    ... --gdpa-bwd-ab 5   # GDPA's backward only: two-pass vs one-pass (dQ by atomics) tiles

GDPA SiLU causal (long kv) forward and forward+backward with each `GdpaTiles.schedule`
(`in_order`, the default, timed first and last for the run's spread; `grid` / `list`: heaviest
first), every result checked bitwise against `in_order` and against the fp32 reference on
the first 8 samples; then forward and backward tile sweeps in batch order; then JFA (full
and causal) through the default path (FlashAttention-4's where installed, else the
mean-length rule's) beside our Triton forward and backward in the plain grid and in batch
order. The batch, timing and FLOP count are `bench.table`'s (eager calls, CUDA events,
median; useful FLOPs = 4 * visible pairs * D * H forward, x3.5 forward+backward). Table
last, then one JSON line (`schedule.json` under `--out`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from gem_kernels._gdpa import GdpaTiles, force_tiles, gdpa_tiles
from gem_kernels._triton_jfa import JfaConfig, JfaTiles, _heuristic_config, force_config
from gem_kernels.bench._common import (attention_flops, bench_ms, emit_json, env_info, issue_lengths,
                                       offsets_from_lengths, print_table, save_json, tflops, trainer_lengths,
                                       visible_pairs)
from gem_kernels.bench.table import DT, D, Batch, _check, _fwd, _fwd_bwd, _tiles, gdpa, jfa

KINDS = ("fwd", "dq", "dkdv")
SWEEP = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (128, 32, 4, 3), (128, 64, 4, 3),
         (64, 64, 4, 3), (64, 128, 4, 3), (64, 32, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 64, 8, 3)]
# (dq, dkdv) tiles: (block_m, block_n, warps, stages); the first is the default.
BWD_SWEEP = [((64, 32, 4, 3), (32, 64, 4, 3)), ((64, 64, 4, 3), (64, 64, 4, 3)), ((64, 32, 4, 2), (32, 64, 4, 2)),
             ((64, 32, 4, 3), (32, 128, 4, 3)), ((128, 32, 8, 3), (32, 128, 8, 3)), ((64, 64, 4, 3), (32, 64, 4, 3))]


def _gdpa_tiles(b: Batch, schedule: str, fwd: tuple[int, int, int, int] | None = None) -> dict[str, GdpaTiles]:
    tiles = {kind: dataclasses.replace(gdpa_tiles(b.max, D, kind=kind), schedule=schedule) for kind in KINDS}
    if fwd is not None:
        bm, bn, w, st = fwd
        tiles["fwd"] = GdpaTiles(block_m=bm, block_n=bn, num_warps=w, num_stages=st, schedule=schedule)
    return tiles


def _jfa_cfg(b: Batch, schedule: str, fwd: tuple[int, int, int, int] | None = None) -> JfaConfig:
    """`schedule`: grid, list, in_order (all three kernels), in_order_bwd (the backward's only);
    a `_rev` suffix walks the q-side kernels' tiles last to first (`JfaConfig.reverse_q`)."""
    cfg = dataclasses.replace(_heuristic_config(b.max, b.max, D, b.q.dtype), tile_list=schedule == "list",
                              in_order=schedule.startswith("in_order"),
                              fwd_in_order=schedule in ("in_order", "in_order_rev"),
                              reverse_q=schedule.endswith("_rev"))
    if fwd is not None:
        bm, bn, w, st = fwd
        cfg = dataclasses.replace(cfg, fwd=JfaTiles(block_m=bm, block_n=bn, num_warps=w, num_stages=st))
    return cfg


def run(iters: int) -> list[dict[str, object]]:
    b = Batch(issue_lengths(), "cuda")
    small = b.head(8)
    f_fwd, f_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=True), b.heads, D)
    f_full, f_full_all = attention_flops(visible_pairs(b.lengths, b.lengths), b.heads, D)
    rows: list[dict[str, object]] = []

    def add(**row: object) -> None:
        rows.append(row)
        print(row, flush=True)

    def outputs(tiles: dict[str, GdpaTiles]) -> list[torch.Tensor]:
        with force_tiles(**tiles):
            out = gdpa()(b.qg, b.kg, b.vg, b)
            return [out.detach(), *torch.autograd.grad(out, (b.qg, b.kg, b.vg), b.do)]

    want = outputs(_gdpa_tiles(b, "in_order"))
    for schedule in ("in_order", "grid", "list", "in_order"):  # in_order twice: run-to-run spread
        tiles = _gdpa_tiles(b, schedule)
        same = all(torch.equal(x, y) for x, y in zip(outputs(tiles), want))
        with force_tiles(**tiles):
            err = _check(gdpa(), gdpa("reference"), small)
            ms_f = bench_ms(_fwd(gdpa(), b), iters=iters)
            ms_a = bench_ms(_fwd_bwd(gdpa(), b), iters=iters)
        add(case=f"GDPA silu causal, {schedule}", fwd_ms=ms_f, fwd_tf=tflops(f_fwd, ms_f), fb_ms=ms_a,
            fb_tf=tflops(f_all, ms_a), bits_as_in_order=same, err=err)
    for cfg in SWEEP:
        try:
            with force_tiles(**_gdpa_tiles(b, "in_order", cfg)):
                ms_f = bench_ms(_fwd(gdpa(), b), iters=iters)
                err = _check(gdpa(), gdpa("reference"), small)
        except Exception as e:  # a config that does not compile (shared memory) is a row, not a stop
            print(f"sweep {cfg}: failed {type(e).__name__}: {e}", flush=True)
            continue
        add(case=f"GDPA fwd in_order BM{cfg[0]} BN{cfg[1]} w{cfg[2]} s{cfg[3]}", fwd_ms=ms_f, fwd_tf=tflops(f_fwd, ms_f),
            err=err)
    for dq, dkdv in BWD_SWEEP:
        tiles = _gdpa_tiles(b, "in_order")
        tiles["dq"] = GdpaTiles(block_m=dq[0], block_n=dq[1], num_warps=dq[2], num_stages=dq[3])
        tiles["dkdv"] = GdpaTiles(block_m=dkdv[0], block_n=dkdv[1], num_warps=dkdv[2], num_stages=dkdv[3])
        try:
            with force_tiles(**tiles):
                ms_a = bench_ms(_fwd_bwd(gdpa(), b), iters=iters)
                err = _check(gdpa(), gdpa("reference"), small)
        except Exception as e:
            print(f"bwd sweep {dq} {dkdv}: failed {type(e).__name__}: {e}", flush=True)
            continue
        add(case=f"GDPA fb in_order dq{dq} dkdv{dkdv}", fb_ms=ms_a, fb_tf=tflops(f_all, ms_a), err=err)
    for causal in (False, True):
        name = "causal" if causal else "full"
        flops, flops_all = (f_fwd, f_all) if causal else (f_full, f_full_all)
        ms = bench_ms(_fwd(jfa(causal), b), iters=iters)
        ms_a = bench_ms(_fwd_bwd(jfa(causal), b), iters=iters)
        add(case=f"JFA {name}, default path", fwd_ms=ms, fwd_tf=tflops(flops, ms), fb_ms=ms_a, fb_tf=tflops(flops_all, ms_a))
        for schedule, fwd in (("grid", None), ("in_order_bwd", None), ("in_order", None), ("in_order", (128, 64, 8, 3)),
                              ("in_order", (64, 64, 4, 3)), ("grid", None)):
            with force_config(_jfa_cfg(b, schedule, fwd)):
                ms = bench_ms(_fwd(jfa(causal), b), iters=iters)
                fb = bench_ms(_fwd_bwd(jfa(causal), b), iters=iters) if fwd is None else None
                err = _check(jfa(causal), jfa(causal, "reference"), small)
            label = "" if fwd is None else f" fwd BM{fwd[0]} BN{fwd[1]} w{fwd[2]} s{fwd[3]}"
            add(case=f"JFA {name}, ours (Triton fwd+bwd), {schedule}{label}", fwd_ms=ms, fwd_tf=tflops(flops, ms),
                fb_ms=fb, fb_tf=tflops(flops_all, fb), err=err)
    return rows


def _rounds_row(case: str, **figures: list[float]) -> dict[str, object]:
    """One A/B row: for each `name=[figure per round]`, `name` = the rounds' median and
    `<name minus _tf>_rounds` = every round's figure; printed as it is made."""
    row: dict[str, object] = {"case": case}
    for name, xs in figures.items():
        row[name] = sorted(xs)[len(xs) // 2]
        row[name.removesuffix("_tf") + "_rounds"] = " ".join(f"{x:.0f}" for x in xs)
    print(row, flush=True)
    return row


JFA_AB = ("grid", "in_order_bwd", "in_order_bwd_rev", "in_order", "in_order_rev")
GDPA_AB = ("in_order", "in_order_rev", "grid")


def interleaved_ab(op: str, iters: int, rounds: int) -> list[dict[str, object]]:
    """`op` "jfa": our Triton JFA in each of JFA_AB's orders (`_jfa_cfg`); "gdpa": GDPA SiLU
    causal in each of GDPA_AB's `GdpaTiles.schedule`s; interleaved over `rounds` rounds (the
    spread between eager runs is as large as the effects); rows give each round's figure and
    their median."""
    b = Batch(issue_lengths(), "cuda")
    rows: list[dict[str, object]] = []
    for causal in ((False, True) if op == "jfa" else (True,)):
        flops, flops_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=causal), b.heads, D)
        got: dict[str, tuple[list[float], list[float]]] = {}
        for _ in range(rounds):
            for schedule in (JFA_AB if op == "jfa" else GDPA_AB):
                ctx = force_config(_jfa_cfg(b, schedule)) if op == "jfa" else force_tiles(**_gdpa_tiles(b, schedule))
                fn = jfa(causal) if op == "jfa" else gdpa()
                with ctx:
                    f = tflops(flops, bench_ms(_fwd(fn, b), iters=iters))
                    fb = tflops(flops_all, bench_ms(_fwd_bwd(fn, b), iters=iters))
                tf, tfb = got.setdefault(schedule, ([], []))
                tf.append(f or 0.0)
                tfb.append(fb or 0.0)
        name = f"JFA {'causal' if causal else 'full'}, ours" if op == "jfa" else "GDPA silu causal"
        rows += [_rounds_row(f"{name}, {schedule}", fwd_tf=tf, fb_tf=tfb) for schedule, (tf, tfb) in got.items()]
    return rows


def pma_ab(iters: int, rounds: int) -> list[dict[str, object]]:
    """The trainer's pooling shape (32 seed queries per sample over its events, H=8; the JFA
    forward that stays ours where FlashAttention-4 runs the rest): our forward in the plain
    grid vs batch order, interleaved over `rounds` rounds."""
    from gem_kernels import jagged_flash_attention

    kv_len = trainer_lengths()
    q_len = [32] * len(kv_len)
    heads = 8
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(sum(q_len), heads, D, generator=g, device="cuda").to(DT)
    k, v = (torch.randn(sum(kv_len), heads, D, generator=g, device="cuda").to(DT) for _ in range(2))
    qo, ko = offsets_from_lengths(q_len, "cuda"), offsets_from_lengths(kv_len, "cuda")
    flops, _ = attention_flops(visible_pairs(q_len, kv_len), heads, D)
    got: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for in_order in (False, True):
            cfg = dataclasses.replace(_heuristic_config(32, max(kv_len), D, DT), fwd_in_order=in_order)
            with force_config(cfg), torch.no_grad():
                ms = bench_ms(lambda: jagged_flash_attention(q, k, v, qo, ko, 32, max(kv_len)), iters=iters)
            got[in_order].append(tflops(flops, ms) or 0.0)
    return [_rounds_row(f"JFA pooling fwd (32 q / sample, H=8), ours, {'in_order' if in_order else 'grid'}", fwd_tf=tf)
            for in_order, tf in got.items()]


def _fb_rounds(b: Batch, causal: bool, cfgs: list[JfaConfig], iters: int, rounds: int) -> list[list[float]]:
    """Fwd+bwd useful TFLOP/s of our JFA on `b` under each forced config, interleaved over
    `rounds` rounds: one list of per-round figures per config."""
    _, flops_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=causal), b.heads, D)
    got: list[list[float]] = [[] for _ in cfgs]
    for _ in range(rounds):
        for figures, cfg in zip(got, cfgs):
            with force_config(cfg):
                figures.append(tflops(flops_all, bench_ms(_fwd_bwd(jfa(causal), b), iters=iters)) or 0.0)
    return got


def onepass_ab(iters: int, rounds: int) -> list[dict[str, object]]:
    """The one-pass backward (dQ by fp32 atomics; the default from 4,096 keys where neither
    FlashAttention-4 nor torch's FlashAttention-2 backward runs) on the trainer's
    self-attention batch (H=8, its length law at ~262k tokens, 4 CLS tokens per sample): its
    dK/dV programs in the plain grid vs batch order, fwd+bwd, interleaved over `rounds` rounds."""
    b = Batch([n + 4 for n in trainer_lengths()], "cuda", heads=8)
    one = _heuristic_config(b.max, b.max, D, DT, True)
    orders = (False, True)
    got = _fb_rounds(b, False, [dataclasses.replace(one, in_order=o) for o in orders], iters, rounds)
    return [_rounds_row(f"JFA one-pass fwd+bwd, trainer batch H=8, dK/dV {'in_order' if o else 'grid'}", fb_tf=tf)
            for o, tf in zip(orders, got)]


TWOPASS_DKDV = (JfaTiles(block_m=32, block_n=64, num_warps=4, num_stages=3),
                JfaTiles(block_m=16, block_n=64, num_warps=4, num_stages=3),
                JfaTiles(block_m=32, block_n=64, num_warps=4, num_stages=2))


def twopass_ab(iters: int, rounds: int) -> list[dict[str, object]]:
    """The two-pass backward's dK/dV tiles on issue 15's batch, full and causal, fwd+bwd,
    interleaved over `rounds` rounds (the first tiles are the heuristic's; `bench.table
    --bwd-compare`'s sweep found 16x64 1.18x on causal and 0.82x on full in one sample)."""
    b = Batch(issue_lengths(), "cuda")
    two = _heuristic_config(b.max, b.max, D, DT, False)
    rows = []
    for causal in (False, True):
        got = _fb_rounds(b, causal, [dataclasses.replace(two, dkdv=t) for t in TWOPASS_DKDV], iters, rounds)
        rows += [_rounds_row(f"JFA two-pass fwd+bwd, issue batch {'causal' if causal else 'full'}, dK/dV {_tiles(t)}",
                             fb_tf=tf) for t, tf in zip(TWOPASS_DKDV, got)]
    return rows


# GDPA's one-pass backward (`GdpaTiles.one_pass`) against the two-pass default: dK/dV tiles
# (block_m q rows x block_n kv rows, warps, stages); None = the two-pass default.
GDPA_BWD_AB: list[tuple[int, int, int, int] | None] = [
    None, (32, 64, 4, 3), (64, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (16, 64, 4, 3)]


def gdpa_bwd_ab(iters: int, rounds: int) -> list[dict[str, object]]:
    """GDPA SiLU causal forward+backward on issue 15's batch (and on the trainer's lengths, H=8,
    as a long-kv second case), two-pass default vs one-pass with each GDPA_BWD_AB dK/dV tile,
    interleaved over `rounds` rounds; each config's dq/dk/dv are checked against the two-pass
    default's (err: largest difference relative to the largest magnitude)."""
    rows: list[dict[str, object]] = []
    for name, b in (("issue batch", Batch(issue_lengths(), "cuda")), ("trainer lengths H=8",
                                                                      Batch(trainer_lengths(), "cuda", heads=8))):
        flops_all = attention_flops(visible_pairs(b.lengths, b.lengths, causal=True), b.heads, D)[1]

        def tiles(cfg: tuple[int, int, int, int] | None, b: Batch = b) -> dict[str, GdpaTiles]:
            t = _gdpa_tiles(b, "in_order")
            if cfg is not None:
                bm, bn, w, st = cfg
                t["dkdv"] = GdpaTiles(block_m=bm, block_n=bn, num_warps=w, num_stages=st, one_pass=True)
            return t

        def grads(cfg: tuple[int, int, int, int] | None, b: Batch = b) -> tuple[torch.Tensor, ...]:
            with force_tiles(**tiles(cfg)):
                out = gdpa()(b.qg, b.kg, b.vg, b)
                return torch.autograd.grad(out, (b.qg, b.kg, b.vg), b.do)

        want = grads(None)
        errs = {cfg: max(float((x.float() - y.float()).abs().max()) / max(1.0, float(y.float().abs().max()))
                         for x, y in zip(grads(cfg), want)) for cfg in GDPA_BWD_AB}
        got: dict[tuple[int, int, int, int] | None, list[float]] = {cfg: [] for cfg in GDPA_BWD_AB}
        for _ in range(rounds):
            for cfg in GDPA_BWD_AB:
                with force_tiles(**tiles(cfg)):
                    got[cfg].append(tflops(flops_all, bench_ms(_fwd_bwd(gdpa(), b), iters=iters)) or 0.0)
        for cfg, tf in got.items():
            label = "two-pass (default)" if cfg is None else "one-pass dK/dV {}x{} w{} s{}".format(*cfg)
            row = _rounds_row(f"GDPA silu causal fwd+bwd, {name}, {label}", fb_tf=tf)
            row["err"] = errs[cfg]
            rows.append(row)
        del b
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--iters", type=int, default=7, help="timed iterations per figure (median)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="directory for schedule.json (default $OUT)")
    p.add_argument("--jfa-ab", type=int, default=0, metavar="ROUNDS",
                   help="only JFA's schedules, interleaved over ROUNDS rounds (medians)")
    p.add_argument("--gdpa-ab", type=int, default=0, metavar="ROUNDS",
                   help="only GDPA's schedules, interleaved over ROUNDS rounds (medians)")
    p.add_argument("--gdpa-bwd-ab", type=int, default=0, metavar="ROUNDS",
                   help="only GDPA's backward: two-pass vs one-pass dK/dV tiles, interleaved (medians)")
    p.add_argument("--onepass-ab", type=int, default=0, metavar="ROUNDS",
                   help="only the one-pass backward's dK/dV order on the trainer batch (medians)")
    p.add_argument("--twopass-ab", type=int, default=0, metavar="ROUNDS",
                   help="only the two-pass backward's dK/dV tiles on issue 15's batch (medians)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("schedule bench needs CUDA (the CPU checks are tests/test_gdpa.py::test_every_schedule_gives_the_same_bits)")
        return 0
    ab = args.jfa_ab or args.gdpa_ab or args.onepass_ab or args.twopass_ab or args.gdpa_bwd_ab
    if ab:
        rows = interleaved_ab("jfa", args.iters, args.jfa_ab) if args.jfa_ab else []
        rows += gdpa_bwd_ab(args.iters, args.gdpa_bwd_ab) if args.gdpa_bwd_ab else []
        rows += onepass_ab(args.iters, args.onepass_ab) if args.onepass_ab else []
        rows += twopass_ab(args.iters, args.twopass_ab) if args.twopass_ab else []
        rows += interleaved_ab("gdpa", args.iters, args.gdpa_ab) if args.gdpa_ab else []
        rows += pma_ab(args.iters, args.jfa_ab) if args.jfa_ab else []
    else:
        rows = run(args.iters)
    print()
    if ab:
        print_table(rows, ["case", "fwd_tf", "fb_tf", "fwd_rounds", "fb_rounds", "err"])
    else:
        print_table(rows, ["case", "fwd_ms", "fwd_tf", "fb_ms", "fb_tf", "bits_as_in_order", "err"])
    payload: dict[str, object] = dict(env=env_info(), rows=rows)
    save_json(args.out, "schedule.json", payload)
    emit_json(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
