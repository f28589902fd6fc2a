"""MXFP8Linear: a drop-in nn.Linear whose three GEMMs run in MXFP8.

forward  y  = q(x) . q(W)^T        x [M, K] and W [N, K] blocked along K
backward dX = q(dY) . q(W^T)^T     dY [M, N] and W^T [K, N] blocked along N
         dW = q(dY^T) . q(x^T)^T   dY^T [N, M] and x^T [K, M] blocked along M
Each operand is blocked along its own contraction dim, so a tensor used twice (x, W, dY) is
cast twice; the Triton path does both casts from one read (`to_mx_2d_both`). The forward
saves the FP8 x^T (1 byte / element + scales) instead of the bf16 x. A token count that is
not a multiple of 32 is zero-padded inside the last block (exact: zeros add nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from gem_precision._formats import MXTensor, ScaleMode
from gem_precision._gemm import mx_mm
from gem_precision._quant import Backend, output_dtype, resolve_backend, to_mx, to_mx_2d_both, weight_rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class MXLinearConfig:
    """How an MXFP8Linear quantizes.

    Attributes:
        elem_dtype: element format of x and W.
        grad_elem_dtype: element format of dY (E4M3 by default; E5M2 trades precision for range).
        scale_mode: "floor" (OCP spec) or "rceil" (NVIDIA).
        wgrad_bf16: compute dW = dY^T x in bf16 (keeps the weight gradient unquantized).
        backend: "auto" (Triton on CUDA, dequantize-and-matmul emulation elsewhere),
            "triton" or "reference".
    """

    elem_dtype: torch.dtype = torch.float8_e4m3fn
    grad_elem_dtype: torch.dtype = torch.float8_e4m3fn
    scale_mode: ScaleMode = "floor"
    wgrad_bf16: bool = False
    backend: Backend = "auto"


def _both(t: torch.Tensor, elem_dtype: torch.dtype, mode: ScaleMode, be: Backend) -> tuple[MXTensor, MXTensor]:
    """t [R, C] -> (t along C, t.T along R), one read on the Triton path (custom op when compiling)."""
    return to_mx_2d_both(t, elem_dtype=elem_dtype, scale_mode=mode, backend=be)


def _row(t: torch.Tensor, elem_dtype: torch.dtype, mode: ScaleMode, be: Backend) -> MXTensor:
    """t [R, C] blocked along C (custom op when compiling)."""
    return to_mx(t, elem_dtype=elem_dtype, dim=1, scale_mode=mode, pad=True, backend=be)


def _mx(codes: torch.Tensor, scale: torch.Tensor, elem_dtype: torch.dtype) -> MXTensor:
    return MXTensor(data=codes.view(elem_dtype), scale=scale, dim=1, block_size=32, elem_dtype=elem_dtype)


class _MXLinearFn(torch.autograd.Function):
    # Written so torch.compile (Dynamo) can trace forward and backward into one graph: every
    # kernel is a gem_precision custom op, the config arrives as plain arguments, and only
    # tensors are saved (through save_for_backward). Autocast is switched off inside: the
    # emulation's fp32 matmuls must stay fp32, and operands are quantized from whatever dtype
    # they arrive in.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                elem: torch.dtype, grad_elem: torch.dtype, mode: ScaleMode, wgrad_bf16: bool, be: Backend,
                out_dtype: torch.dtype) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            K = x.shape[-1]
            x2 = x.reshape(-1, K)
            need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            quant_dw = need_dw and not wgrad_bf16
            if quant_dw:
                xq, xq_t = _both(x2, elem, mode, be)
            else:
                xq = _row(x2, elem, mode, be)
            if need_dx:
                wq, wq_t = _both(weight, elem, mode, be)
            else:
                wq = _row(weight, elem, mode, be)
            b = bias.to(torch.float32) if bias is not None else None
            y = mx_mm(xq, wq, out_dtype=torch.bfloat16, bias=b, backend=be)
            saved: list[torch.Tensor] = []
            if quant_dw:
                saved += [xq_t.data.view(torch.uint8), xq_t.scale]  # FP8 x^T instead of bf16 x
            if need_dx:
                saved += [wq_t.data.view(torch.uint8), wq_t.scale]
            if need_dw and wgrad_bf16:
                saved.append(x2)
            ctx.save_for_backward(*saved)
            ctx.elem, ctx.grad_elem, ctx.mode, ctx.wgrad_bf16, ctx.be = elem, grad_elem, mode, wgrad_bf16, be
            ctx.x_shape, ctx.w_dtype, ctx.has_bias = x.shape, weight.dtype, bias is not None
            return y.reshape(*x.shape[:-1], weight.shape[0]).to(out_dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.autocast(device_type=dy.device.type, enabled=False):
            saved = list(ctx.saved_tensors)
            need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            quant_dw = need_dw and not ctx.wgrad_bf16
            xq_t = _mx(saved.pop(0), saved.pop(0), ctx.elem) if quant_dw else None
            wq_t = _mx(saved.pop(0), saved.pop(0), ctx.elem) if need_dx else None
            x2 = saved.pop(0) if (need_dw and ctx.wgrad_bf16) else None
            dy2 = dy.reshape(-1, dy.shape[-1])
            if dy2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                dy2 = dy2.float()
            dx = dw = db = None
            if need_dx or quant_dw:
                dyq_t: MXTensor | None = None
                if quant_dw:
                    dyq, dyq_t = _both(dy2, ctx.grad_elem, ctx.mode, ctx.be)
                else:
                    dyq = _row(dy2, ctx.grad_elem, ctx.mode, ctx.be)
                if need_dx:
                    assert wq_t is not None
                    dx = mx_mm(dyq, wq_t, out_dtype=torch.bfloat16, backend=ctx.be).reshape(ctx.x_shape)
                if quant_dw:
                    assert dyq_t is not None and xq_t is not None
                    dw = mx_mm(dyq_t, xq_t, out_dtype=ctx.w_dtype, backend=ctx.be)
            if x2 is not None:
                dw = (dy2.to(torch.bfloat16).t() @ x2.to(torch.bfloat16)).to(ctx.w_dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = dy2.float().sum(0).to(ctx.w_dtype)
            return dx, dw, db, None, None, None, None, None, None


class MXFP8Linear(nn.Linear):
    """nn.Linear whose forward, input-gradient and weight-gradient GEMMs run in MXFP8.

    Parameters stay in their own dtype (fp32 or bf16 master weights). The output dtype is
    nn.Linear's: the autocast dtype under autocast, else x's (the GEMM writes bf16, then a cast;
    before gem-precision 0.3.7 always bf16). Input [..., in_features] -> [..., out_features].
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 config: MXLinearConfig | None = None, device: Any = None, dtype: Any = None) -> None:
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if v % 32:
                raise ValueError(f"{name}={v} must be a multiple of 32 (the MX block)")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.config = config or MXLinearConfig()

    @classmethod
    def from_linear(cls, lin: nn.Linear, config: MXLinearConfig | None = None) -> MXFP8Linear:
        """Wraps lin's parameters (shared, not copied) in an MXFP8Linear."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for name, v in (("in_features", lin.in_features), ("out_features", lin.out_features)):
            if v % 32:
                raise ValueError(f"{name}={v} must be a multiple of 32 (the MX block)")
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        new.bias = lin.bias
        new.config = config or MXLinearConfig()
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.weight, self.bias)

    def forward_slice(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """`forward(x)[..., start:stop]`, computed from weight rows `start:stop` alone (one
        projection of a fused one, e.g. q from a q/k/v weight, for other rows than k and v).
        Both bounds multiples of 32: the weight's MX blocks along either axis, and so its
        codes and scales, are the full forward's."""
        return self._linear(x, *weight_rows(self, start, stop, 32))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{x.shape=} must end in in_features={self.in_features}")
        c = self.config
        be = resolve_backend(c.backend, x)
        out: torch.Tensor = _MXLinearFn.apply(  # type: ignore[no-untyped-call]
            x, weight, bias, c.elem_dtype, c.grad_elem_dtype, c.scale_mode, c.wgrad_bf16, be, output_dtype(x))
        return out

    def extra_repr(self) -> str:
        c = self.config
        return f"{super().extra_repr()}, elem={c.elem_dtype}, scale_mode={c.scale_mode}, wgrad_bf16={c.wgrad_bf16}"
