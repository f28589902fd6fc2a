"""gem_precision: MXFP8 (OCP MX v1.0) formats, Triton quantization, MXFP8 GEMM and linear."""
from gem_precision._formats import MXTensor, to_mx_reference
from gem_precision._gemm import mx_mm, mx_mm_reference
from gem_precision._linear import MXFP8Linear, MXLinearConfig
from gem_precision._quant import to_mx, to_mx_2d_both
from gem_precision._recipes import MXRecipe, convert_to_mxfp8, default_module_filter, mx_recipe_config

__version__ = "0.2.1"
__all__ = [
    "MXFP8Linear",
    "MXLinearConfig",
    "MXRecipe",
    "MXTensor",
    "__version__",
    "convert_to_mxfp8",
    "default_module_filter",
    "mx_mm",
    "mx_mm_reference",
    "mx_recipe_config",
    "to_mx",
    "to_mx_2d_both",
    "to_mx_reference",
]
