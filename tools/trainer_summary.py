"""Prints the compact figures of a gem_trainer run: its final JSON line + per-step JSONL times.

    python3 tools/trainer_summary.py RUN.log [LOG_DIR]
"""
import json
import sys

KEYS = ("steps", "loss", "mfu", "mfu_steady", "step_s_median", "time_to_first_step_s", "tokens_per_s",
        "samples_per_s", "compute_s", "optimizer_s", "data_wait_s", "data_wait_frac", "ckpt_stall_s",
        "ckpt_final_wait_s")
lines = [ln for ln in open(sys.argv[1], encoding="utf-8") if ln.startswith("{")]
if not lines:
    print("no summary line")
    sys.exit(0)
s = json.loads(lines[-1])
print({k: (round(s[k], 4) if isinstance(s.get(k), float) else s.get(k)) for k in KEYS})
print({t: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()} for t, d in s.get("tasks", {}).items()})
if len(sys.argv) > 2:
    rows = [json.loads(ln) for ln in open(sys.argv[2] + "/metrics.jsonl", encoding="utf-8")]
    ts = [(r["step"], r["time"]) for r in rows if "loss" in r and "mfu" not in r]
    dts = [round(b[1] - a[1], 3) for a, b in zip(ts, ts[1:])]
    print("per-step wall s:", dts)
