"""Prints the compact figures of a gem_trainer run: its final JSON line + per-step JSONL times.

    python3 tools/trainer_summary.py RUN.log [LOG_DIR]
"""
import json
import sys

KEYS = ("steps", "loss", "mfu", "mfu_steady", "step_s_median", "time_to_first_step_s", "tokens_per_s",
        "samples_per_s", "compute_s", "optimizer_s", "data_wait_s", "data_wait_frac", "ckpt_stall_s",
        "ckpt_final_wait_s")
# printed when the run has them (checkpoints, --compile, a stop, the sync-debug hook)
OPTIONAL = ("stop_reason", "ckpt_saves", "ckpt_steps_between_saves", "ckpt_stall_per_save_s", "ckpt_stall_frac", "ckpt_prepare_s",
            "ckpt_state_gb", "ckpt_write_gb_per_s", "ckpt_delayed_steps", "compile_graphs",
            "compile_graph_breaks", "recompiles_per_100_steps", "sync_debug_steps")
lines = [ln for ln in open(sys.argv[1], encoding="utf-8") if ln.startswith("{")]
if not lines:
    print("no summary line")
    sys.exit(0)
s = json.loads(lines[-1])
keys = KEYS + tuple(k for k in OPTIONAL if k in s)
print({k: (round(s[k], 4) if isinstance(s.get(k), float) else s.get(k)) for k in keys})
print({t: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()} for t, d in s.get("tasks", {}).items()})
if len(sys.argv) > 2:
    rows = [json.loads(ln) for ln in open(sys.argv[2] + "/metrics.jsonl", encoding="utf-8")]
    ts = [(r["step"], r["time"]) for r in rows if "loss" in r and "mfu" not in r]
    dts = [round(b[1] - a[1], 3) for a, b in zip(ts, ts[1:])]
    print("per-step wall s:", dts)
