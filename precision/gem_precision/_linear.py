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

from gem_precision._formats import MXTensor, ScaleMode, to_mx_reference
from gem_precision._gemm import mx_mm
from gem_precision._quant import Backend, resolve_backend, to_mx_2d_both


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


def _both(t: torch.Tensor, elem_dtype: torch.dtype, cfg: MXLinearConfig, be: str) -> tuple[MXTensor, MXTensor]:
    if be == "triton":
        return to_mx_2d_both(t, elem_dtype=elem_dtype, scale_mode=cfg.scale_mode, backend="triton")
    r = to_mx_reference(t, elem_dtype=elem_dtype, dim=1, scale_mode=cfg.scale_mode)
    c = to_mx_reference(t.t(), elem_dtype=elem_dtype, dim=1, scale_mode=cfg.scale_mode)
    return r, c


def _row(t: torch.Tensor, elem_dtype: torch.dtype, cfg: MXLinearConfig, be: str) -> MXTensor:
    if be == "triton":
        from gem_precision._triton_quant import quantize_2d
        from gem_precision._formats import elem_format

        r, _ = quantize_2d(t, elem_format(elem_dtype), block_size=32, rceil=cfg.scale_mode == "rceil", row=True, col=None)
        assert r is not None
        return r
    return to_mx_reference(t, elem_dtype=elem_dtype, dim=1, scale_mode=cfg.scale_mode)


class _MXLinearFn(torch.autograd.Function):
    # Autocast is switched off inside: the emulation's fp32 matmuls must stay fp32, and the
    # operands are quantized from whatever dtype they arrive in.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                cfg: MXLinearConfig) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return _MXLinearFn._forward(ctx, x, weight, bias, cfg)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.autocast(device_type=dy.device.type, enabled=False):
            return _MXLinearFn._backward(ctx, dy)

    @staticmethod
    def _forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 cfg: MXLinearConfig) -> torch.Tensor:
        be = resolve_backend(cfg.backend, x)
        K = x.shape[-1]
        x2 = x.reshape(-1, K)
        out_dtype = torch.bfloat16
        need_dx = ctx.needs_input_grad[0]
        need_dw = ctx.needs_input_grad[1]
        xq_t: MXTensor | None = None
        if need_dw and not cfg.wgrad_bf16:
            xq, xq_t = _both(x2, cfg.elem_dtype, cfg, be)
        else:
            xq = _row(x2, cfg.elem_dtype, cfg, be)
        wq_t: MXTensor | None = None
        if need_dx:
            wq, wq_t = _both(weight, cfg.elem_dtype, cfg, be)
        else:
            wq = _row(weight, cfg.elem_dtype, cfg, be)
        b = bias.to(torch.float32) if bias is not None else None
        y = mx_mm(xq, wq, out_dtype=out_dtype, bias=b, backend=be)
        ctx.cfg, ctx.be, ctx.x_shape = cfg, be, x.shape
        ctx.has_bias = bias is not None
        ctx.xq_t, ctx.wq_t = xq_t, wq_t
        ctx.save_for_backward(x2 if (need_dw and cfg.wgrad_bf16) else None)
        ctx.w_dtype = weight.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cfg: MXLinearConfig = ctx.cfg
        be: Backend = ctx.be
        (x2,) = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        if dy2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            dy2 = dy2.float()
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = db = None
        quant_dw = need_dw and not cfg.wgrad_bf16
        if need_dx or quant_dw:
            if quant_dw:
                dyq, dyq_t = _both(dy2, cfg.grad_elem_dtype, cfg, be)
            else:
                dyq, dyq_t = _row(dy2, cfg.grad_elem_dtype, cfg, be), None
            if need_dx:
                dx = mx_mm(dyq, ctx.wq_t, out_dtype=torch.bfloat16, backend=be).reshape(ctx.x_shape)
            if quant_dw:
                assert dyq_t is not None
                dw = mx_mm(dyq_t, ctx.xq_t, out_dtype=ctx.w_dtype, backend=be)
        if need_dw and cfg.wgrad_bf16:
            dw = (dy2.to(torch.bfloat16).t() @ x2.to(torch.bfloat16)).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(ctx.w_dtype)
        ctx.xq_t = ctx.wq_t = None
        return dx, dw, db, None


class MXFP8Linear(nn.Linear):
    """nn.Linear whose forward, input-gradient and weight-gradient GEMMs run in MXFP8.

    Parameters stay in their own dtype (fp32 or bf16 master weights); the output is bf16.
    Input [..., in_features] -> [..., out_features].
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
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{x.shape=} must end in in_features={self.in_features}")
        out: torch.Tensor = _MXLinearFn.apply(x, self.weight, self.bias, self.config)  # type: ignore[no-untyped-call]
        return out

    def extra_repr(self) -> str:
        c = self.config
        return f"{super().extra_repr()}, elem={c.elem_dtype}, scale_mode={c.scale_mode}, wgrad_bf16={c.wgrad_bf16}"
