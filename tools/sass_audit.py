"""Register use and spills of the Triton attention kernels, compiled for a GPU on a CPU-only box.

    python3 tools/sass_audit.py [--arch 90]          # module folders on PYTHONPATH

Triton compiles to a cubin without a GPU (`triton.compile(ASTSource(...), target=GPUTarget(
"cuda", arch, 32))`, with the ptxas it ships); `cuobjdump -res-usage` gives the registers and
the stack (local memory) per thread, and `nvdisasm` the SASS, whose `STL`/`LDL` count the
spill stores and loads in the code (static counts, not executions) and `HGMMA`/`MUFU` the
tensor-core and special-function instructions (`LDGSTS`: cp.async copies, i.e. pipelined
loads; `wgwait`: waits on wgmma groups, as many as HGMMA when ptxas serialized them). The Gluon
twins of the JFA kernels (`gem_kernels._gluon_jfa`) compile the same way. Kernels are specialized as a launch with 16-byte aligned tensors and strides divisible
by 16 is (`tt.divisibility` hints; `--unaligned` leaves them out, as this tool did before
2026-12-07: its loads are then not vectorized nor pipelined, and it reported spills that the
launched binaries do not have). Each kernel is built at its default tiles for
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
          ptrs: dict[str, str] | None = None, aligned: bool = True) -> dict[str, int]:
    """Compiles `kern` with `consts` and returns its resource and instruction counts.
    `aligned`: specialized as a launch with aligned tensors and 16-divisible strides is (the
    trainer's and issue 15's); False: no divisibility known (before 2026-12-07 the tool always
    compiled so, and reported spills the launched binaries do not have)."""
    names = kern.arg_names
    types = {**PTRS, **{n: "*bf16" for n in BF16}, **(ptrs or {})}
    sig = {n: "constexpr" if n in consts else types.get(n, "fp32" if n in FLOATS else "i32") for n in names}
    # What a launch with 16-byte aligned tensors and strides divisible by 16 (D = 128, any H)
    # specializes on: without these hints loads are not vectorized, so cp.async pipelining (and
    # the register allocation that follows) differs from the binary a real launch runs.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in consts and (sig[n].startswith("*") or n.startswith("stride_"))} if aligned else {}
    source = ASTSource
    if getattr(kern, "is_gluon", lambda: False)():  # Gluon kernels (gem_kernels._gluon_jfa)
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource
    src = source(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
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
    for op in ("STL", "LDL", "HGMMA", "MUFU", "LDGSTS"):
        res[op.lower()] = len(re.findall(rf"\b{op}\b", sass))
    # Waits on wgmma groups: one per HGMMA means ptxas serialized them (its C7515 note).
    res["wgwait"] = len(re.findall(r"WARPGROUP\.DEPBAR", sass))
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
        ("jfa dq 64x32 w4 s3 (default)", j._jfa_bwd_dq_kernel, dict(jf, BLOCK_M=64, BLOCK_N=32), 4, 3,
         {"DQ": "*bf16"}),
        ("jfa dkdv 32x64 w4 s3 (default two-pass)", j._jfa_bwd_dkdv_kernel,
         dict(jf, BLOCK_M=32, BLOCK_N=64, DQ_ATOMIC=False, DQ_TMA=False, TMA_LOADS=False), 4, 3,
         {"DQ": "*fp32", "DQ_DESC": "*fp32"}),
        ("jfa dkdv 32x128 w8 s3 (one-pass tiles, as two-pass)", j._jfa_bwd_dkdv_kernel,
         dict(jf, BLOCK_M=32, BLOCK_N=128, DQ_ATOMIC=False, DQ_TMA=False, TMA_LOADS=False), 8, 3,
         {"DQ": "*fp32", "DQ_DESC": "*fp32"}),
        ("jfa dq 128x64 w8 s3", j._jfa_bwd_dq_kernel, dict(jf, BLOCK_M=128, BLOCK_N=64, IN_ORDER=0), 8, 3,
         {"DQ": "*bf16"}),
        ("jfa dkdv 64x128 w8 s3", j._jfa_bwd_dkdv_kernel,
         dict(jf, BLOCK_M=64, BLOCK_N=128, IN_ORDER=0, DQ_ATOMIC=False, DQ_TMA=False, TMA_LOADS=False), 8, 3,
         {"DQ": "*fp32", "DQ_DESC": "*fp32"}),
    ]
    out += gluon_cases()
    if dkdv_extra:
        out.insert(3, ("gdpa dkdv one-pass 32x64 w4 s3", g._gdpa_bwd_dkdv_kernel,
                       dict(gd, BLOCK_M=32, BLOCK_N=64, DQ_ATOMIC=True), 4, 3, None))
    return out


def gluon_cases() -> list[tuple[str, Any, dict[str, Any], int, int, dict[str, str] | None]]:
    """The Gluon twins of the JFA kernels (`GEM_JFA_GLUON`), where this tree has them."""
    try:
        from gem_kernels import _gluon_jfa as gj
    except ImportError:
        return []
    if not gj.HAVE_GLUON:
        return []
    import torch

    out: list[tuple[str, Any, dict[str, Any], int, int, dict[str, str] | None]] = []
    offsets = torch.zeros(65, dtype=torch.int64)  # 64 samples, as the Triton cases' LOG2B=6
    for label, kern, by_m, tiles, default in (
            ("fwd", gj._jfa_fwd_gluon_kernel, True, gj.DEFAULT_FWD_TILES, gj.DEFAULT_FWD_TILES),
            ("fwd", gj._jfa_fwd_gluon_kernel, True, (128, 64, 8, 4), gj.DEFAULT_FWD_TILES),
            ("dkdv", gj._jfa_bwd_dkdv_gluon_kernel, False, gj.DEFAULT_TILES, gj.DEFAULT_TILES),
            ("dkdv", gj._jfa_bwd_dkdv_gluon_kernel, False, (64, 128, 8, 4, True), gj.DEFAULT_TILES),
            ("dq", gj._jfa_bwd_dq_gluon_kernel, True, gj.DEFAULT_DQ_TILES, gj.DEFAULT_DQ_TILES),
            ("dq", gj._jfa_bwd_dq_gluon_kernel, True, (128, 128, 8, 3, True), gj.DEFAULT_DQ_TILES)):
        _, _, consts = gj._launch_plan(tiles, by_m, 1, offsets, 1, 1, 128, True)  # the launch's constexprs
        bm, bn, w, st = tiles[:4]
        name = f"jfa {label} gluon {bm}x{bn} w{w} s{st}" + (" (default)" if tiles == default else "")
        out.append((name, kern, consts, w, st, {"DQ": "*bf16"}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    p.add_argument("--unaligned", action="store_true",
                   help="compile without divisibility hints (no aligned tensors or 16-divisible strides known)")
    args = p.parse_args(argv)
    import gem_kernels

    print(f"gem_kernels {gem_kernels.__version__} from {os.path.dirname(gem_kernels.__file__)}; "
          f"triton {triton.__version__}; sm_{args.arch}")
    print(f"{'kernel':44s} {'reg':>4s} {'stack':>6s} {'STL':>5s} {'LDL':>5s} {'HGMMA':>6s} {'wgwait':>6s} "
          f"{'MUFU':>5s} {'LDGSTS':>6s} {'smem':>7s}")
    for name, kern, consts, warps, stages, ptrs in cases():
        r = audit(kern, consts, warps, stages, args.arch, ptrs, aligned=not args.unaligned)
        print(f"{name:44s} {r.get('reg', 0):4d} {r.get('stack', 0):6d} {r['stl']:5d} {r['ldl']:5d} {r['hgmma']:6d} "
              f"{r['wgwait']:6d} {r['mufu']:5d} {r['ldgsts']:6d} {r['smem']:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
