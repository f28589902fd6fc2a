"""The eager fast path of the q/kv attention ops (JFA, GDPA): one plan per call signature.

Why: issue 15 times eager calls (CUDA events around one call after a sync), so each figure
holds the host time before the kernel starts. On an H100 that was 65-145 us per forward call
(kernels/BENCHMARKS.md, 2026-12-07): the public checks, the path rules, the tile choice and
Triton's launch (its binder and runner). All of those depend only on the call's *signature*:
the tensors' classes, dtypes, devices, strides and [H, D]; the offsets' [B+1]; the host
scalars; the tile configuration the max lengths select; the module switches.

The first eager call with a signature runs the ordinary path (every check, every rule). Where
that call ran our Triton forward, the op keeps a `Plan`. A later call with the same signature
checks what the signature leaves out (`admits`: the row counts, the max lengths, 16-byte
alignment, and on CPU tensors the offsets' contents and the interpreter, as the ordinary path
reads them) and launches the kept binary directly (`gem_kernels._launch.DirectLaunch`).
Anything else takes the ordinary path, which raises the ordinary errors.

Same kernels, same arguments, same specialization: a plan changes host time, not results.
`_block` keeps its own plan (one kernel with rotary tables and no max-length rules).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from gem_kernels._jagged import check_offsets, check_triton_device, debug_checks
from gem_kernels._launch import CachedLaunch, DirectLaunch

MAX_PLANS = 1024  # per op; cleared when full (one plan per dtype, H, D, B, ... met)
_I31 = 1 << 31


def signature(q: Any, k: Any, v: Any, q_offsets: Any, kv_offsets: Any, max_q_len: Any, max_kv_len: Any,
              extra: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The part of a call's signature every q/kv op shares, plus the op's `extra` (its host
    arguments with their classes: `True == 1` and `1 == 1.0` must not match). None where an
    argument has no tensor metadata (the ordinary checks then name it)."""
    try:
        return (extra, max_q_len.__class__, max_kv_len.__class__,
                q.__class__, q.dtype, q.device, q.shape[1:], q.stride(),
                k.__class__, k.dtype, k.device, k.shape[1:], k.stride(),
                v.__class__, v.dtype, v.device, v.shape[1:], v.stride(),
                q_offsets.__class__, q_offsets.dtype, q_offsets.device, q_offsets.shape, q_offsets.stride(),
                kv_offsets.__class__, kv_offsets.dtype, kv_offsets.device, kv_offsets.shape, kv_offsets.stride())
    except (AttributeError, TypeError):
        return None


def int_spec(a: int) -> tuple[bool, bool, bool]:
    """What Triton specializes a varying integer argument on (== 1, divisible by 16, 32-bit):
    part of the signature where a kernel argument depends on T (`_launch.spec_key`)."""
    return a == 1, not a % 16, a < _I31


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What the first call with one signature checked and worked out."""

    recheck: bool  # not on CUDA: the offsets' contents and TRITON_INTERPRET are read every call
    q_row: int  # the row strides `check_row_offsets` bounds max_q_len / max_kv_len by
    kv_row: int
    b: int
    heads: int
    ints: tuple[int, ...]  # the kernel's stride arguments
    meta: dict[str, Any]  # its constexprs and launch options
    launch: CachedLaunch
    direct: DirectLaunch | None  # None: through the CachedLaunch (Triton's interpreter)
    op: Any  # what the op itself keeps (the rules it re-applies per call)


def aligned_pointers(*tensors: torch.Tensor) -> tuple[int, ...] | None:
    """The tensors' data pointers where every one is 16-byte aligned (part of Triton's
    specialization), else None."""
    ptrs = tuple(t.data_ptr() for t in tensors)
    acc = 0
    for p in ptrs:
        acc |= p
    return None if acc & 15 else ptrs


def admits(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
           kv_offsets: torch.Tensor, max_q_len: int, max_kv_len: int) -> tuple[int, ...] | None:
    """For a call whose signature matched `plan`: (q, k, v, q_offsets, kv_offsets data pointers)
    where the plan may serve it, else None (the ordinary path then runs, and raises where the
    values are wrong). Checks what the signature leaves out: rows (T > 0, k and v alike), the
    max lengths (> 0, within `check_row_offsets`' 32-bit bound), 16-byte alignment (part of
    Triton's specialization); on CPU tensors, or with GEM_KERNELS_DEBUG=1, the offsets'
    contents and the device rule, as the ordinary path reads them there (raising its errors)."""
    tq, tk = q.shape[0], k.shape[0]
    if not (tq > 0 and tk > 0 and v.shape[0] == tk and 0 < max_q_len and 0 < max_kv_len
            and max_q_len * plan.q_row < _I31 and max_kv_len * plan.kv_row < _I31):
        return None
    ptrs = aligned_pointers(q, k, v, q_offsets, kv_offsets)
    if ptrs is None:
        return None
    if plan.recheck or debug_checks():
        check_offsets(q_offsets, "q_offsets", total=tq, max_len=max_q_len, max_len_name="max_q_len")
        check_offsets(kv_offsets, "kv_offsets", total=tk, max_len=max_kv_len, max_len_name="max_kv_len")
        check_triton_device(q.device)
    return ptrs


def make(launch: CachedLaunch, args: tuple[Any, ...], meta: dict[str, Any], *, q: torch.Tensor,
         k: torch.Tensor, v: torch.Tensor, b: int, ints: tuple[int, ...], op: Any) -> Plan | None:
    """A plan whose launch is the binary `launch` kept for `args`' specialization (the call
    just made), or None where it kept none (a launch under a profiler's hook)."""
    direct = launch.direct(args, meta)
    if direct is None and not launch.interpret:
        return None
    hd = q.shape[1] * q.shape[2]
    return Plan(recheck=q.device.type != "cuda", q_row=max(hd, q.stride(0)),
                kv_row=max(hd, k.stride(0), v.stride(0)), b=b, heads=q.shape[1], ints=ints, meta=meta,
                launch=launch, direct=direct, op=op)


def keep(plans: dict[tuple[Any, ...], Plan], key: tuple[Any, ...], plan: Plan | None) -> None:
    if plan is None:
        return
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = plan


def run(plan: Plan, grid: tuple[int, int, int], ptr_args: tuple[Any, ...], tensor_args: tuple[Any, ...]) -> None:
    """Launches the plan's binary: directly with `ptr_args` (pointers as ints), else (another
    current device, a launch hook, the interpreter) through its CachedLaunch with
    `tensor_args`."""
    direct = plan.direct
    if direct is None or not direct(grid, ptr_args):
        plan.launch(grid, tensor_args, plan.meta)
