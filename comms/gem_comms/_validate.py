"""Local argument checks, run before any byte moves (and before any peer is contacted).

Every error names the argument, its value and the rule, so a wrong call fails on the rank
that made it instead of hanging or corrupting a peer. Cross-rank agreement (all ranks
passing matching sizes) is checked by the copy-engine backend through its metadata exchange.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BACKENDS = ("auto", "copy_engine", "nccl", "gloo")


def check_backend(backend: object) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"{backend=} must be one of {BACKENDS}")
    return backend


def check_pair(output: object, input: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Type, dtype, device and layout rules shared by the three collectives."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a torch.Tensor, got {type(output).__name__}")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if output.dtype != input.dtype:
        raise ValueError(f"{output.dtype=} must equal {input.dtype=}")
    if output.device != input.device:
        raise ValueError(f"{output.device=} must equal {input.device=}")
    if not input.is_contiguous():
        raise ValueError(f"input must be contiguous (strides {input.stride()}, shape {tuple(input.shape)})")
    if not output.is_contiguous():
        raise ValueError(f"output must be contiguous (strides {output.stride()}, shape {tuple(output.shape)})")
    if output.requires_grad and output.is_leaf:
        raise ValueError("output must not be a leaf tensor that requires grad (it is written in place)")
    return output, input


def check_gather(output: torch.Tensor, input: torch.Tensor, world: int) -> None:
    if output.numel() != world * input.numel():
        raise ValueError(
            f"output.numel()={output.numel()} must be world_size * input.numel() = "
            f"{world} * {input.numel()} = {world * input.numel()}"
        )


def check_scatter(output: torch.Tensor, input: torch.Tensor, world: int) -> None:
    if input.numel() != world * output.numel():
        raise ValueError(
            f"input.numel()={input.numel()} must be world_size * output.numel() = "
            f"{world} * {output.numel()} = {world * output.numel()}"
        )


def _splits(name: str, splits: Sequence[int] | None, rows: int, world: int, tensor_name: str) -> list[int]:
    if splits is None:
        if rows % world:
            raise ValueError(
                f"{tensor_name}.shape[0]={rows} must be divisible by world_size={world} when {name} is None"
            )
        return [rows // world] * world
    if isinstance(splits, torch.Tensor):
        splits = [int(s) for s in splits.tolist()]
    out = list(splits)
    if len(out) != world:
        raise ValueError(f"{name} has {len(out)} entries ({out}); it must have world_size={world}")
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"{name}={out} must hold non-negative ints")
    if sum(out) != rows:
        raise ValueError(f"sum({name})={sum(out)} must equal {tensor_name}.shape[0]={rows} ({name}={out})")
    return out


def check_all_to_all(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    world: int,
) -> tuple[list[int], list[int]]:
    """Returns (output_splits, input_splits) in rows of dim 0."""
    if input.dim() == 0 or output.dim() == 0:
        raise ValueError(f"input and output must have at least one dim ({input.shape=}, {output.shape=})")
    if tuple(input.shape[1:]) != tuple(output.shape[1:]):
        raise ValueError(f"{input.shape=} and {output.shape=} must agree beyond dim 0 (rows are exchanged)")
    ins = _splits("input_split_sizes", input_split_sizes, input.shape[0], world, "input")
    outs = _splits("output_split_sizes", output_split_sizes, output.shape[0], world, "output")
    return outs, ins
