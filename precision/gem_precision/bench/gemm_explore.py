# mypy: ignore-errors
"""Design exploration for the MXFP8 GEMM on Hopper (GPU only; not part of the package API).

    PYTHONPATH=precision python3 -m gem_precision.bench.gemm_explore
    bazel run //precision:bench_gemm_explore      (on a GPU machine; on CPU it says so and exits)

Variants at the same shapes, same run:
  fp8_plain   FP8 Triton GEMM without scales (the ceiling of Triton's FP8 path here)
  fp8_s128    one fp32 rescale per 128 K (DeepSeek granularity; NOT MX numerics: a reference)
  mx_s32      the shipped kernel: one FP8 dot + fp32 rescale per 32 K
  mx_bf16     dequantize the FP8 tiles to bf16 in registers (exact), bf16 dot accumulating in place
  mx_bf16bits same, FP8->bf16 by bit manipulation + power-of-two multiply (no cvt instructions)
"""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from gem_precision._triton_gemm import _e8m0_to_f32, grouped_tile_ids


@triton.jit
def _fp8_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, M, N, K,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCALE: tl.constexpr):
    # a [M, K], b [N, K] row-major fp8; SCALE: 0 none, 1 per-128 fp32 scales a_s [M, K/128], b_s [N, K/128]
    pid_m, pid_n = grouped_tile_ids(M, N, BM, BN, 8)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + rn[None, :] * K + (k + rk)[:, None])
        if SCALE == 0:
            acc = tl.dot(a, b, acc)
        else:
            sa = tl.load(as_ptr + rm * (K // 128) + k // 128)
            sb = tl.load(bs_ptr + rn * (K // 128) + k // 128)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit
def _mx_bf16_kernel(a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, M, N, K,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BITS: tl.constexpr,
                    MMA_DTYPE: tl.constexpr = tl.bfloat16):
    pid_m, pid_n = grouped_tile_ids(M, N, BM, BN, 8)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rkb = tl.arange(0, BK // 32)
    KB = K // 32
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])            # [BM, BK] fp8
        b = tl.load(b_ptr + rn[None, :] * K + (k + rk)[:, None])            # [BK, BN] fp8
        sa = tl.load(as_ptr + rm[:, None] * KB + (k // 32 + rkb)[None, :])  # [BM, BK/32] u8
        sb = tl.load(bs_ptr + rn[None, :] * KB + (k // 32 + rkb)[:, None])  # [BK/32, BN] u8
        if BITS:
            # e4m3 bits -> bf16 bits of value * 2^-120 (normals and subnormals alike), then
            # multiply by 2^(s - 127 + 120) in fp32 and round to bf16 (exact: 4 significant bits).
            ab = a.to(tl.uint8, bitcast=True).to(tl.int32)
            ab = ((ab & 0x80) << 24) | ((ab & 0x7F) << 20)
            af = ab.to(tl.float32, bitcast=True)
            bb = b.to(tl.uint8, bitcast=True).to(tl.int32)
            bb = ((bb & 0x80) << 24) | ((bb & 0x7F) << 20)
            bf = bb.to(tl.float32, bitcast=True)
            # 2^(s - 7) = 2^(min(s+120, 254) - 127) * 2^max(s - 134, 0): two factors, each finite.
            sai = sa.to(tl.int32)
            sbi = sb.to(tl.int32)
            fa = (tl.minimum(sai + 120, 254) << 23).to(tl.float32, bitcast=True)
            fb = (tl.minimum(sbi + 120, 254) << 23).to(tl.float32, bitcast=True)
            af = tl.reshape(af, (BM, BK // 32, 32)) * ((tl.maximum(sai - 134, 0) + 127) << 23).to(tl.float32, bitcast=True)[:, :, None]
            bf = tl.reshape(bf, (BK // 32, 32, BN)) * ((tl.maximum(sbi - 134, 0) + 127) << 23).to(tl.float32, bitcast=True)[:, None, :]
            af = tl.reshape(af, (BM, BK))
            bf = tl.reshape(bf, (BK, BN))
        else:
            af = a.to(tl.float32)
            bf = b.to(tl.float32)
            fa = _e8m0_to_f32(sa)
            fb = _e8m0_to_f32(sb)
        af = tl.reshape(af, (BM, BK // 32, 32)) * fa[:, :, None]
        bf = tl.reshape(bf, (BK // 32, 32, BN)) * fb[:, None, :]
        a16 = tl.reshape(af, (BM, BK)).to(MMA_DTYPE)
        b16 = tl.reshape(bf, (BK, BN)).to(MMA_DTYPE)
        acc = tl.dot(a16, b16, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


def _ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main() -> None:
    from gem_precision import mx_mm_reference, to_mx
    from gem_precision import _triton_gemm as tg

    if not torch.cuda.is_available():
        print("gemm_explore: a GPU design study (FP8 tensor cores); nothing to measure on CPU.")
        return
    dev = "cuda"
    shapes = [(8192, 8192, 8192), (65536, 1024, 1024)]
    rows = []
    for M, N, K in shapes:
        torch.manual_seed(0)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        qa, qb = to_mx(x, scale_mode="rceil"), to_mx(w, scale_mode="rceil")
        a8, b8 = qa.data.contiguous(), qb.data.contiguous()
        sa128 = torch.rand(M, K // 128, device=dev) + 0.5
        sb128 = torch.rand(N, K // 128, device=dev) + 0.5
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        flop = 2 * M * N * K
        tf = lambda ms: flop / ms / 1e9  # noqa: E731
        ref = mx_mm_reference(qa, qb, out_dtype=torch.float32) if M * N * K <= 2**40 else None
        res = {"shape": f"{M}x{N}x{K}", "bf16_mm": tf(_ms(lambda: x @ w.t()))}

        def err():
            if ref is None:
                return None
            return float((c.float() - ref).abs().max() / ref.abs().max())

        for name, BM, BN, BK, warps, stages, scale in [
            ("fp8_plain_128x256x128", 128, 256, 128, 8, 3, 0),
            ("fp8_plain_128x128x128", 128, 128, 128, 8, 4, 0),
            ("fp8_s128_128x128x128", 128, 128, 128, 8, 4, 1),
            ("fp8_s128_64x128x128", 64, 128, 128, 4, 4, 1),
        ]:
            fn = lambda: _fp8_kernel[(M // BM * (N // BN),)](a8, b8, sa128, sb128, c, M, N, K, BM=BM, BN=BN, BK=BK, SCALE=scale, num_warps=warps, num_stages=stages)  # noqa: E731,B023
            try:
                res[name] = tf(_ms(fn))
            except Exception as e:  # noqa: BLE001
                res[name] = f"fail {type(e).__name__}"
        for cfg in tg._GPU_CONFIGS[:3]:
            fn = lambda: tg._launch(qa, qb, c, None, cfg)  # noqa: E731,B023
            res["mx_s32_" + "x".join(map(str, cfg[:5]))] = tf(_ms(fn))
        res["mx_s32_err"] = err()
        for bits in (0, 1):
            for BM, BN, BK, warps, stages in [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3),
                                              (64, 128, 64, 4, 4), (128, 256, 128, 8, 2)]:
                name = f"mx_bf16{'bits' if bits else ''}_{BM}x{BN}x{BK}w{warps}s{stages}"
                fn = lambda: _mx_bf16_kernel[(M // BM * (N // BN),)](a8, b8, qa.scale, qb.scale, c, M, N, K, BM=BM, BN=BN, BK=BK, BITS=bits, num_warps=warps, num_stages=stages)  # noqa: E731,B023
                try:
                    res[name] = tf(_ms(fn))
                    res[name + "_err"] = err()
                except Exception as e:  # noqa: BLE001
                    res[name] = f"fail {type(e).__name__}: {str(e)[:80]}"
        rows.append(res)
        print(json.dumps(res), flush=True)
    # does the shipped kernel use wgmma?
    try:
        k = tg._mx_gemm_kernel
        for key, ck in list(k.device_caches[0][0].items())[:1] if hasattr(k, "device_caches") else []:
            ptx = ck.asm.get("ptx", "")
            print("shipped kernel ptx wgmma:", "wgmma" in ptx, "mma.sync:", "mma.sync" in ptx)
    except Exception as e:  # noqa: BLE001
        print("ptx check failed", e)
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), file=sys.stderr)


if __name__ == "__main__":
    main()
