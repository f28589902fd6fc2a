"""GPU probe: torch's cuDNN ragged attention as JFA's backward (and forward), checked and timed.

    PYTHONPATH=kernels python3 tools/probe_cudnn.py

Result on the H200 (torch 2.11.0+cu130, cuDNN 9.19, 2026-12-01; kernels/BENCHMARKS.md): the
ragged forward is right but 7-100x slower than ours (it builds its cuDNN graph every call),
and the ragged backward's dQ/dK are wrong (errors ~1e17-1e34; the trainer hit an illegal memory
access), so gem_kernels does not use it. Rerun this on a newer torch before trying again.

1. Correctness on a small mix with edge lengths (1, block +- 1, > D), H=8, D=128, bf16,
   full and causal self-attention, against the fp32 reference (`backend="reference"`):
   torch's FlashAttention-2 backward (the default until gem-kernels 0.3.9), cuDNN's backward fed with our
   forward's out/lse (`cudnn_backward`), cuDNN forward + backward, and the raw op on
   strided q/k/v views (does its ragged path honour the token stride?).
2. Timing (CUDA events, median) on the trainer's mix (H=8) and the issue batch (H=4).
Prints one JSON line per row and a compact table at the end.
"""
import json
import math
import traceback

import torch

from gem_kernels import jagged_flash_attention
from gem_kernels import _flash2
from gem_kernels._jfa import _run_forward
from gem_kernels.bench._common import bench_ms, issue_lengths, offsets_from_lengths, trainer_lengths, visible_pairs

D = 128
DT = torch.bfloat16
rows: list[dict[str, object]] = []
LN2 = math.log(2.0)


def _cu(off: torch.Tensor) -> torch.Tensor:
    return off.to(torch.int32)


def cudnn_forward(q, k, v, qo, ko, mq, mk, causal, scale):
    """out and our log2 lse [Tq, H] from aten._cudnn_attention_forward's ragged path (contiguous
    inputs: torch builds its ragged offsets as offset * H * D)."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    res = torch.ops.aten._cudnn_attention_forward(q, k, v, None, _cu(qo), _cu(ko), mq, mk, True, 0.0, causal,
                                                  False, scale=scale)
    return res[0], (res[1].reshape(q.shape[0], q.shape[1]) / LN2).contiguous()


def cudnn_backward(do, q, k, v, out, lse2, qo, ko, mq, mk, causal, scale):
    """dq, dk, dv from aten._cudnn_attention_backward fed with our out and lse (natural log,
    [Tq, H, 1] token-major: the layout its ragged forward writes)."""
    do, q, k, v, out = (t.contiguous() for t in (do, q, k, v, out))
    stats = (lse2 * LN2).reshape(q.shape[0], q.shape[1], 1).contiguous()
    z = torch.zeros(1, dtype=torch.int64, device=q.device)
    return torch.ops.aten._cudnn_attention_backward(do, q, k, v, out, stats, z, z, None, _cu(qo), _cu(ko), mq, mk,
                                                    0.0, causal, scale=scale)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) / max(1e-6, float(b.float().abs().max()))


def make(lengths: list[int], heads: int, seed: int = 0):
    off = offsets_from_lengths(lengths, "cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v, do = (torch.randn(t, heads, D, generator=g, device="cuda").to(DT) for _ in range(4))
    return off, q, k, v, do


def check(causal: bool) -> None:
    lengths = [1, 0, 4, 63, 64, 65, 127, 128, 129, 300, 1000, 2500, 17]
    off, q, k, v, do = make(lengths, 8, seed=3)
    mx, scale = max(lengths), 1.0 / math.sqrt(D)
    ref_in = [x.float().clone().requires_grad_() for x in (q, k, v)]
    ref = jagged_flash_attention(*ref_in, off, off, mx, mx, causal=causal, backend="reference")
    ref.backward(do.float())
    want = [ref.detach(), *(x.grad for x in ref_in)]
    out, lse2 = _run_forward(q, k, v, off, off, mx, mx, causal, None, scale)
    variants = {}
    variants["flash2_bwd"] = lambda: (out, *_flash2.flash_backward(do, q, k, v, out, lse2, off, off, mx, mx, causal, scale))
    variants["cudnn_bwd_our_fwd"] = lambda: (out, *cudnn_backward(do, q, k, v, out, lse2, off, off, mx, mx, causal, scale))

    def cudnn_both():
        o2, l2 = cudnn_forward(q, k, v, off, off, mx, mx, causal, scale)
        rows.append({"case": f"lse_cudnn_vs_ours causal={causal}", "rel": rel(l2, lse2)})
        return (o2, *cudnn_backward(do, q, k, v, o2, l2, off, off, mx, mx, causal, scale))
    variants["cudnn_fwd_bwd"] = cudnn_both

    def strided():
        qkv = torch.stack([q, k, v], 1)  # [T, 3, H, D]: token stride 3HD
        qs, ks, vs = qkv.unbind(1)
        cu = off.to(torch.int32)
        res = torch.ops.aten._cudnn_attention_forward(qs, ks, vs, None, cu, cu, mx, mx, True, 0.0, causal, False,
                                                      scale=scale)
        return (res[0], want[1], want[2], want[3])
    variants["raw_strided_fwd_only"] = strided
    for name, fn in variants.items():
        try:
            got = fn()
            torch.cuda.synchronize()
            errs = {n: round(rel(g, w), 5) for n, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
            rows.append({"case": f"check causal={causal}", "path": name, **errs})
        except Exception as e:  # noqa: BLE001
            rows.append({"case": f"check causal={causal}", "path": name, "error": repr(e)[:300]})
            traceback.print_exc()


def timing(name: str, lengths: list[int], heads: int, causal: bool) -> None:
    off, q, k, v, do = make(lengths, heads)
    mx, scale = max(lengths), 1.0 / math.sqrt(D)
    fl = 4.0 * visible_pairs(lengths, lengths, causal=causal) * D * heads
    out, lse2 = _run_forward(q, k, v, off, off, mx, mx, causal, None, scale)
    qkv = torch.stack([q, k, v], 1)
    qs, ks, vs = qkv.unbind(1)  # the trainer's case: strided views of one fused projection
    paths = {
        "fwd ours (default)": (lambda: _run_forward(qs, ks, vs, off, off, mx, mx, causal, None, scale), fl),
        "fwd flash2": (lambda: _flash2.flash_forward(qs, ks, vs, off, off, mx, mx, causal, scale), fl),
        "fwd cudnn (+copies)": (lambda: cudnn_forward(qs, ks, vs, off, off, mx, mx, causal, scale), fl),
        "bwd flash2": (lambda: _flash2.flash_backward(do, qs, ks, vs, out, lse2, off, off, mx, mx, causal, scale), 2.5 * fl),
        "bwd cudnn (+copies)": (lambda: cudnn_backward(do, qs, ks, vs, out, lse2, off, off, mx, mx, causal, scale), 2.5 * fl),
        "bwd cudnn (contiguous in)": (lambda: cudnn_backward(do, q, k, v, out, lse2, off, off, mx, mx, causal, scale), 2.5 * fl),
    }
    for path, (fn, flops) in paths.items():
        try:
            ms = bench_ms(fn, warmup=3, iters=10)
            rows.append({"case": name, "path": path, "ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)})
        except Exception as e:  # noqa: BLE001
            rows.append({"case": name, "path": path, "error": repr(e)[:300]})
            traceback.print_exc()


print(json.dumps({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                  "gpu": torch.cuda.get_device_name()}))
check(False)
check(True)
tl = trainer_lengths()
tl_cls = [n + 4 for n in tl]  # the CLS-prefixed stream the trainer attends over
timing(f"trainer mix H=8 B={len(tl)} T={sum(tl_cls)}", tl_cls, 8, False)
timing("issue batch H=4 full", issue_lengths(), 4, False)
timing("issue batch H=4 causal", issue_lengths(), 4, True)
for r in rows:
    print(json.dumps(r))
print("=== table")
for r in rows:
    print(" | ".join(f"{k}={v}" for k, v in r.items()))
