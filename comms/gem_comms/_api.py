"""The public collectives: `torch.distributed` signatures plus `backend=` and `timeout=`.

Which backend moves the bytes:

| collective              | copy_engine                       | why                                   |
|-------------------------|-----------------------------------|---------------------------------------|
| all_gather_into_tensor  | DMA copies only                   | pure data movement                    |
| all_to_all_single       | DMA copies only                   | pure data movement                    |
| reduce_scatter_tensor   | DMA copies + one local reduction  | a sum needs arithmetic: SMs do it     |

`auto` never picks copy_engine for reduce-scatter across ranks: NCCL fuses the reduction into
its ring and moves 1/world of the bytes per step, the copy-engine variant gathers all world
shards (world x the bytes into a temporary) and then runs an SM reduction kernel, so it only
pays off when SM time is scarcer than memory and bandwidth. It is offered, labelled, for that.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist

from gem_comms import _peer
from gem_comms._handle import CommHandle
from gem_comms._validate import check_all_to_all, check_backend, check_gather, check_pair, check_scatter

Backend = Literal["auto", "copy_engine", "nccl", "gloo"]

_REDUCTIONS = {
    "sum": lambda t: t.sum(0),
    "avg": lambda t: t.mean(0),
    "max": lambda t: t.amax(0),
    "min": lambda t: t.amin(0),
    "product": lambda t: t.prod(0),
}


def _op_name(op: object) -> str:
    for name, ref in (
        ("sum", dist.ReduceOp.SUM),
        ("avg", dist.ReduceOp.AVG),
        ("max", dist.ReduceOp.MAX),
        ("min", dist.ReduceOp.MIN),
        ("product", dist.ReduceOp.PRODUCT),
    ):
        if op == ref:
            return name
    raise ValueError(f"{op=} is not supported; use ReduceOp.SUM, AVG, MAX, MIN or PRODUCT")


def _device(t: torch.Tensor) -> torch.device:
    if t.device.type == "cuda" and t.device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def resolve_backend(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    backend: Backend = "auto",
    *,
    reduction: bool = False,
    timeout: float | None = None,
    nbytes: int | None = None,
) -> str:
    """The backend a collective on `tensor` over `group` will use.

    `auto`: no process group (a world of one) -> copy_engine; CPU tensors -> gloo; CUDA
    tensors -> copy_engine when every rank of the group is on this host and all their GPUs
    have peer access, else nccl. Reductions (`reduction=True`) on more than one rank -> nccl.
    With `nbytes` (bytes per rank, identical on every rank: all-gather passes its input's),
    fewer than `configure(auto_min_bytes=)` (64 MiB) on more than one rank -> nccl, where
    the copy-engine path is host-bound and slower. The decision is collective for CUDA
    tensors on first use (all ranks must call it) and identical on every rank.

    Raises:
        ValueError: unknown backend, or a backend that cannot serve `tensor`'s device.
    """
    b = check_backend(backend)
    dev = _device(tensor)
    no_group = group is None and not dist.is_initialized()
    if b == "gloo" and dev.type != "cpu":
        raise ValueError(f"backend='gloo' needs CPU tensors, got device {dev}")
    if b == "nccl" and dev.type != "cuda":
        raise ValueError(f"backend='nccl' needs CUDA tensors, got device {dev}")
    if b == "copy_engine" and dev.type not in ("cuda", "cpu"):
        raise ValueError(f"backend='copy_engine' needs CUDA (or CPU, host shared memory) tensors, got {dev}")
    if b in ("gloo", "nccl") and no_group:
        raise ValueError(f"{backend=} needs an initialized process group (torch.distributed.init_process_group)")
    if b != "auto":
        if b == "copy_engine" and dev.type == "cuda":
            pg = _peer.get_peer_group(group, dev, _limit(timeout))
            if not (pg.one_host and pg.peer_access):
                raise ValueError(
                    "backend='copy_engine' needs all ranks on one host with GPU peer access; "
                    f"hosts={sorted(set(pg.hosts))}, peer_access={pg.peer_access}"
                )
        return b
    if no_group:
        return "copy_engine"
    if dev.type == "cpu":
        return "gloo"
    if dist.get_world_size(group) > 1 and (
            reduction or (nbytes is not None and nbytes < _peer._config.auto_min_bytes)):
        return "nccl"
    pg = _peer.get_peer_group(group, dev, _limit(timeout))
    return "copy_engine" if pg.one_host and pg.peer_access else "nccl"


def _limit(timeout: float | None) -> float:
    """Seconds the host-side parts of a call may wait (`timeout=None`: DEFAULT_TIMEOUT_S)."""
    if timeout is None:
        return _peer.DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"{timeout=} must be None or a non-negative number of seconds")
    return float(timeout)


def _finish(handle: CommHandle, async_op: bool) -> CommHandle | None:
    if async_op:
        return handle
    handle.wait()  # CUDA without timeout=: orders the current stream, the host goes on
    return None


def _torch_call(name: str, *args: object, **kwargs: object) -> dist.Work | None:
    # torch 2.13 marks the *_tensor names deprecated in favour of *_single; 2.11 lacks those.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*deprecated.*")
        out: dist.Work | None = getattr(dist, name)(*args, **kwargs)
        return out


def _via_torch(
    name: str, backend: str, plan: _peer.Plan, group: dist.ProcessGroup | None, async_op: bool,
    timeout: float | None, device: torch.device, *args: object, **kwargs: object,
) -> CommHandle | None:
    """NCCL / gloo: the cross-rank plan check (once per signature), then torch's collective.

    With `timeout=` the collective is issued async and waited for with that deadline, so a
    missing rank raises TimeoutError instead of blocking (for CUDA the host then waits for
    completion; without `timeout=` a sync CUDA call stays stream-ordered, as in torch).
    """
    _peer.torch_channel(group).agree(plan, _limit(timeout))
    if timeout is None:
        work = _torch_call(name, *args, group=group, async_op=async_op, **kwargs)
        return CommHandle(backend, work=work, device=device) if async_op else None
    work = _torch_call(name, *args, group=group, async_op=True, **kwargs)
    return _finish(CommHandle(backend, work=work, device=device, timeout=timeout), async_op)


def _via_copy_engine(
    plan: _peer.Plan, group: dist.ProcessGroup | None, async_op: bool, timeout: float | None,
    output: torch.Tensor, input: torch.Tensor, epilogue: Callable[[], None] | None = None,
    keep: tuple[torch.Tensor, ...] = (),
) -> CommHandle | None:
    limit = _limit(timeout)
    pg = _peer.get_peer_group(group, _device(input), limit)
    handle = pg.run(output, input, plan, limit, epilogue=epilogue, keep=keep)
    handle._timeout = timeout
    return _finish(handle, async_op)


def all_gather_into_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    backend: Backend = "auto",
    timeout: float | None = None,
) -> CommHandle | None:
    """Gathers every rank's `input_tensor` into `output_tensor` (rank order along dim 0).

    Args:
        output_tensor: `[world * n, ...]` (or any shape of world * input.numel() elements).
        input_tensor: `[n, ...]`, same dtype and device. May be a view of output's slice
            `rank` (FSDP's in-place all-gather): that slice is then not copied.
        group: process group; None = default group (or a world of one if none is initialized).
        async_op: return a `CommHandle` instead of waiting.
        backend: "auto" | "copy_engine" | "nccl" | "gloo" (see `resolve_backend`).
        timeout: seconds any host-side wait of this call may take before TimeoutError (peers
            joining, cross-rank check, completion when waited on); None = no extra limit.

    Returns:
        A `CommHandle` if `async_op`, else None (the output is ready on the current stream).

    Raises:
        ValueError: bad arguments, or ranks disagree on dtype / size (same error on every
            rank, before any byte moves; checked on the first call of each signature).
        TimeoutError: a rank did not join within `timeout`.
    """
    check_pair(output_tensor, input_tensor)
    rank, world = _peer.world_of(group)
    check_gather(output_tensor, input_tensor, world)
    n = input_tensor.numel()
    plan = _peer.Plan(
        op="all_gather_into_tensor",
        dtype=str(input_tensor.dtype),
        row_bytes=input_tensor.element_size(),
        send_rows=(n,) * world,
        recv_rows=(output_tensor.numel() // world,) * world,
        send_names=("input_tensor.numel()", "output_tensor.numel() / world_size"),
        send_whole_input=True,
    )
    nbytes = n * input_tensor.element_size()
    if backend == "auto" and world > 1 and _device(input_tensor).type == "cuda":
        # The size rule below must pick alike on every rank: check first that every rank
        # gathers the same size (the usual ValueError otherwise; once per signature).
        _peer.torch_channel(group).agree(plan, _limit(timeout))
    b = resolve_backend(input_tensor, group, backend, timeout=timeout, nbytes=nbytes)
    if b != "copy_engine":
        return _via_torch("all_gather_into_tensor", b, plan, group, async_op, timeout,
                          _device(input_tensor), output_tensor, input_tensor)
    return _via_copy_engine(plan, group, async_op, timeout, output_tensor, input_tensor)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    backend: Backend = "auto",
    timeout: float | None = None,
) -> CommHandle | None:
    """Splits `input` by rows (dim 0) to the ranks and concatenates what they send in `output`.

    Args:
        output: `[sum(output_split_sizes), ...]`; slice q holds the rows rank q sent here.
        input: `[sum(input_split_sizes), ...]`; slice p goes to rank p.
        output_split_sizes: rows received from each rank (None = equal split).
        input_split_sizes: rows sent to each rank (None = equal split). Zero parts are fine.
        group, async_op, backend, timeout: as in `all_gather_into_tensor`.

    Rank p's `input_split_sizes[q]` must equal rank q's `output_split_sizes[p]`; every
    backend checks this across ranks before moving anything (splits change from call to
    call, so this costs one host exchange per call).
    """
    check_pair(output, input)
    rank, world = _peer.world_of(group)
    outs, ins = check_all_to_all(output, input, output_split_sizes, input_split_sizes, world)
    b = resolve_backend(input, group, backend, timeout=timeout)
    row = 1
    for d in input.shape[1:]:
        row *= d
    plan = _peer.Plan(
        op="all_to_all_single",
        dtype=str(input.dtype),
        row_bytes=row * input.element_size(),
        send_rows=tuple(ins),
        recv_rows=tuple(outs),
        send_names=("input_split_sizes", "output_split_sizes"),
        symmetric=False,
    )
    if b != "copy_engine":
        return _via_torch("all_to_all_single", b, plan, group, async_op, timeout, _device(input),
                          output, input, outs, ins)
    return _via_copy_engine(plan, group, async_op, timeout, output, input)


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    backend: Backend = "auto",
    timeout: float | None = None,
) -> CommHandle | None:
    """Reduces `input` across ranks and leaves this rank's slice in `output`.

    Args:
        output: `[n, ...]`.
        input: `[world * n, ...]` (world * output.numel() elements); slice r goes to rank r.
        op: ReduceOp.SUM | AVG | MAX | MIN | PRODUCT.
        group, async_op, timeout: as in `all_gather_into_tensor`.
        backend: "auto" (NCCL on CUDA, gloo on CPU; see the module note) | "nccl" | "gloo" |
            "copy_engine" — copy engines gather the world shards of this rank's slice into a
            `[world, n]` temporary, then **an SM kernel** reduces them (not SM-free).
    """
    check_pair(output, input)
    rank, world = _peer.world_of(group)
    check_scatter(output, input, world)
    name = _op_name(op)
    b = resolve_backend(input, group, backend, reduction=True, timeout=timeout)
    n = output.numel()
    plan = _peer.Plan(
        op="reduce_scatter_tensor",
        dtype=str(input.dtype),
        row_bytes=input.element_size(),
        send_rows=(input.numel() // world,) * world,
        recv_rows=(n,) * world,
        send_names=("input.numel() / world_size", "output.numel()"),
    )
    if b != "copy_engine":
        return _via_torch("reduce_scatter_tensor", b, plan, group, async_op, timeout,
                          _device(input), output, input, op=op)
    if name == "avg" and not input.dtype.is_floating_point:
        raise ValueError(f"op=AVG needs a floating dtype, got {input.dtype=}")
    stacked = torch.empty((world, n), dtype=input.dtype, device=input.device)
    out_flat = output.view(-1)

    def reduce() -> None:  # runs on the side stream, after the copies: an SM kernel
        out_flat.copy_(_REDUCTIONS[name](stacked))

    return _via_copy_engine(plan, group, async_op, timeout, stacked, input, epilogue=reduce,
                            keep=(output,))


def release_buffers(group: dist.ProcessGroup | None = None) -> None:
    """Frees this rank's copy-engine staging buffers and events for `group`.

    Call on every rank: the ranks meet through the store (10 s deadline) so that nothing is
    freed while a peer still copies from it; after a TimeoutError, a lane that will not
    finish, or a rank that does not come, the buffers are leaked instead. The next
    copy-engine call rebuilds them with fresh store keys. Use it after a TimeoutError.
    """
    _peer.release(group)
