"""The compact table of an Nsight Compute report, one row per kernel launch.

    python3 tools/ncu_summary.py REPORT.ncu-rep [--json OUT.json]

Reads the report with Nsight Compute's own Python module (`ncu_report`, shipped in the
install's extras/python; found under /opt/nvidia/nsight-compute or next to `ncu` on PATH).
Each row: the case (the NVTX range `gem_kernels.bench.ncu_cases` pushes; collect with
`ncu --nvtx`), the kernel, its time, the SM / memory / DRAM throughput as % of peak, the busiest
tensor pipe, the L2 hit rate, achieved vs theoretical occupancy, registers per thread, the
issue slots used, and the three largest stall reasons (cycles per issued instruction).
`--json` writes every metric of every launch (for reading later without ncu).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
from typing import Any


def _import_ncu_report() -> Any:
    roots = sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"))
    exe = shutil.which("ncu")
    if exe:
        roots.append(os.path.join(os.path.dirname(os.path.realpath(exe)), "extras", "python"))
    for r in reversed(roots):
        if os.path.isdir(r) and r not in sys.path:
            sys.path.insert(0, r)
    import ncu_report  # type: ignore[import-not-found]

    return ncu_report


def _value(act: Any, name: str) -> float | None:
    m = act.metric_by_name(name)
    if m is None:
        return None
    try:
        return float(m.as_double())
    except Exception:  # noqa: BLE001 - string or instanced metrics have no scalar
        return None


def _case(act: Any) -> str:
    try:
        st = act.nvtx_state()
        for dom in st.domains():
            ranges = st.domain_by_id(dom).push_pop_ranges()
            if ranges:
                return str(ranges[-1])
    except Exception:  # noqa: BLE001 - collected without --nvtx
        pass
    return "?"


STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def summarize(path: str) -> list[dict[str, Any]]:
    ncu_report = _import_ncu_report()
    ctx = ncu_report.load_report(path)
    rows: list[dict[str, Any]] = []
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            act = rng.action_by_idx(ai)
            names = list(act.metric_names())
            allm = {n: _value(act, n) for n in names}
            stalls = sorted(((n[len(STALL_PREFIX):-len(STALL_SUFFIX)], v) for n, v in allm.items()
                             if n.startswith(STALL_PREFIX) and n.endswith(STALL_SUFFIX) and v),
                            key=lambda x: -x[1])
            tensor = sorted(((n, v) for n, v in allm.items() if "pipe_tensor" in n
                             and n.endswith("pct_of_peak_sustained_active") and v is not None),
                            key=lambda x: -x[1])
            rows.append({
                "range": ri, "case": _case(act), "kernel": act.name(),
                "us": (allm.get("gpu__time_duration.sum") or 0.0) / 1e3,
                "sm_pct": allm.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                "mem_pct": allm.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
                "dram_pct": allm.get("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
                "tensor": tensor[0] if tensor else None,
                "l2_hit": allm.get("lts__t_sector_hit_rate.pct"),
                "occ": allm.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                "occ_theory": allm.get("sm__maximum_warps_per_active_cycle_pct"),
                "regs": allm.get("launch__registers_per_thread"),
                "issue_pct": allm.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                "grid": allm.get("launch__grid_size"), "block": allm.get("launch__block_size"),
                "smem_kb": ((allm.get("launch__shared_mem_per_block_dynamic") or 0)
                            + (allm.get("launch__shared_mem_per_block_static") or 0)) / 1024,
                "local_ld": allm.get("smsp__sass_inst_executed_op_local_ld.sum"),
                "stalls": stalls[:3],
                "metrics": allm,
            })
    return rows


def _f(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("--json", default="")
    p.add_argument("--min-us", type=float, default=20.0, help="hide launches shorter than this")
    args = p.parse_args()
    rows = summarize(args.report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    print("| case | kernel | us | SM % | mem % | DRAM % | tensor pipe % | L2 hit % | occ % (theory) "
          "| regs | issue % | smem KB | local ld | top stalls (cycles/issue) |")
    print("|" + "---|" * 14)
    for r in rows:
        if r["us"] < args.min_us:
            continue
        t = r["tensor"]
        tens = "-" if t is None else f"{t[1]:.0f} ({t[0].split('__')[1].split('.')[0]})"
        stalls = ", ".join(f"{n} {v:.1f}" for n, v in r["stalls"])
        print(f"| {r['case']} | {r['kernel'][:40]} | {r['us']:.0f} | {_f(r['sm_pct'])} | {_f(r['mem_pct'])} "
              f"| {_f(r['dram_pct'])} | {tens} | {_f(r['l2_hit'])} | {_f(r['occ'])} ({_f(r['occ_theory'])}) "
              f"| {_f(r['regs'])} | {_f(r['issue_pct'])} | {_f(r['smem_kb'])} | {_f(r['local_ld'])} | {stalls} |")
    print(f"{len(rows)} launches in {args.report}")


if __name__ == "__main__":
    main()
