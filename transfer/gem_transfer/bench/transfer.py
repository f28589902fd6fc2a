"""Transfer bench: how much of the teacher's quality each transfer method carries to a student.

    bazel run //transfer:bench_transfer                       # tiny preset, CPU (a few minutes)
    python3 -m gem_transfer.bench.transfer --preset gem       # one H200: the h200 teacher, GEM-like data

The teacher trains on the full multi-domain stream; every student trains on far fewer
labelled samples (`student_samples`), and every model is scored on the same held-out set
(>= 4,096 samples) against the planted Bayes-optimal AUC. Reported per task and method:
AUC, NE, gain over the label-only student, gain relative to standard KD's gain; the
students' parameters, FLOPs and CPU latency per sample beside the teacher's; a PNG bar chart
of the gains (matplotlib, when importable). Target: the best method's gain >= 2x KD's gain on
every task; student CPU latency <= 1/20 of the teacher's. The last line is one JSON object.

Student-sample sweep (`--sweep`: the preset's counts, `presets.SWEEP`; or
`--student-samples-sweep 256,512,...`): the teacher trains (or loads) and scores once, then
every method's students train on the first N student samples for each N (nested subsets, the
same held-out set and seeds: paired across N); a table per N with best/KD and teacher/KD and
how many times fewer samples than the teacher's; JSON `"sweep": {"N": {...}}`; a second PNG
of best/KD against N. The top-level `tasks` stay at the preset's student_samples.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gem_transfer._distill import METHODS, DistillConfig
from gem_transfer._pipeline import gains, run_transfer, sweep_plan
from gem_transfer.presets import SWEEP, gem, tiny

_TRANSFER = ("representation", "sharing", "combined")
# default wall budget of a preset's bench (gem: one H200 slot of 420 s, less Python's start-up)
_BUDGET: dict[str, float] = {"gem": 390.0}
# seconds kept for the CPU latency measurement after run_transfer (the h200 teacher on 1 thread)
_LATENCY_RESERVE = {"tiny": 10.0, "gem": 50.0}


def _latency(res: dict[str, Any], batch_size: int, reps: int, teacher_reps: int, teacher_warmup: int) -> dict[str, Any]:
    """CPU latency per sample (one thread, as a serving core) of the teacher and the students."""
    from gem_transfer._student import cpu_latency

    objs = res["objects"]
    ev = objs["eval_set"]
    part = ev.take(np.arange(min(batch_size, len(ev))))
    batch = part.host.to_batch("native")
    teacher = objs["teacher"]
    dev = next(teacher.parameters()).device
    t_cpu = teacher if dev.type == "cpu" else copy.deepcopy(teacher).cpu()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: dict[str, Any] = {"batch": len(part), "threads": 1}
        out["teacher_us"] = 1e6 * cpu_latency(lambda: t_cpu(batch), len(part), reps=teacher_reps, warmup=teacher_warmup)
        lengths = tuple(int(x) for x in np.asarray(part.host.lengths))
        out["teacher_flops"] = t_cpu.flops_for(lengths)["total"] / len(part)
        out["lengths"] = list(lengths)
        mean_len = float(np.mean(lengths))
        mean_sparse = float(np.asarray(part.host.sparse_lengths).mean())
        for m, st in objs["students"].items():
            rep = part.teacher_repr if st.cfg.repr_dim else None
            us = 1e6 * cpu_latency(functools.partial(st, batch, rep), len(part), reps=reps)
            fl = st.flops_per_sample(mean_len, mean_sparse)
            out[m] = {"us": us, "ratio": us / out["teacher_us"], "flops": fl["matmul"],
                      "pool_flops": fl["pooling"], "flops_frac": fl["matmul"] / out["teacher_flops"],
                      "params": st.num_params()}
    finally:
        torch.set_num_threads(threads)
    if t_cpu is not teacher:
        del t_cpu
    return out


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        importlib.import_module("matplotlib").use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return None


def _save_figure(plt: Any, fig: Any, ax: Any, title: str, path: Path, legend_size: int) -> None:
    """Title, legend, tight layout, written to `path` at 120 dpi, then closed."""
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _chart(g: dict[str, Any], path: Path, title: str) -> str:
    plt = _pyplot()
    if plt is None:
        return "chart skipped: matplotlib is not installed"
    tasks = list(g)
    methods = [m for m in METHODS if m != "label_only" and m in g[tasks[0]]]
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(tasks), 3.6))
    w = 0.8 / max(len(methods), 1)
    for k, m in enumerate(methods):
        ax.bar([i + k * w for i in range(len(tasks))], [g[t][m]["gain"] for t in tasks], w, label=m)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("AUC gain over label-only student")
    _save_figure(plt, fig, ax, title, path, legend_size=8)
    return f"chart: {path}"


def _sweep_chart(sweep: dict[str, Any], path: Path, title: str) -> str:
    """best/KD and teacher/KD gain ratios against the student samples N, one colour per task."""
    plt = _pyplot()
    if plt is None:
        return "sweep chart skipped: matplotlib is not installed"
    ns = sorted(sweep, key=int)
    tasks = list(sweep[ns[0]]["best_over_kd"])
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for i, t in enumerate(tasks):
        c = f"C{i}"
        for key, style, lab in (("best_over_kd", "o-", "best / KD"), ("teacher_over_kd", "x--", "teacher / KD")):
            # log scale: a ratio <= 0 (the method lost AUC) or undefined (KD's gain <= 0) is left out
            pts = [(int(n), r) for n in ns if (r := sweep[n][key][t]) is not None and r > 0]
            if pts:
                ax.plot(*zip(*pts), style, color=c, label=f"{t}: {lab}")
    ax.axhline(2.0, color="black", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(n) for n in ns], [n for n in ns])
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(importlib.import_module("matplotlib.ticker").FormatStrFormatter("%g"))
    ax.set_xlabel("student samples N (nested subsets, one teacher)")
    ax.set_ylabel("gain over label-only / KD's gain")
    _save_figure(plt, fig, ax, title, path, legend_size=7)
    return f"sweep chart: {path}"


def _task_rows(g: dict[str, Any], res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The JSON rows per task of one set of students (the preset's N, or one N of a sweep)."""
    tasks: dict[str, dict[str, Any]] = {}
    for t, row in g.items():
        best = max((m for m in _TRANSFER if m in row), key=lambda m: row[m]["auc"], default=None)
        kd_gain = row["kd"]["gain"] if "kd" in row else math.nan
        best_gain = row[best]["gain"] if best else math.nan
        ok = bool(best is not None and best_gain > 0 and best_gain >= 2 * kd_gain)
        # the ratio a student that matches the teacher exactly would reach: the target is out of
        # reach of any student that does not beat its teacher when this is < 2
        t_gain = res["teacher"][t]["auc"] - row["label_only"]["auc"] if "label_only" in row else math.nan
        tasks[t] = {"bayes": (res["bayes"] or {}).get(t, {}).get("auc"), "teacher": res["teacher"][t]["auc"],
                    **{m: v["auc"] for m, v in row.items()},
                    "ne": {m: v["ne"] for m, v in row.items()}, "gain": {m: v["gain"] for m, v in row.items()},
                    "vs_kd": {m: v["vs_kd"] for m, v in row.items()}, "best": best,
                    "best_gain_over_kd_gain": best_gain / kd_gain if kd_gain > 0 else None, "target_met": ok,
                    "teacher_gain": t_gain, "teacher_gain_over_kd_gain": t_gain / kd_gain if kd_gain > 0 else None}
    return tasks


def _parse_sweep(p: argparse.ArgumentParser, text: str, available: int) -> tuple[int, ...]:
    """`--student-samples-sweep` "N1,N2,..." -> sorted unique counts, each in [2, available]."""
    out = set()
    for part in text.split(","):
        try:
            n = int(part.strip())
        except ValueError:
            p.error(f"--student-samples-sweep={text!r}: {part.strip()!r} is not an integer (want N1,N2,... "
                    f"with 2 <= N <= {available})")
        if not 2 <= n <= available:
            p.error(f"--student-samples-sweep={text!r}: {n} must be in [2, {available}]: the students' "
                    f"{available:,} samples (--student-samples) are the pool, each N takes the first N of them "
                    "(one kept for validation); raise --student-samples to sweep further")
        out.add(n)
    return tuple(sorted(out))


def _strict(x: Any) -> Any:
    """NaN/inf -> None, so the JSON line is strict JSON (e.g. a ratio to a KD gain <= 0)."""
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=("tiny", "gem"))
    p.add_argument("--quick", action="store_true", help="a much smaller run (tests): numbers are not meaningful")
    p.add_argument("--smoke", action="store_true",
                   help="the preset's code path at toy sizes (with --preset gem: GEM-like features, a narrow h200 "
                        "teacher, short histories; a CPU check of the GPU run), implies --quick")
    p.add_argument("--time-budget", type=float, default=None,
                   help=f"wall seconds for the whole bench (default {_BUDGET['gem']:.0f} with --preset gem, none "
                        "for tiny): the teacher stops early and the students share what is left")
    p.add_argument("--teacher-samples", type=int, default=None)
    p.add_argument("--teacher-seconds", type=float, default=None)
    p.add_argument("--teacher-lr", type=float, default=None)
    p.add_argument("--teacher-table-lr", type=float, default=None, help="Adagrad lr of the tables (<= 0: AdamW)")
    p.add_argument("--student-samples", type=int, default=None)
    p.add_argument("--eval-samples", type=int, default=None)
    p.add_argument("--student-seeds", type=int, default=None)
    p.add_argument("--student-samples-sweep", default=None, metavar="N1,N2,...",
                   help="also train every method on the first N student samples for each N (nested subsets, "
                        "one teacher, the same held-out set and seeds); 2 <= N <= --student-samples")
    p.add_argument("--sweep", action="store_true",
                   help=f"--student-samples-sweep with the preset's counts up to --student-samples (tiny "
                        f"{','.join(map(str, SWEEP['tiny']))}; gem {','.join(map(str, SWEEP['gem']))}; with --quick: "
                        "S/4,S/2,S of its S samples)")
    p.add_argument("--sweep-seeds", type=int, default=None,
                   help="student seeds per method at the sweep's N other than --student-samples (default: tiny "
                        "--student-seeds, gem 1, to fit the time budget)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--student-domain", type=int, default=None,
                   help="a per-surface value model: students train and are scored on this domain only")
    p.add_argument("--kd-weights", default=None, help="comma-separated KD weight candidates (default 0.5,0.9,1.0)")
    p.add_argument("--teacher", default=None, help="load this save_teacher file instead of training one")
    p.add_argument("--save-teacher", default=None, help="write the trained teacher here")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else a temporary folder)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 on CPU, where a second OpenMP thread on a shared "
                        "2-core box ran up to 40x slower; torch's default with a GPU)")
    a = p.parse_args(argv)
    a.quick = a.quick or a.smoke
    budget = a.time_budget if a.time_budget is not None else _BUDGET.get(a.preset)
    if budget is not None and not budget > 0:
        p.error(f"--time-budget={budget} must be > 0")
    if a.threads is None and a.device in ("cpu", "auto") and not torch.cuda.is_available():
        a.threads = 1
    t0 = time.perf_counter()
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    # students are cheap: several per method (init, split, shuffle) average their noise
    over: dict[str, Any] = {"seed": a.seed, "student_seeds": 3 if a.preset == "tiny" else 2, "smoke": a.smoke}
    if a.quick:
        over.update(teacher_samples=1024, student_samples=256, eval_samples=512, student_seeds=1)
    if a.smoke and a.preset == "gem":  # short histories: a 131k-token step would be the whole teacher run
        over["teacher_tokens"] = 4096
    for name in ("teacher_samples", "teacher_seconds", "student_samples", "eval_samples", "student_seeds",
                 "student_domain"):
        if getattr(a, name) is not None:
            over[name] = getattr(a, name)
    if a.teacher_lr is not None:
        over["teacher_lr"] = a.teacher_lr
    if a.teacher_table_lr is not None:
        over["teacher_table_lr"] = a.teacher_table_lr if a.teacher_table_lr > 0 else None
    if a.kd_weights:
        over["distill"] = DistillConfig(kd_weights=tuple(float(x) for x in a.kd_weights.split(",")))
    if a.quick:  # a few epochs: the run checks the path, not the figures
        over["distill"] = dataclasses.replace(over.get("distill", DistillConfig()), epochs=6)
    if budget is not None:  # the rest of the budget after what run_transfer gets: the latency measurement
        over["time_budget"] = max(1.0, budget - (time.perf_counter() - t0) - _LATENCY_RESERVE[a.preset])
    if a.sweep_seeds is not None:
        over["sweep_seeds"] = a.sweep_seeds
    cfg = (tiny if a.preset == "tiny" else gem)(**over)
    if a.sweep and a.student_samples_sweep:
        p.error("give --sweep (the preset's counts) or --student-samples-sweep N1,N2,..., not both")
    if a.sweep:
        # the preset's counts up to the run's student samples (--quick: a quarter, half and all of them)
        s_n = cfg.student_samples
        ns = (s_n // 4, s_n // 2, s_n) if a.quick else tuple(n for n in SWEEP[a.preset] if n <= s_n) + (s_n,)
        cfg = dataclasses.replace(cfg, student_samples_sweep=_parse_sweep(p, ",".join(map(str, ns)), s_n))
    elif a.student_samples_sweep is not None:
        cfg = dataclasses.replace(cfg, student_samples_sweep=_parse_sweep(p, a.student_samples_sweep,
                                                                          cfg.student_samples))
    if cfg.student_samples_sweep:
        plan = sweep_plan(cfg)
        print(f"student-sample sweep: N {list(plan)}, seeds per method {list(plan.values())}", flush=True)
    print(f"transfer bench, preset {a.preset}{' (smoke sizes)' if a.smoke else ''}, device {dev}, time budget "
          f"{'none' if budget is None else f'{budget:.0f} s'}", flush=True)
    out = Path(a.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="bench_transfer_"))
    out.mkdir(parents=True, exist_ok=True)
    # score shards in the system temp dir, not under $OUT (they would travel back with the results)
    scores = Path(tempfile.mkdtemp(prefix="gem_transfer_scores_"))
    res = run_transfer(cfg, scores, device=dev, teacher=a.teacher, save_teacher_to=a.save_teacher)
    print(f"run_transfer done at {time.perf_counter() - t0:.0f} s; measuring CPU latency", flush=True)
    # gem: the h200 teacher on one CPU thread takes seconds per GEM-length sample: one timed
    # forward of 2 samples, no warm-up (the first call's overhead is small beside that)
    lat = (_latency(res, batch_size=64, reps=7, teacher_reps=2, teacher_warmup=1) if a.preset == "tiny" else
           _latency(res, batch_size=2, reps=3, teacher_reps=1, teacher_warmup=0))
    g = gains(res)

    tt = res["teacher_train"]
    origin = (f"trained on {tt['samples']:,} samples in {tt['seconds']:.0f} s" if tt else f"loaded from {a.teacher}")
    dom = "" if cfg.student_domain is None else f" of domain {cfg.student_domain}"
    print(f"\ntransfer bench, preset {a.preset}, device {dev}, {time.perf_counter() - t0:.0f} s: teacher {origin}, students on "
          f"{len(res['objects']['train_set']):,} samples{dom} ({cfg.student_seeds} seeds per method), held-out "
          f"{len(res['objects']['eval_set']):,}{dom}")
    print(res["table"])
    print(f"\nCPU latency per sample (1 thread, batch {lat['batch']}): teacher {lat['teacher_us']:.1f} us, "
          f"{lat['teacher_flops'] / 1e6:.2f} MFLOP")
    for m in METHODS:
        if m in lat:
            v = lat[m]
            print(f"  student {m:<15} {v['us']:8.2f} us ({v['ratio']:.3f} of the teacher), "
                  f"{v['flops'] / 1e3:.1f} kFLOP ({v['flops_frac']:.4f} of the teacher's), "
                  f"params {v['params']['total']:,} (trainable {v['params']['trainable']:,})")
    tasks = _task_rows(g, res)
    met = all(row["target_met"] for row in tasks.values())
    for t, row in tasks.items():
        kd_gain, t_gain, ratio = row["gain"].get("kd", math.nan), row["teacher_gain"], row["teacher_gain_over_kd_gain"]
        best_gain = row["gain"][row["best"]] if row["best"] else math.nan
        note = "" if kd_gain > 0 else " (KD's gain <= 0: the ratio is undefined)"
        print(f"task {t}: best {row['best']} gain {best_gain:+.4f} vs KD gain {kd_gain:+.4f} -> "
              f"{'target met' if row['target_met'] else 'TARGET MISSED'} (>= 2x KD's gain){note}; a student equal "
              f"to the teacher: gain {t_gain:+.4f}, {math.nan if ratio is None else ratio:.2f}x KD's")
    # the teacher's own sample count when it trained here; a loaded file does not record it
    t_samples = tt["samples"] if tt else cfg.teacher_samples
    sweep: dict[str, Any] = {}
    for n, entry in res.get("sweep", {}).items():
        rows = _task_rows(gains(res, entry["students"]), res)
        sweep[str(n)] = {"tasks": rows, "samples": entry["samples"], "student_seeds": entry["seeds"],
                         "teacher_samples_over_n": t_samples / entry["samples"],
                         "best": {t: r["best"] for t, r in rows.items()},
                         "best_over_kd": {t: r["best_gain_over_kd_gain"] for t, r in rows.items()},
                         "teacher_over_kd": {t: r["teacher_gain_over_kd_gain"] for t, r in rows.items()},
                         "target_met": {t: r["target_met"] for t, r in rows.items()}}
    if sweep:
        print(f"\nstudent-sample sweep: one teacher ({t_samples:,} samples{'' if tt else ', as configured'}), the "
              f"same {len(res['objects']['eval_set']):,} held-out samples; the students of each N train on the first "
              "N student samples (nested), seeds 0..k-1 at every N")
        methods = [m for m in METHODS if m in res["students"]]
        for n, e in sweep.items():
            print(f"N = {int(n):,} ({e['teacher_samples_over_n']:.1f}x fewer than the teacher's; "
                  f"{e['student_seeds']} seed{'s' if e['student_seeds'] > 1 else ''})")
            print(f"  {'task':<12} {'teacher':>7} " + " ".join(f"{m[:14]:>14}" for m in methods)
                  + f" {'best/KD':>8} {'teacher/KD':>10}  2x")
            for t, r in e["tasks"].items():
                b, tk = e["best_over_kd"][t], e["teacher_over_kd"][t]
                print(f"  {t:<12} {r['teacher']:7.4f} " + " ".join(f"{r[m]:14.4f}" for m in methods)
                      + f" {math.nan if b is None else b:8.2f} {math.nan if tk is None else tk:10.2f}  "
                      + ("missed" if not r["target_met"] else "met" if tk is not None else "met (KD gain <= 0)"))
    lat_ok = all(lat[m]["ratio"] <= 1 / 20 for m in METHODS if m in lat)
    print(f"latency target (student <= 1/20 of the teacher per sample): {'met' if lat_ok else 'MISSED'}")
    print(_chart(g, out / "transfer_gains.png", f"gem_transfer, preset {a.preset}: AUC gain over label-only"))
    if sweep:
        print(_sweep_chart(sweep, out / "transfer_sweep.png",
                           f"gem_transfer, preset {a.preset}: gain / KD's gain vs student samples"))
    summary = {
        "bench": "transfer", "preset": a.preset, "quick": a.quick, "smoke": a.smoke, "time_budget": budget,
        "tasks": tasks,
        "gain_target_met": met, "latency_target_met": lat_ok,
        "latency": {k: v for k, v in lat.items()},
        "students": {m: [{k: r[k] for k in ("kd_weight", "best_epoch", "epochs", "val_loss", "stopped_by")} for r in v["runs"]]
                     for m, v in res["students"].items()},
        "teacher_train": res["teacher_train"], "teacher_params": res["teacher_params"], "teacher_file": a.teacher,
        "score": {k: {kk: vv for kk, vv in v.items() if kk != "bad_blocks"} for k, v in res["score"].items()},
        "student_samples": len(res["objects"]["train_set"]), "student_domain": cfg.student_domain,
        "teacher_samples": t_samples, "student_samples_sweep": list(cfg.student_samples_sweep), "sweep": sweep,
        "eval_samples": len(res["objects"]["eval_set"]),
        "student_seeds": cfg.student_seeds, "seconds": time.perf_counter() - t0, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "torch": torch.__version__, "python": platform.python_version(),
    }
    summary = dict(_strict(summary))
    (out / "transfer.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    shutil.rmtree(scores, ignore_errors=True)
    print(json.dumps(summary, allow_nan=False))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
