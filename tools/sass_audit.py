"""Register use and spills of the Triton attention kernels, compiled for a GPU on a CPU-only box.

    python3 tools/sass_audit.py [--arch 90]          # module folders on PYTHONPATH

Triton compiles to a cubin without a GPU (`triton.compile(ASTSource(...), target=GPUTarget(
"cuda", arch, 32))`, with the ptxas it ships); `cuobjdump -res-usage` gives the registers and
the stack (local memory) per thread, and `nvdisasm` the SASS, whose `STL`/`LDL` count the
spill stores and loads in the code (static counts, not executions) and `HGMMA`/`MUFU` the
tensor-core and special-function instructions. Each kernel is built at its default tiles for
D=128 bf16 (causal, SiLU for GDPA) and a few alternatives. Nothing runs: this says what the
compiler made of the source, not how fast it is (a GPU bench says that). Put another tree's
module folder first on PYTHONPATH to compare.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
FLOATS = {"scale", "inv_div", "scale_log2"}
PTRS = {"q_offsets": "*i64", "kv_offsets": "*i64", "QO": "*i64", "KO": "*i64", "CUM": "*i32", "ORDER": "*i32",
        "DQA": "*fp32", "DKA": "*fp32", "DVA": "*fp32", "LSE": "*fp32", "DELTA": "*fp32"}
BF16 = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ", "Q_DESC", "DO_DESC", "DQ_DESC"}


def audit(kern: Any, consts: dict[str, Any], warps: int, stages: int, arch: int,
          ptrs: dict[str, str] | None = None) -> dict[str, int]:
    """Compiles `kern` with `consts` and returns its resource and instruction counts."""
    names = kern.arg_names
    types = {**PTRS, **{n: "*bf16" for n in BF16}, **(ptrs or {})}
    sig = {n: "constexpr" if n in consts else types.get(n, "fp32" if n in FLOATS else "i32") for n in names}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(c.asm["cubin"])
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", path], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", path], capture_output=True, text=True,
                              check=True).stdout
    res = {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK):(\d+)", usage)}
    for op in ("STL", "LDL", "HGMMA", "MUFU"):
        res[op.lower()] = len(re.findall(rf"\b{op}\b", sass))
    res["smem"] = int(c.metadata.shared)
    return res


def cases() -> list[tuple[str, Any, dict[str, Any], int, int, dict[str, str] | None]]:
    from gem_kernels import _triton_gdpa as g
    from gem_kernels import _triton_jfa as j

    gd = dict(D=128, ACT="silu", TANH=True, CAUSAL=True, HAS_WINDOW=False, PREC="tf32", TILE_LIST=False, LOG2B=6,
              IN_ORDER=1)
    short = dict(D=128, ACT="silu", TANH=True, CAUSAL=False, HAS_WINDOW=False, PREC="tf32", BLOCK_B=512)
    jf = dict(CAUSAL=True, HAS_WINDOW=False, D=128, DOT_PREC="tf32", UPCAST=False, TILE_LIST=False, LOG2B=6,
              IN_ORDER=1)
    dkdv_extra = "DQ_ATOMIC" in g._gdpa_bwd_dkdv_kernel.arg_names  # (trees before the one-pass backward lack it)
    out: list[tuple[str, Any, dict[str, Any], int, int, dict[str, str] | None]] = [
        ("gdpa fwd 128x64 w8 s3 (default)", g._gdpa_fwd_kernel, dict(gd, BLOCK_M=128, BLOCK_N=64), 8, 3, None),
        ("gdpa dq 64x32 w4 s3 (default)", g._gdpa_bwd_dq_kernel, dict(gd, BLOCK_M=64, BLOCK_N=32), 4, 3, None),
        ("gdpa dkdv 32x64 w4 s3 (default)", g._gdpa_bwd_dkdv_kernel,
         dict(gd, BLOCK_M=32, BLOCK_N=64, **({"DQ_ATOMIC": False} if dkdv_extra else {})), 4, 3, None),
        ("gdpa short fwd 64x32 w4 s2 x8 (default)", g._gdpa_fwd_short_kernel,
         dict(short, BLOCK_M=64, BLOCK_N=32, Q_TILES=8), 4, 2, None),
        ("gdpa short bwd 128x32 w8 s2 x8 (default)", g._gdpa_bwd_short_kernel,
         dict(short, BLOCK_M=128, BLOCK_N=32, Q_TILES=8), 8, 2, {"DQ": "*bf16"}),
        ("jfa fwd 128x128 w8 s3 (default)", j._jfa_fwd_kernel, dict(jf, BLOCK_M=128, BLOCK_N=128), 8, 3, None),
        ("jfa fwd 128x64 w8 s3", j._jfa_fwd_kernel, dict(jf, BLOCK_M=128, BLOCK_N=64), 8, 3, None),
        ("jfa dq 128x64 w8 s3", j._jfa_bwd_dq_kernel, dict(jf, BLOCK_M=128, BLOCK_N=64, IN_ORDER=0), 8, 3,
         {"DQ": "*bf16"}),
        ("jfa dkdv 64x128 w8 s3", j._jfa_bwd_dkdv_kernel,
         dict(jf, BLOCK_M=64, BLOCK_N=128, IN_ORDER=0, DQ_ATOMIC=False, DQ_TMA=False, TMA_LOADS=False), 8, 3,
         {"DQ": "*fp32", "DQ_DESC": "*fp32"}),
    ]
    if dkdv_extra:
        out.insert(3, ("gdpa dkdv one-pass 32x64 w4 s3", g._gdpa_bwd_dkdv_kernel,
                       dict(gd, BLOCK_M=32, BLOCK_N=64, DQ_ATOMIC=True), 4, 3, None))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    args = p.parse_args(argv)
    import gem_kernels

    print(f"gem_kernels {gem_kernels.__version__} from {os.path.dirname(gem_kernels.__file__)}; "
          f"triton {triton.__version__}; sm_{args.arch}")
    print(f"{'kernel':44s} {'reg':>4s} {'stack':>6s} {'STL':>5s} {'LDL':>5s} {'HGMMA':>6s} {'MUFU':>5s} {'smem':>7s}")
    for name, kern, consts, warps, stages, ptrs in cases():
        r = audit(kern, consts, warps, stages, args.arch, ptrs)
        print(f"{name:44s} {r.get('reg', 0):4d} {r.get('stack', 0):6d} {r['stl']:5d} {r['ldl']:5d} {r['hgmma']:6d} "
              f"{r['mufu']:5d} {r['smem']:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
