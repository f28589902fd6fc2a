"""GPU sweep: GDPA fwd+bwd tiles at the h200 trainer's shape (T ~262k jagged queries, H=8,
D=128, 32 kv tokens per sample, SiLU, bf16): the fused dQ + dK/dV backward's tiles."""
import math
import torch
from gem_kernels import generalized_dot_product_attention as gdpa
from gem_kernels._gdpa import GdpaTiles, force_tiles
from gem_kernels.bench._common import bench_ms, offsets_from_lengths, trainer_lengths

lengths = [n + 4 for n in trainer_lengths()]
b, h, d, nkv = len(lengths), 8, 128, 32
off = offsets_from_lengths(lengths, "cuda")
kvo = torch.arange(b + 1, device="cuda") * nkv
t = sum(lengths)
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(t, h, d, generator=g, device="cuda").bfloat16().requires_grad_()
k = torch.randn(b * nkv, h, d, generator=g, device="cuda").bfloat16().requires_grad_()
v = torch.randn(b * nkv, h, d, generator=g, device="cuda").bfloat16().requires_grad_()
do = torch.randn(t, h, d, generator=g, device="cuda").bfloat16()
mx = max(lengths)


def run():
    o = gdpa(q, k, v, off, kvo, mx, nkv, activation="silu")
    return torch.autograd.grad(o, (q, k, v), do)


def fwd():
    with torch.no_grad():
        return gdpa(q, k, v, off, kvo, mx, nkv, activation="silu")


base_f = bench_ms(fwd, warmup=3, iters=10)
base = bench_ms(run, warmup=3, iters=10)
ref = run()
print(f"default: fwd {base_f:.3f} ms, fwd+bwd {base:.3f} ms, bwd {base - base_f:.3f} ms", flush=True)
rows = []
for bm in (64, 128, 256):
    for w in (4, 8):
        for s in (1, 2, 3):
            tiles = GdpaTiles(block_m=bm, block_n=32, num_warps=w, num_stages=s)
            try:
                with force_tiles(dq=tiles):
                    ms = bench_ms(run, warmup=2, iters=8)
                    got = run()
                err = max(float((a.float() - r.float()).abs().max() / r.float().abs().max().clamp(min=1)) for a, r in zip(got, ref))
                rows.append((ms - base_f, bm, w, s, err))
                print(f"dq tiles {bm}x32 w{w} s{s}: bwd {ms - base_f:.3f} ms err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"dq tiles {bm}x32 w{w} s{s}: failed {type(e).__name__}: {str(e)[:100]}", flush=True)
rows.sort()
print("best:", rows[:3])
