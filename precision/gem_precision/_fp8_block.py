"""fp8_block: FP8 training that is faster than bf16 on Hopper (cuBLAS blockwise-scaled FP8 GEMM).

Hopper's tensor cores have no block-scaled MMA, so MXFP8's per-32 scales cost CUDA-core work
inside the K loop (our MXFP8 path dequantizes instead, ~0.85x bf16). cuBLAS (>= 12.9) has a
Hopper GEMM that applies one fp32 scale per 128 of K when it promotes the FP8 partial sums to
fp32 — the DeepSeek-V3 recipe (arXiv 2412.19437, §3.3): activations and gradients in 1x128
blocks, weights in 128x128 blocks. This file is that recipe as an nn.Linear:

    forward  y  = x . W^T      x [M, K]: 1x128 along K     W [N, K]: 128x128 tiles
    dgrad    dX = dY . W       dY [M, N]: 1x128 along N    W^T [K, N]: the same tiles, transposed
    wgrad    dW = dY^T . X     dY^T [N, M] and X^T [K, M]: 1x128 along the tokens M
                               (or bf16: `wgrad_bf16`)

Every operand is E4M3 with one power-of-two scale per block (an E8M0 value: the smallest
2^e with block amax / 2^e <= 448, so no element saturates and scaling is exact; e in
[-126, 126]). The scale is found from the amax's exponent and mantissa bits, no division, so
eager, torch.compile'd and CPU code give the same codes bit for bit. A block holding NaN/Inf
gets a NaN scale (the GEMM outputs that depend on it are NaN, never a saturated 448).

Layouts (torch's `_scaled_mm_v2` checks, test/test_scaled_matmul_cuda.py): `F.scaled_mm(a, b)`
takes a [M, K] row-major and b [K, N] column-major; a 1x128 scale of an operand with R
outer rows is [R, K/128] with strides (1, R) ("outer-dim-major"); a 128x128 scale of b is
[round_up(K/128, 4), N/128] with strides (1, round_up(K/128, 4)) (rows padded to 16 bytes).
Only E4M3 x E4M3 is accepted for these scalings, on SM90 only. Feature dims must be multiples
of 128 (`FP8BlockLinear` refuses others; `convert` leaves such layers in bf16); a token count
that is not a multiple of 128 is zero-padded (exact: zero rows add nothing, and a zero never
changes a block's amax).

backend "reference" (CPU, and "auto" off CUDA) dequantizes the same codes to fp32 and
matmuls: the exact emulation. On CUDA the three quantizations run through torch.compile
(fused reductions; inside an already compiled model they are traced into its graph), or, with
quant="auto" (the default: "triton" on CUDA) or "triton", x and dY each go through one Triton
pass that writes both their 1x128-along-K codes and the transposed 1x128-along-M codes
(`_triton_fp8_block.py`, bit-exact with the torch quantizers: 3.2-3.6x faster on an H200, a
linear's fwd+bwd 1.5-1.7x faster than with the torch quantizers); weights stay on torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from gem_precision._fp8_cost import H200_BF16_TFLOPS, H200_FP8_TFLOPS, H200_QUANT_GBPS, fp8_block_speedup
from gem_precision._quant import interpreting, output_dtype, weight_rows

BLOCK = 128
E4M3 = torch.float8_e4m3fn
Backend = Literal["auto", "cublas", "reference"]
Quant = Literal["auto", "torch", "triton"]
QUANT_ENV = "GEM_FP8_QUANT"
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FP8BlockConfig:
    """How an FP8BlockLinear computes.

    Attributes:
        wgrad_bf16: dW = dY^T x in bf16 (saves the bf16 x instead of the FP8 x^T).
        backend: "auto" (cuBLAS on CUDA, emulation elsewhere), "cublas" or "reference".
        compile_quant: on CUDA, run the torch quantizations through torch.compile when the
            caller is not compiling already (plain torch ops run ~6 passes over memory each).
        quant: how x and dY are quantized: "torch" (the functions below), "triton" (one
            fused pass per tensor for both layouts, bit-identical codes; on CUDA, or on CPU
            under TRITON_INTERPRET=1; other CPU runs use "torch", which gives the same codes)
            or "auto" (the default: "triton" on CUDA, "torch" elsewhere; on the H200 the
            fused pass makes a linear's fwd+bwd 1.5-1.7x faster, precision/BENCHMARKS.md).
            Weights always use the torch path.
    """

    wgrad_bf16: bool = False
    backend: Backend = "auto"
    compile_quant: bool = True
    quant: Quant = "auto"

    @classmethod
    def from_recipe(cls, recipe: str) -> FP8BlockConfig:
        """"fp8_block" (FP8 wgrad, DeepSeek-V3 style) or "fp8_block_wgrad_bf16"; `quant` from
        the environment variable GEM_FP8_QUANT ("auto", "torch" or "triton"; unset: "auto"),
        the A/B switch for a model whose layers a recipe name converts (the trainer's)."""
        quant = os.environ.get(QUANT_ENV, "auto")
        if quant not in ("auto", "torch", "triton"):
            raise ValueError(f"{QUANT_ENV}={quant!r} must be 'auto', 'torch' or 'triton'")
        if recipe == "fp8_block":
            return cls(quant=quant)  # type: ignore[arg-type]
        if recipe == "fp8_block_wgrad_bf16":
            return cls(wgrad_bf16=True, quant=quant)  # type: ignore[arg-type]
        raise ValueError(f"{recipe=} must be 'fp8_block' or 'fp8_block_wgrad_bf16'")

    def predicted_speedup(self, in_features: int, out_features: int, *, bf16_tflops: float = H200_BF16_TFLOPS,
                          fp8_tflops: float = H200_FP8_TFLOPS, quant_gbps: float = H200_QUANT_GBPS) -> float:
        """Predicted fwd+bwd speed-up over bf16 of a linear in_features -> out_features in this
        recipe (`wgrad_bf16` decides), for a large token count: the per-row cost model of
        `_fp8_cost.py`, with an H200's figures unless given another GPU's. > 1: FP8 is faster."""
        return fp8_block_speedup(in_features, out_features, wgrad_bf16=self.wgrad_bf16, bf16_tflops=bf16_tflops,
                                 fp8_tflops=fp8_tflops, quant_gbps=quant_gbps)


# --- quantization (plain torch ops: the specification, and what torch.compile fuses) -------

def _pow2_scale(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """amax (fp32, >= 0) -> (scale = 2^e, 1/scale), e the smallest with amax / 2^e <= 448.

    amax = 1.m * 2^E; 448 = 1.75 * 2^8, so e = E - 8 if 1.m <= 1.75 else E - 7 (integer
    arithmetic on the bits: exact everywhere, unlike a division or log2)."""
    bits = amax.contiguous().view(torch.int32)
    big = ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)  # mantissa above 0.75 (1.m > 1.75)
    e = ((bits >> 23) - (127 + 8) + big).clamp(-126, 126)
    scale = ((e + 127) << 23).view(torch.float32)
    inv = ((127 - e) << 23).view(torch.float32)
    return torch.where(torch.isfinite(amax), scale, float("nan")), inv


def _check(t: torch.Tensor, name: str, rows: int, cols: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name}.dtype={t.dtype} must be one of {_FLOATS}")
    if t.dim() != 2:
        raise ValueError(f"{name}.shape={tuple(t.shape)} must be 2-D")
    for d, m in ((0, rows), (1, cols)):
        if m > 1 and t.shape[d] % m:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: dim {d} must be a multiple of {m} (the block)")


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1x128 blocks along the last dim: t [R, C] -> (codes [R, C] E4M3, scale [R, C/128] fp32)."""
    _check(t, "t", 1, BLOCK)
    R, C = t.shape
    b = t.reshape(R, C // BLOCK, BLOCK).float()
    scale, inv = _pow2_scale(b.abs().amax(-1))
    return (b * inv[..., None]).to(E4M3).reshape(R, C), scale


def quantize_cols(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x1 blocks along dim 0, codes written transposed: t [R, C] -> (codes of t^T [C, R]
    E4M3 contiguous, scale [R/128, C] fp32). scale.t() is t^T's 1x128 scale [C, R/128] and
    already has the strides (1, C) cuBLAS wants."""
    _check(t, "t", BLOCK, 1)
    R, C = t.shape
    b = t.reshape(R // BLOCK, BLOCK, C).float()
    scale, inv = _pow2_scale(b.abs().amax(1))
    return (b * inv[:, None, :]).to(E4M3).reshape(R, C).t().contiguous(), scale


def quantize_tiles(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128 tiles: t [R, C] -> (codes [R, C] E4M3, scale [R/128, C/128] fp32)."""
    _check(t, "t", BLOCK, BLOCK)
    R, C = t.shape
    b = t.reshape(R // BLOCK, BLOCK, C // BLOCK, BLOCK).float()
    scale, inv = _pow2_scale(b.abs().amax((1, 3)))
    return (b * inv[:, None, :, None]).to(E4M3).reshape(R, C), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, *, tiles: bool = False) -> torch.Tensor:
    """codes [R, C] with a 1x128 scale [R, C/128] (or, tiles, a 128x128 scale [R/128, C/128]) -> fp32."""
    s = scale.float().repeat_interleave(BLOCK, 1)
    if tiles:
        s = s.repeat_interleave(BLOCK, 0)
    return codes.float() * s


# --- GEMM ------------------------------------------------------------------------------------

def _outer_major(s: torch.Tensor) -> torch.Tensor:
    """The same [R, C] values with strides (1, R) (cuBLAS's 1x128 scale layout)."""
    if s.stride(0) == 1 and (s.shape[1] == 1 or s.stride(1) == s.shape[0]):
        return s
    return s.t().contiguous().t()


def _tile_scale(s: torch.Tensor) -> torch.Tensor:
    """b's tile scale [N/128, K/128] -> [round_up(K/128, 4), N/128], strides (1, round_up)."""
    kb = s.shape[1]
    pad = -kb % 4
    if pad:
        s = nn.functional.pad(s, (0, pad), value=1.0)
    return s.contiguous().t()


def block_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
             b_tiles: bool, out_dtype: torch.dtype, bias: torch.Tensor | None = None,
             backend: Literal["cublas", "reference"] = "reference") -> torch.Tensor:
    """a . b^T in out_dtype (+ bias [N]).

    Args:
        a: [M, K] E4M3 codes, row-major; a_scale: its 1x128 scale [M, K/128] (any strides).
        b: [N, K] E4M3 codes, row-major; b_scale: its 1x128 scale [N, K/128], or (b_tiles)
            its 128x128 scale [N/128, K/128].
        out_dtype: fp32, bf16 or fp16 (cuBLAS takes a bias only with a 16-bit output).
        bias: [N] in out_dtype, or None.
        backend: "cublas" (torch.nn.functional.scaled_mm, SM90) or "reference" (dequantize,
            fp32 matmul).
    """
    if backend == "reference":
        ref = dequantize(a, a_scale) @ dequantize(b, b_scale, tiles=b_tiles).t()
        if bias is not None:
            ref = ref + bias.float()
        return ref.to(out_dtype)
    if not hasattr(torch.nn.functional, "scaled_mm"):
        raise RuntimeError(f"backend='cublas' needs torch.nn.functional.scaled_mm (torch >= 2.10), got torch {torch.__version__}")
    out: torch.Tensor = torch.ops.gem_precision.fp8_block_mm(a, a_scale, b, b_scale, b_tiles, out_dtype, bias)
    return out


# cuBLAS's blockwise GEMM as a custom op: torch 2.11's dynamo cannot trace the builtin behind
# F.scaled_mm (`_scaled_mm_v2`, "marked as skipped"), so a compiled block (fullgraph) would
# fail on the H200; as an op with a fake (shape-only) implementation it is one opaque node.
@torch.library.custom_op("gem_precision::fp8_block_mm", mutates_args=())
def _fp8_block_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                  b_tiles: bool, out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    F: Any = torch.nn.functional
    ST = F.ScalingType
    sb = _tile_scale(b_scale) if b_tiles else _outer_major(b_scale)
    out: torch.Tensor = F.scaled_mm(a, b.t(), _outer_major(a_scale), ST.BlockWise1x128, sb,
                                    ST.BlockWise128x128 if b_tiles else ST.BlockWise1x128,
                                    bias=bias, output_dtype=out_dtype)
    return out


@_fp8_block_mm.register_fake
def _fp8_block_mm_fake(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                       b_tiles: bool, out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


# --- the linear ------------------------------------------------------------------------------

_COMPILED: dict[str, Callable[..., Any]] = {}


def _quant(fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], be: str, compile_quant: bool
           ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """fn itself, or (CUDA, eager caller) its torch.compile'd version (one per function)."""
    if be != "cublas" or not compile_quant or torch.compiler.is_compiling():
        return fn
    c = _COMPILED.get(fn.__name__)
    if c is None:
        c = _COMPILED[fn.__name__] = torch.compile(fn, dynamic=True)
    return c


_Pair = tuple[torch.Tensor, torch.Tensor]


def _tracing() -> bool:
    """Under torch.compile: the token count may be symbolic, and testing it would add a guard."""
    return torch.compiler.is_compiling()


def _fused_quant(t: torch.Tensor, rows: bool, cols: bool) -> tuple[_Pair | None, _Pair | None]:
    """quant="triton": (quantize_rows(t) if rows, quantize_cols(t) if cols) from one Triton pass
    (imported here: triton loads only when a layer asks for it)."""
    from gem_precision._triton_fp8_block import fused_quant as fq

    return fq(t, rows, cols)


def _grad_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _FLOATS else torch.float32


class _FP8BlockFn(torch.autograd.Function):
    # Traceable by Dynamo: plain torch ops, the custom ops gem_precision::fp8_block_mm (and
    # fp8_block_quant) with fake implementations, config as plain arguments, only tensors saved. Autocast is off inside: the operands are quantized
    # from whatever dtype they arrive in, and the emulation's matmuls must stay fp32.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                wgrad_bf16: bool, be: Literal["cublas", "reference"], compile_quant: bool,
                fused: bool, out_dtype: torch.dtype) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            K, N = x.shape[-1], weight.shape[0]
            x2 = x.reshape(-1, K)
            M = x2.shape[0]
            pad = -M % BLOCK
            need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            need_xt = need_dw and not wgrad_bf16
            xr: _Pair | None = None
            xt: _Pair | None = None
            if fused:  # x read once for both layouts (x^T's codes are kept for the wgrad); the
                # quantizer pads to 128 rows itself (zero rows, no padded copy of x)
                xr, xt = _fused_quant(x2, True, need_xt)
            # the torch quantizers' input (`fused` first: a traced `pad` test would guard on the
            # token count's remainder mod 128 and recompile when a batch crosses it; compiled,
            # the torch path always pads: inductor fuses the zero rows into the quantizer)
            x2p = nn.functional.pad(x2, (0, 0, 0, pad)) if not fused and (_tracing() or pad) else x2
            xq, xs = xr if xr is not None else _quant(quantize_rows, be, compile_quant)(x2p)
            wq, ws = _quant(quantize_tiles, be, compile_quant)(weight)
            b = bias.to(torch.bfloat16) if bias is not None else None
            y = block_mm(xq, xs, wq, ws, b_tiles=True, out_dtype=torch.bfloat16, bias=b, backend=be)
            saved: list[torch.Tensor] = []
            if need_dx:
                saved += [wq.t().contiguous(), ws]  # W^T [K, N]: its tiles are W's, transposed
            if need_xt:  # FP8 x^T, not bf16 x
                saved += list(xt if xt is not None else _quant(quantize_cols, be, compile_quant)(x2p))
            elif need_dw:
                saved.append(x2)  # (its M rows: the bf16 wgrad needs no padding)
            ctx.save_for_backward(*saved)
            ctx.cfg = (wgrad_bf16, be, compile_quant, fused, M, x.shape, _grad_dtype(x.dtype), weight.dtype,
                       bias is not None)
            return y[:M].reshape(*x.shape[:-1], N).to(out_dtype)  # (the padded rows' outputs dropped)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        wgrad_bf16, be, cq, fused, M, x_shape, x_dtype, w_dtype, has_bias = ctx.cfg
        with torch.autocast(device_type=dy.device.type, enabled=False):
            saved = list(ctx.saved_tensors)
            need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            dy2 = dy.reshape(-1, dy.shape[-1])
            if dy2.dtype not in _FLOATS:
                dy2 = dy2.float()
            pad = -M % BLOCK
            dx = dw = db = None
            need_dyt = need_dw and not wgrad_bf16
            dyr: _Pair | None = None
            dyt: _Pair | None = None
            if fused and (need_dx or need_dyt):  # dY read once for both layouts (padded inside)
                dyr, dyt = _fused_quant(dy2, need_dx, need_dyt)
            dy2p = nn.functional.pad(dy2, (0, 0, 0, pad)) if not fused and (_tracing() or pad) else dy2
            if need_dx:
                wtq, ws = saved.pop(0), saved.pop(0)
                dyq, dys = dyr if dyr is not None else _quant(quantize_rows, be, cq)(dy2p)
                dx = block_mm(dyq, dys, wtq, ws.t(), b_tiles=True, out_dtype=x_dtype, backend=be)
                dx = dx[:M].reshape(x_shape)
            if need_dyt:
                xtq, xts = saved.pop(0), saved.pop(0)
                dytq, dyts = dyt if dyt is not None else _quant(quantize_cols, be, cq)(dy2p)
                out = w_dtype if w_dtype in _FLOATS else torch.float32
                dw = block_mm(dytq, dyts.t(), xtq, xts.t(), b_tiles=False, out_dtype=out, backend=be).to(w_dtype)
            elif need_dw:
                x2 = saved.pop(0)
                dw = (dy2.to(torch.bfloat16).t() @ x2.to(torch.bfloat16)).to(w_dtype)
            if has_bias and ctx.needs_input_grad[2]:
                # fp32 accumulation reading dY as it is: no fp32 copy of dY (on the H200 the
                # copy and a fp32 sum were 4.2 of 13.7 ms of a 262k x 1024->4096 fwd+bwd)
                db = dy2.sum(0, dtype=torch.float32).to(w_dtype)
            return dx, dw, db, None, None, None, None, None


_SM: dict[int, tuple[int, int]] = {}


def _fused(quant: str, x: torch.Tensor) -> bool:
    """Whether x and dY go through the fused Triton quantizer: quant="triton" on a tensor
    Triton can run on (CUDA, or the CPU interpreter), quant="auto" on CUDA only (CPU runs keep
    the torch quantizers, interpreter or not: the same codes, far faster there)."""
    if quant not in ("auto", "torch", "triton"):
        raise ValueError(f"{quant=} must be 'auto', 'torch' or 'triton'")
    if quant == "auto":
        return x.is_cuda
    return quant == "triton" and (x.is_cuda or interpreting())


def _resolve(backend: str, x: torch.Tensor) -> Literal["cublas", "reference"]:
    if backend not in ("auto", "cublas", "reference"):
        raise ValueError(f"{backend=} must be 'auto', 'cublas' or 'reference'")
    if backend == "reference" or (backend == "auto" and not x.is_cuda):
        return "reference"
    if not x.is_cuda:
        raise ValueError(f"{backend=} needs a CUDA tensor (got device {x.device})")
    if not torch.compiler.is_compiling():
        idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if idx not in _SM:
            _SM[idx] = torch.cuda.get_device_capability(idx)
        if _SM[idx][0] != 9:
            raise ValueError(f"fp8_block's cuBLAS GEMM (1x128/128x128 scales) runs on SM90 (Hopper) only, "
                             f"got sm_{_SM[idx][0]}{_SM[idx][1]}: use an mxfp8_* recipe there, or backend='reference'")
    return "cublas"


class FP8BlockLinear(nn.Linear):
    """nn.Linear whose forward, input-gradient and weight-gradient GEMMs run in blockwise FP8.

    Parameters stay in their own dtype (fp32 or bf16 master weights). The output dtype is
    nn.Linear's: the autocast dtype under autocast, else x's (the GEMM writes bf16, then a cast;
    before gem-precision 0.3.7 always bf16). Input [..., in_features] -> [..., out_features];
    both feature counts multiples of 128.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 config: FP8BlockConfig | None = None, device: Any = None, dtype: Any = None) -> None:
        _check_features(in_features, out_features)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.config = config or FP8BlockConfig()

    @classmethod
    def from_linear(cls, lin: nn.Linear, config: FP8BlockConfig | None = None) -> FP8BlockLinear:
        """Wraps lin's parameters (shared, not copied) in an FP8BlockLinear."""
        _check_features(lin.in_features, lin.out_features)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        new.bias = lin.bias
        new.config = config or FP8BlockConfig()
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.weight, self.bias)

    def forward_slice(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """`forward(x)[..., start:stop]`, computed from weight rows `start:stop` alone (one
        projection of a fused one, e.g. q from a q/k/v weight, for other rows than k and v).
        Both bounds multiples of 128: the weight's 128x128 tiles, and so the codes and scales,
        are the full forward's."""
        return self._linear(x, *weight_rows(self, start, stop, BLOCK))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
            raise TypeError(f"x.dtype={getattr(x, 'dtype', type(x).__name__)} must be one of {_FLOATS}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{x.shape=} must end in in_features={self.in_features}")
        c = self.config
        out: torch.Tensor = _FP8BlockFn.apply(  # type: ignore[no-untyped-call]
            x, weight, bias, c.wgrad_bf16, _resolve(c.backend, x), c.compile_quant, _fused(c.quant, x),
            output_dtype(x))
        return out

    def extra_repr(self) -> str:
        c = self.config
        return f"{super().extra_repr()}, fp8_block, wgrad_bf16={c.wgrad_bf16}, quant={c.quant}"


def _check_features(in_features: int, out_features: int) -> None:
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if v % BLOCK:
            raise ValueError(f"{name}={v} must be a multiple of {BLOCK} (the fp8_block block; "
                             "convert() keeps such layers in bf16)")
