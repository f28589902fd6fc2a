"""Register use and spills of the Triton attention kernels, compiled for a GPU on a CPU-only box.

    python3 tools/sass_audit.py [--arch 90] [--only gdpa]   # module folders on PYTHONPATH

Each kernel (the Triton JFA and GDPA kernels, and the Gluon twins of JFA's) is built at its
default tiles for D=128 bf16 (causal, SiLU for GDPA) and a few alternatives, with the ptxas
Triton ships, and its cubin read by `gem_kernels._sass.audit`: registers and stack per thread,
spill stores/loads (`STL`/`LDL`), `HGMMA`, `MUFU`, `LDGSTS` (cp.async copies: pipelined loads),
`wgwait` (waits on wgmma groups: as many as HGMMA when ptxas serialized them) and shared memory.
Kernels are specialized as a launch with 16-byte aligned tensors and 16-divisible strides is
(`--unaligned` drops those hints: loads are then neither vectorized nor pipelined). Nothing runs:
this says what the compiler made of the source, not how fast it is (a GPU bench says that). Put
another tree's module folder first on PYTHONPATH to compare (the audit code is this tree's).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import triton

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
            ("dkdv", gj._jfa_bwd_dkdv_gluon_kernel, False, (32, 128, 8, 4, True), gj.DEFAULT_TILES),
            ("dkdv", gj._jfa_bwd_dkdv_gluon_kernel, False, (64, 128, 8, 4, True), gj.DEFAULT_TILES),
            ("dq", gj._jfa_bwd_dq_gluon_kernel, True, gj.DEFAULT_DQ_TILES, gj.DEFAULT_DQ_TILES),
            ("dq", gj._jfa_bwd_dq_gluon_kernel, True, (128, 128, 8, 3, True), gj.DEFAULT_DQ_TILES)):
        _, _, consts = gj._launch_plan(tiles, by_m, 1, offsets, 1, 1, 128, True)  # the launch's constexprs
        bm, bn, w, st = tiles[:4]
        name = f"jfa {label} gluon {bm}x{bn} w{w} s{st}" + (" (default)" if tiles == default else "")
        out.append((name, kern, consts, w, st, {"DQ": "*bf16"}))
    for tiles in (gj.WS_FWD_TILES, (*gj.WS_FWD_TILES, True), (128, 64, 12, 4, True, True),
                  (128, 128, 12, 2, True, True, True)):
        # The warp-specialized forward: its launch caps registers (`maxnreg`, in consts: the audit
        # takes it out), its partitions' setmaxnreg hands them out; "reg" is the cap.
        kern, _, _, consts = gj.fwd_plan(tiles, 1, offsets, 1, 1, 128, True)
        name = (f"jfa fwd gluon ws {tiles[0]}x{tiles[1]} s{tiles[3]}" + (" pingpong" if len(tiles) > 5 else "")
                + (" persistent" if len(tiles) > 6 else ""))
        out.append((name, kern, consts, consts["num_warps"], tiles[3], {"DQ": "*bf16"}))
    from gem_kernels import _gluon_gdpa as gg

    kern, _, _, consts = gg.fwd_plan(gg.DEFAULT_TILES, 1, offsets, 1, 1, 128, True, "silu")
    out.append(("gdpa fwd gluon ws 128x128 s3 pingpong silu", kern, consts, consts["num_warps"], 3, None))
    return out


def _sass() -> Any:
    """This tree's `gem_kernels._sass`, loaded from its file: the kernels audited may come from
    another tree (first on PYTHONPATH), older than the module."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "gem_kernels", "_sass.py")
    spec = importlib.util.spec_from_file_location("_gem_sass", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    p.add_argument("--unaligned", action="store_true",
                   help="compile without divisibility hints (no aligned tensors or 16-divisible strides known)")
    p.add_argument("--only", default="", help="audit only the kernels whose name contains this text (e.g. 'gdpa')")
    args = p.parse_args(argv)
    import gem_kernels

    audit = _sass().audit

    print(f"gem_kernels {gem_kernels.__version__} from {os.path.dirname(gem_kernels.__file__)}; "
          f"triton {triton.__version__}; sm_{args.arch}")
    print(f"{'kernel':44s} {'reg':>4s} {'stack':>6s} {'STL':>5s} {'LDL':>5s} {'HGMMA':>6s} {'wgwait':>6s} "
          f"{'MUFU':>5s} {'LDGSTS':>6s} {'smem':>7s}")
    for name, kern, consts, warps, stages, ptrs in cases():
        if args.only not in name:
            continue
        consts = dict(consts)
        r = audit(kern, consts, warps, stages, args.arch, ptrs, aligned=not args.unaligned,
                  maxnreg=consts.pop("maxnreg", None))
        print(f"{name:44s} {r.get('reg', 0):4d} {r.get('stack', 0):6d} {r['stl']:5d} {r['ldl']:5d} {r['hgmma']:6d} "
              f"{r['wgwait']:6d} {r['mufu']:5d} {r['ldgsts']:6d} {r['smem']:7d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
