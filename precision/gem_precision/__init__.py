"""gem_precision: MXFP8 (OCP MX v1.0) formats, Triton quantization, MXFP8 GEMM and linear;
fp8_block (1x128 / 128x128 power-of-two blocks, cuBLAS blockwise FP8 GEMM) for speed on Hopper."""
from gem_precision._fp8_block import FP8BlockConfig, FP8BlockLinear
from gem_precision._formats import MXTensor, to_mx_reference
from gem_precision._gemm import mx_mm, mx_mm_reference
from gem_precision._linear import MXFP8Linear, MXLinearConfig
from gem_precision._quant import to_mx, to_mx_2d_both
from gem_precision._recipes import MXRecipe, convert, convert_to_mxfp8, default_module_filter, mx_recipe_config

__version__ = "0.3.7"
__all__ = [
    "FP8BlockConfig",
    "FP8BlockLinear",
    "MXFP8Linear",
    "MXLinearConfig",
    "MXRecipe",
    "MXTensor",
    "__version__",
    "convert",
    "convert_to_mxfp8",
    "default_module_filter",
    "mx_mm",
    "mx_mm_reference",
    "mx_recipe_config",
    "to_mx",
    "to_mx_2d_both",
    "to_mx_reference",
]
