"""What Triton and ptxas make of a kernel for a GPU, on any machine (no GPU needed).

`audit(kernel, constexprs, warps, stages)` compiles a `@triton.jit` (or Gluon) kernel for
sm_90a with the ptxas that Triton ships, then reads the cubin: registers and stack per thread
(`cuobjdump -res-usage`), and in the SASS (`nvdisasm`) the spill stores/loads (`STL`/`LDL`),
tensor-core (`HGMMA`), special-function (`MUFU`) and cp.async (`LDGSTS`) instructions, the waits
on wgmma groups (`wgwait`: as many as HGMMA when ptxas serialized the wgmmas, its C7515 note),
and the static shared memory. Static counts, not executions: it says how the source compiled,
not how fast it runs. Used by `tools/sass_audit.py` and by the tests that pin the default
binaries (no spills, asynchronous wgmmas) on the Triton version a machine has.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

FLOATS = {"scale", "inv_div", "scale_log2"}
PTRS = {"q_offsets": "*i64", "kv_offsets": "*i64", "QO": "*i64", "KO": "*i64", "CUM": "*i32", "ORDER": "*i32",
        "DQA": "*fp32", "DKA": "*fp32", "DVA": "*fp32", "LSE": "*fp32", "DELTA": "*fp32"}
BF16 = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ", "Q_DESC", "DO_DESC", "DQ_DESC"}


def audit(kern: Any, consts: dict[str, Any], warps: int, stages: int, arch: int = 90,
          ptrs: dict[str, str] | None = None, aligned: bool = True, maxnreg: int | None = None) -> dict[str, int]:
    """Compiles `kern` with `consts` for sm_`arch` and returns its resource and instruction counts:
    reg, stack, stl, ldl, hgmma, wgwait, mufu, ldgsts, smem (bytes).

    Arguments not in `consts` are typed by name: pointers per `PTRS` / `BF16` (bf16 tensors)
    unless `ptrs` says otherwise, `FLOATS` fp32, the rest i32. `aligned`: specialized as a launch
    with 16-byte aligned tensors and strides divisible by 16 is (without these hints loads are
    not vectorized, so cp.async pipelining and the register allocation differ from the binary a
    real launch runs); False: no divisibility known. `maxnreg`: the launch's register cap (a
    warp-specialized kernel's, which its partitions' `setmaxnreg` redistribute).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kern.arg_names
    types = {**PTRS, **{n: "*bf16" for n in BF16}, **(ptrs or {})}
    sig = {n: "constexpr" if n in consts else types.get(n, "fp32" if n in FLOATS else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in consts and (sig[n].startswith("*") or n.startswith("stride_"))} if aligned else {}
    source: Any = ASTSource
    if getattr(kern, "is_gluon", lambda: False)():  # Gluon kernels (gem_kernels._gluon_jfa)
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource
    src = source(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages,
                                                                               **({} if maxnreg is None else {"maxnreg": maxnreg})))
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(c.asm["cubin"])
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", path], capture_output=True, text=True,
                              check=True).stdout
    res = {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK):(\d+)", usage)}
    for op in ("STL", "LDL", "HGMMA", "MUFU", "LDGSTS"):
        res[op.lower()] = len(re.findall(rf"\b{op}\b", sass))
    res["wgwait"] = len(re.findall(r"WARPGROUP\.DEPBAR", sass))
    res["smem"] = int(c.metadata.shared)
    return res
