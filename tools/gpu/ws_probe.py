"""First GPU contact of the warp-specialized forward (`_gluon_jfa._attn_fwd_ws_kernel`: JFA's, its
persistent form, GDPA's through `_gluon_gdpa`): small and issue-sized batches against the Triton
forwards, one line per tile set and batch as each finishes, covering every WS tile set the GPU
tests and `bench.gluon` run; a deadlock shows as the last line before the stage's time limit."""
import math
import sys
import time

import torch

from gem_kernels import _gluon_jfa as gj
from gem_kernels import _triton_jfa as tj

for tiles in [(128, 128, 12, 3, True), (128, 128, 12, 3, True, True), (128, 64, 12, 4, True, True),
              (128, 128, 12, 2, True, True, True), (128, 64, 12, 4, True, False, True),
              (128, 64, 12, 4, True, True, True)]:
    for lengths, causal in (([5, 130, 300, 64], False), ([5, 130, 300, 64], True), ([700, 1500, 3000, 90] * 4, False)):
        g = torch.Generator(device="cuda").manual_seed(0)
        off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
        q, k, v = (torch.randn(sum(lengths), 4, 128, generator=g, device="cuda").bfloat16() for _ in range(3))
        t = time.time()
        out, lse = gj.forward(q, k, v, off, off, max(lengths), causal, 1 / math.sqrt(128), tiles)
        torch.cuda.synchronize()
        ref, lse_r = tj.jfa_forward(q, k, v, off, off, max(lengths), max(lengths), causal, None, 1 / math.sqrt(128))
        err = float((out.float() - ref.float()).abs().max())
        lerr = float((lse - lse_r)[torch.isfinite(lse_r)].abs().max())
        print(tiles, len(lengths), causal, f"out err {err:.2e} lse err {lerr:.2e} {time.time() - t:.1f}s", flush=True)
from gem_kernels import _gluon_gdpa as gg  # noqa: E402
from gem_kernels._gdpa import gdpa_forward_triton  # noqa: E402

for tiles in [(128, 128, 12, 3, True), (128, 128, 12, 3, True, True)]:
    lengths = [5, 130, 300, 64, 2000]
    g = torch.Generator(device="cuda").manual_seed(1)
    off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    q, k, v = (torch.randn(sum(lengths), 4, 128, generator=g, device="cuda").bfloat16() for _ in range(3))
    t = time.time()
    out = gg.forward(q, k, v, off, off, max(lengths), "silu", 1 / math.sqrt(128), 2000.0, True, tiles)
    torch.cuda.synchronize()
    ref = gdpa_forward_triton(q, k, v, off, off, max(lengths), max(lengths), "silu", 1 / math.sqrt(128), 2000.0, True,
                              None)
    print("gdpa", tiles, f"out err {float((out.float() - ref.float()).abs().max()):.2e} {time.time() - t:.1f}s",
          flush=True)
sys.exit(0)
