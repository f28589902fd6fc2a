"""Which linears fp8_block speeds up: a per-token-row cost model of one linear's fwd+bwd.

Blockwise FP8 makes a linear's GEMMs faster but adds passes over memory: x and dY are each read
once more (bf16, 2 bytes an element) and written as FP8 codes (1 byte; the fp32 scales are
1/128 of that). The GEMM work per token row grows with K*N, the quantization traffic with K+N,
so narrow linears lose what wide ones win. For a large token count M (the per-step weight
quantization amortised away), the time per row is

    bf16:                  6*K*N / bf16_flops
    fp8_block_wgrad_bf16:  4*K*N / fp8_flops + 2*K*N / bf16_flops + 3*(K+N) / quant_bytes
    fp8_block:             6*K*N / fp8_flops + 4*(K+N) / quant_bytes

(fp8_block also quantizes x and dY along M for the weight gradient: one more byte each.)
The defaults are one linear's figures on an H200 (precision/BENCHMARKS.md: bf16 fwd+bwd
~650 TFLOP/s, the blockwise FP8 GEMM ~950, the fused quantizer ~3 TB/s over the bytes it
moves). With them, fp8_block_wgrad_bf16 at K = 1024 predicts 1.00x for N = 1024, 1.05x for
2048, 1.07x for 3072 and 1.09x for 4096 (measured 1.12x), and 1.23x at 8192^3 (measured 1.19x);
fp8_block 1.16x at 1024 -> 4096 (measured 1.11x) and 1.39x at 8192^3 (measured 1.31x). So the
model is good to about 6 %, not to the last percent.

The model knows nothing of the ops around a linear. Compiled, a bf16 linear's bias and
the norm before it fuse with their neighbours, and an FP8 linear's custom ops do not, so a
predicted 1.00x is a loss in a compiled step. Use a margin (the trainer asks for 1.05x).
A linear that reads few rows (per-sample features, not the token stream) is launch-bound:
the model does not apply; name it in `keep_bf16` instead.
"""

from __future__ import annotations

import math

# One H200 (SXM, 132 SMs), torch 2.11, cuBLAS blockwise FP8; precision/BENCHMARKS.md.
H200_BF16_TFLOPS = 650.0
H200_FP8_TFLOPS = 950.0
H200_QUANT_GBPS = 3000.0


def fp8_block_speedup(in_features: int, out_features: int, *, wgrad_bf16: bool = False,
                      bf16_tflops: float = H200_BF16_TFLOPS, fp8_tflops: float = H200_FP8_TFLOPS,
                      quant_gbps: float = H200_QUANT_GBPS) -> float:
    """Predicted fwd+bwd speed-up (bf16 time / fp8_block time) of a linear in_features ->
    out_features over a large token count; > 1 means FP8 is faster. See the module docstring."""
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive int")
    for name, f in (("bf16_tflops", bf16_tflops), ("fp8_tflops", fp8_tflops), ("quant_gbps", quant_gbps)):
        if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
            raise ValueError(f"{name}={f!r} must be a positive finite number")
    kn, k_n = float(in_features) * out_features, float(in_features + out_features)
    r16, r8, bw = bf16_tflops * 1e12, fp8_tflops * 1e12, quant_gbps * 1e9
    bf16 = 6 * kn / r16
    fp8 = (4 * kn / r8 + 2 * kn / r16 + 3 * k_n / bw) if wgrad_bf16 else (6 * kn / r8 + 4 * k_n / bw)
    return bf16 / fp8
