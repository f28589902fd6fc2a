"""The compact final table of `tools/gpu/multi_gpu.sh`: trainer scaling (1 GPU vs 2, NCCL vs copy
engines), the comms bench's headline figures and every stage's exit code.

    python3 tools/multi_gpu_table.py OUT_DIR

Reads OUT_DIR/h200_<run>.log (the trainer's final JSON line), OUT_DIR/h200_<run>/metrics.jsonl
(per-step cumulative tokens of rank 0, for the steady rate), OUT_DIR/comms_multi_gpu*.json and
OUT_DIR/rcs.txt; prints a markdown table and writes OUT_DIR/multi_gpu_summary.json.

Per-GPU tokens/s: the summary's `tokens_per_s` (all ranks, whole run including start-up
steps) / world size, and the steady rate: rank 0's tokens over the steps after STEADY_FROM
divided by their wall time (each rank runs its own token budget, so rank 0's rate is one
GPU's). Scaling ratio = 2-GPU steady per-GPU rate / 1-GPU steady rate (1.0 = linear).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

RUNS = (("1gpu", "1 GPU", "-"), ("2gpu_nccl", "2 GPU", "nccl"), ("2gpu_copy_engine", "2 GPU", "copy_engine"))
STEADY_FROM = 10  # steps before this include Triton compilation and allocator warm-up


def _last_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith("{")]
    except OSError:
        return None
    for ln in reversed(lines):
        try:
            out = json.loads(ln)
        except ValueError:
            continue
        if isinstance(out, dict):
            return out
    return None


def steady_tokens_per_s(metrics: str) -> float | None:
    """Rank 0's tokens/s over the logged steps >= STEADY_FROM (cumulative `tokens`, wall `time`)."""
    try:
        with open(metrics, encoding="utf-8") as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    except (OSError, ValueError):
        return None
    pts = [(r["time"], r["tokens"]) for r in rows if "loss" in r and "tokens" in r and r["step"] >= STEADY_FROM]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return float((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]))


def _fmt(v: Any, nd: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def main(out: str) -> dict[str, Any]:
    rcs: dict[str, str] = {}
    try:
        with open(os.path.join(out, "rcs.txt"), encoding="utf-8") as f:
            for ln in f:
                parts = ln.split()
                if len(parts) >= 2:
                    rcs[parts[0]] = " ".join(parts[1:])
    except OSError:
        pass
    runs: dict[str, dict[str, Any]] = {}
    for key, gpus, comms in RUNS:
        s = _last_json(os.path.join(out, f"h200_{key}.log"))
        steady = steady_tokens_per_s(os.path.join(out, f"h200_{key}", "metrics.jsonl"))
        world = int(s.get("world_size", 1)) if s else None
        runs[key] = {
            "gpus": gpus, "comms": comms, "rc": rcs.get(f"h200_{key}"),
            "steps": s.get("steps") if s else None,
            "tokens_per_s_per_gpu": s["tokens_per_s"] / world if s and world else None,
            "steady_tokens_per_s_per_gpu": steady,
            "mfu_steady": s.get("mfu_steady") if s else None,
            "step_s_median": s.get("step_s_median") if s else None,
            "loss": s.get("loss") if s else None,
        }
    base = runs["1gpu"]["steady_tokens_per_s_per_gpu"] or runs["1gpu"]["tokens_per_s_per_gpu"]
    for key in ("2gpu_nccl", "2gpu_copy_engine"):
        r = runs[key]
        mine = r["steady_tokens_per_s_per_gpu"] or r["tokens_per_s_per_gpu"]
        r["scaling_ratio"] = mine / base if mine and base else None
    print("| run | comms | rc | steps | tokens/s per GPU (run) | tokens/s per GPU (steady) | MFU steady | step s (median) | scaling |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, r in runs.items():
        mfu = f"{100 * r['mfu_steady']:.1f} %" if isinstance(r["mfu_steady"], float) else "–"
        print(f"| {r['gpus']} | {r['comms']} | {_fmt(r['rc'])} | {_fmt(r['steps'])} | {_fmt(r['tokens_per_s_per_gpu'])} | "
              f"{_fmt(r['steady_tokens_per_s_per_gpu'])} | {mfu} | {_fmt(r['step_s_median'], 3)} | "
              f"{_fmt(r.get('scaling_ratio'), 3)} |")
    ce, nc = runs["2gpu_copy_engine"], runs["2gpu_nccl"]
    ce_rate = ce["steady_tokens_per_s_per_gpu"] or ce["tokens_per_s_per_gpu"]
    nc_rate = nc["steady_tokens_per_s_per_gpu"] or nc["tokens_per_s_per_gpu"]
    summary: dict[str, Any] = {"trainer": runs,
                               "copy_engine_over_nccl": ce_rate / nc_rate if ce_rate and nc_rate else None,
                               "rcs": rcs}
    print(f"copy_engine / nccl trainer rate: {_fmt(summary['copy_engine_over_nccl'], 3)}")
    for name in ("comms_multi_gpu_full.json", "comms_multi_gpu_quick.json"):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            bench = json.load(f)
        st = bench.get("stages", {})
        ag = st.get("all_gather", [])
        big = [r for r in ag if r["mib_per_rank"] >= 64]
        mm = {r["scenario"]: r.get("slowdown_pct") for r in st.get("interference", [])}
        head = {"bench": name, "ok": bench.get("ok"), "signal": bench.get("signal"), "probe": st.get("probe"),
                "ag_busbw_ce_vs_nccl": [(r["mib_per_rank"], round(r["ce_busbw_gbs"], 1), round(r["ref_busbw_gbs"], 1))
                                        for r in ag],
                "ag_ce_over_nccl_ge64MiB": min((r["ce_busbw_gbs"] / r["ref_busbw_gbs"] for r in big), default=None),
                "mm_slowdown_ce_pct": mm.get("beside copy_engine all-gather"),
                "mm_slowdown_nccl_pct": mm.get("beside NCCL all-gather"),
                "mm_tflops_busbw_during": [(r["scenario"], round(r["tflops"], 1),
                                            round(r.get("comm_busbw_during_gbs", 0.0), 1))
                                           for r in st.get("interference", [])],
                "error": bench.get("error")}
        summary[name] = head
        print(json.dumps(head))
    print("stage rc / wall s: " + ", ".join(f"{k} {v}" for k, v in rcs.items()))
    with open(os.path.join(out, "multi_gpu_summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/multi_gpu"))
