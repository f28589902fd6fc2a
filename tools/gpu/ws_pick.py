"""Prints the warp-specialized forward tile set that was fastest on the trainer's batch in
`bench.gluon --fwd-only`'s JSON (argv[1]) as a Python tuple, if it beat the Triton forward there;
nothing otherwise."""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
row = next(r for r in rows if r["case"].startswith("trainer"))
ws = {k: v for k, v in row.items() if k.startswith("gluon_fwd_") and not k.endswith("_err")
      and isinstance(v, float) and k.count("x") >= 4}
if ws:
    best = max(ws, key=ws.get)
    if ws[best] > row["triton_fwd_tf"]:
        print(tuple(int(x) for x in best[len("gluon_fwd_"):].split("x")))
