"""Recipes (which numerics) and convert / convert_to_mxfp8 (which layers).

Recipe names (the trainer's `--precision` values): "mxfp8_floor", "mxfp8_rceil",
"mxfp8_rceil_wgrad_bf16" (MXRecipe: OCP MX, 32-element blocks; MXFP8Linear) and "fp8_block",
"fp8_block_wgrad_bf16" (FP8BlockConfig.from_recipe: 1x128 / 128x128 power-of-two blocks for
Hopper's cuBLAS blockwise GEMM; FP8BlockLinear). `convert` takes any of them.

A recommendation model's dense part is a stack of GEMMs of very different sizes. MXFP8 pays
only where the GEMM is large enough that the tensor-core saving beats the extra passes over
memory that quantization costs (x, W and dY are each read once more and written as FP8), so
the default filter keeps small linears in bf16, and the user names the sensitive ones
(embedding projections, the last layers, task heads) to keep them in bf16 too.
"""

from __future__ import annotations

import enum
import fnmatch
import math
from collections.abc import Callable, Sequence

from torch import nn

from gem_precision._fp8_block import BLOCK, FP8BlockConfig, FP8BlockLinear
from gem_precision._linear import MXFP8Linear, MXLinearConfig


class MXRecipe(enum.Enum):
    """Named MXFP8 recipes; `mx_recipe_config` turns one into an MXLinearConfig."""

    FLOOR = "mxfp8_floor"  # OCP MX spec scale rule, E4M3 everywhere
    RCEIL = "mxfp8_rceil"  # NVIDIA's rule: no element saturates
    RCEIL_WGRAD_BF16 = "mxfp8_rceil_wgrad_bf16"  # as RCEIL, weight gradient kept in bf16


def mx_recipe_config(recipe: MXRecipe | str) -> MXLinearConfig:
    """The MXLinearConfig of a recipe (an MXRecipe or its string value)."""
    try:
        r = MXRecipe(recipe)
    except ValueError:
        raise ValueError(f"{recipe=} must be one of {[m.value for m in MXRecipe]}") from None
    if r is MXRecipe.FLOOR:
        return MXLinearConfig(scale_mode="floor")
    if r is MXRecipe.RCEIL:
        return MXLinearConfig(scale_mode="rceil")
    return MXLinearConfig(scale_mode="rceil", wgrad_bf16=True)


ModuleFilter = Callable[[str, nn.Module], bool]


def default_module_filter(*, min_features: int = 1024, keep_bf16: Sequence[str] = ()) -> ModuleFilter:
    """Filter: a plain nn.Linear with both dims multiple of 32 and >= min_features, whose
    qualified name matches none of the fnmatch patterns in keep_bf16."""

    def keep(name: str, module: nn.Module) -> bool:
        if type(module) is not nn.Linear:
            return False
        if module.in_features % 32 or module.out_features % 32:
            return False
        if min(module.in_features, module.out_features) < min_features:
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in keep_bf16)

    return keep


def convert_to_mxfp8(
    model: nn.Module,
    recipe: MXRecipe | str = MXRecipe.RCEIL,
    module_filter: ModuleFilter | None = None,
    *,
    min_features: int = 1024,
    keep_bf16: Sequence[str] = (),
) -> list[str]:
    """Swap eligible nn.Linear modules of `model` (in place) for MXFP8Linear.

    Args:
        model: any module tree.
        recipe: an MXRecipe (or its value).
        module_filter: (qualified_name, module) -> convert?; default
            `default_module_filter(min_features=..., keep_bf16=...)`. Dims that are not
            multiples of 32 are never converted.
        min_features: default filter's size threshold (small GEMMs stay bf16).
        keep_bf16: default filter's fnmatch patterns of names kept in bf16 (e.g. "head*").
    Returns:
        Qualified names of the converted modules, in model.named_modules() order.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    cfg = mx_recipe_config(recipe)
    filt = module_filter or default_module_filter(min_features=min_features, keep_bf16=keep_bf16)
    return _swap(model, filt, 32, lambda m: MXFP8Linear.from_linear(m, cfg), "MXFP8Linear")


def _swap(model: nn.Module, filt: ModuleFilter, block: int, make: Callable[[nn.Linear], nn.Module],
          cls_name: str) -> list[str]:
    """Replaces every filtered nn.Linear whose dims are multiples of `block` with make(linear)."""
    todo = [
        (name, m) for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not isinstance(m, (MXFP8Linear, FP8BlockLinear))
        and m.in_features % block == 0 and m.out_features % block == 0 and filt(name, m)
    ]
    if isinstance(model, nn.Linear) and todo and todo[0][0] == "":
        raise ValueError(f"model is itself an nn.Linear: wrap it with {cls_name}.from_linear instead")
    for name, m in todo:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(m))
    return [n for n, _ in todo]


def convert(
    model: nn.Module,
    recipe: MXRecipe | str,
    module_filter: ModuleFilter | None = None,
    *,
    min_features: int = 1024,
    keep_bf16: Sequence[str] = (),
    min_speedup: float = 0.0,
) -> list[str]:
    """Swap eligible nn.Linear modules of `model` (in place) for the recipe's linear.

    Args:
        model: any module tree.
        recipe: an MXRecipe or its value ("mxfp8_*": MXFP8Linear, as `convert_to_mxfp8`), or
            "fp8_block" / "fp8_block_wgrad_bf16" (FP8BlockLinear).
        module_filter, min_features, keep_bf16: as in `convert_to_mxfp8`. fp8_block needs
            both dims multiples of 128: other linears (e.g. small head layers) stay bf16.
        min_speedup: fp8_block only: also keep in bf16 every linear whose predicted fwd+bwd
            speed-up over bf16 (`FP8BlockConfig.predicted_speedup`, a per-row cost model of an
            H200, for a large token count) is below this; 0 (the default) converts by size alone.
            Narrow linears (K = N = 1024) predict 1.00x: their GEMM saving is what quantizing
            x and dY costs.
    Returns:
        Qualified names of the converted modules, in model.named_modules() order.
    """
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)) \
            or not (math.isfinite(min_speedup) and min_speedup >= 0):
        raise ValueError(f"min_speedup={min_speedup!r} must be a finite number >= 0")
    if isinstance(recipe, MXRecipe) or (isinstance(recipe, str) and recipe.startswith("mxfp8")):
        if min_speedup:
            raise ValueError(f"min_speedup={min_speedup!r} applies to fp8_block recipes only "
                             f"(MXFP8 on Hopper dequantizes: no cost model); use 0 with {recipe=}")
        return convert_to_mxfp8(model, recipe, module_filter, min_features=min_features, keep_bf16=keep_bf16)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if recipe not in ("fp8_block", "fp8_block_wgrad_bf16"):
        names = [m.value for m in MXRecipe] + ["fp8_block", "fp8_block_wgrad_bf16"]
        raise ValueError(f"{recipe=} must be one of {names}")
    cfg = FP8BlockConfig.from_recipe(recipe)
    size_filt = module_filter or default_module_filter(min_features=min_features, keep_bf16=keep_bf16)

    def filt(name: str, m: nn.Module) -> bool:
        if not size_filt(name, m):
            return False
        assert isinstance(m, nn.Linear)  # _swap asks only about linears
        return not min_speedup or cfg.predicted_speedup(m.in_features, m.out_features) >= min_speedup

    return _swap(model, filt, BLOCK, lambda m: FP8BlockLinear.from_linear(m, cfg), "FP8BlockLinear")
