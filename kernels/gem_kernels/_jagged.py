"""Shared internals of the jagged ops: input checks, the visibility rule, pad/unpad.

A jagged batch is flat values `[T, ...]` + int64 offsets `[B+1]` (offsets[0] == 0,
offsets[-1] == T, non-decreasing) + a host-side `max_len` (a Python int, so kernels never
sync the GPU to learn it). Checks come in two tiers (issue 3): cheap metadata checks always,
and content checks of the offsets only where they cost no hidden GPU sync — offsets on the
CPU, or any device when `GEM_KERNELS_DEBUG=1`.

Every op of this package uses the same visibility rule (`visible_mask`), written once here:
query i of a sample with `len_q` queries and `len_kv` keys sits at key position
`i' = i + (len_kv - len_q)` (bottom-right alignment, as FlashAttention does for unequal
lengths). `causal` keeps keys j <= i'; `window=w` keeps j > i' - w (with causal) or the
symmetric band |i' - j| < w (without).
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "check_jagged",
    "check_offsets",
    "check_triton_device",
    "debug_checks",
    "kv_range",
    "pad_jagged",
    "resolve_backend",
    "unpad_jagged",
    "visible_mask",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def debug_checks() -> bool:
    """Whether `GEM_KERNELS_DEBUG=1` asks for full (GPU-syncing) checks of offset contents."""
    return os.environ.get("GEM_KERNELS_DEBUG", "0") not in ("", "0", "false", "False")


def check_row_offsets(max_q_len: int, max_kv_len: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The Triton attention kernels address the rows of a sample with 32-bit offsets (row ×
    row stride, from a 64-bit base at the sample's first row): a ValueError, naming the bound,
    where a sample of `max_q_len` query or `max_kv_len` key rows could reach 2**31 elements
    (e.g. 2 M rows at a row stride of 1,024; their outputs and gradients have a row stride of
    H·D). The bounds are the maxima the caller passes, so a tighter one avoids it."""
    hd = q.shape[1] * q.shape[2] if q.dim() == 3 else 1
    for name, n, xs in (("max_q_len", max_q_len, (q,)), ("max_kv_len", max_kv_len, (k, v))):
        stride = max(hd, *(x.stride(0) for x in xs))
        if n * stride >= 2**31:
            raise ValueError(f"{name}={n} rows x row stride {stride} must be < 2**31: the Triton attention kernels "
                             "address a sample's rows with 32-bit offsets (pass a tighter bound)")


def check_offsets(
    offsets: torch.Tensor,
    name: str,
    *,
    total: int,
    max_len: int,
    max_len_name: str,
    full: bool | None = None,
) -> None:
    """Checks one offsets tensor; raises ValueError/TypeError naming `name` and the rule.

    Args:
        offsets: int64 `[B+1]`.
        name: the argument name to report.
        total: T, the number of rows of the values it indexes.
        max_len: the host-side bound on every length.
        max_len_name: the argument name of `max_len`.
        full: check the contents (monotone, starts at 0, ends at T, lengths <= max_len).
            None means: when `offsets` is on the CPU or `GEM_KERNELS_DEBUG=1`, and not
            while torch.compile traces.
    """
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dtype != torch.int64:
        raise TypeError(f"{name}.dtype={offsets.dtype} must be torch.int64")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name}.shape={tuple(offsets.shape)} must be [B+1] with B >= 0")
    if isinstance(max_len, bool) or not isinstance(max_len, int):
        raise TypeError(f"{max_len_name}={max_len!r} must be a host int")
    if max_len < 0:
        raise ValueError(f"{max_len_name}={max_len} must be >= 0")
    if full is None:
        # Under torch.compile the contents are data-dependent: check them only in eager.
        full = (offsets.device.type == "cpu" or debug_checks()) and not torch.compiler.is_compiling()
    if not full:
        return
    off = offsets.detach().cpu()
    if int(off[0]) != 0:
        raise ValueError(f"{name}[0]={int(off[0])} must be 0")
    if int(off[-1]) != total:
        raise ValueError(f"{name}[-1]={int(off[-1])} must equal the number of rows T={total}")
    lengths = off[1:] - off[:-1]
    if lengths.numel() and int(lengths.min()) < 0:
        b = int(torch.argmin(lengths))
        raise ValueError(f"{name} must be non-decreasing; {name}[{b + 1}] < {name}[{b}]")
    if lengths.numel() and int(lengths.max()) > max_len:
        raise ValueError(
            f"{max_len_name}={max_len} is smaller than the longest sequence in {name} "
            f"({int(lengths.max())}); it must be >= every length"
        )


def resolve_backend(backend: str, device: torch.device) -> str:
    """"auto" -> "triton" on CUDA, else "reference"; other names unchanged."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    return backend


def check_triton_device(device: torch.device) -> None:
    """backend="triton" needs CUDA tensors or Triton's CPU interpreter; without this check
    Triton says only "0 active drivers". Called after the op's Triton shape checks."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got device {device}: move the inputs to a GPU, set "
            f"TRITON_INTERPRET=1 at start-up (Triton's CPU interpreter: slow, for tests), "
            f"or use backend='reference'"
        )


def check_jagged(
    values: dict[str, torch.Tensor],
    *,
    head_dims: tuple[int, ...] | None = None,
) -> torch.device:
    """Cheap checks of jagged value tensors `[T, H, D]`: rank, float dtype, one device.

    Args:
        values: argument name -> tensor.
        head_dims: allowed D values, or None for any D >= 1.

    Returns:
        The common device.
    """
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    for name, t in values.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}.shape={tuple(t.shape)} must be [T, H, D]")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name}.dtype={t.dtype} must be one of float16, bfloat16, float32")
        if t.shape[2] < 1:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: head dim D={t.shape[2]} must be >= 1")
        if head_dims is not None and t.shape[2] not in head_dims:
            raise ValueError(f"{name}.shape[2]={t.shape[2]} (head dim D) must be one of {head_dims}")
        if device is None:
            device, dtype = t.device, t.dtype
        elif t.device != device:
            raise ValueError(f"{name}.device={t.device} must match the other inputs' {device}")
        elif t.dtype != dtype:
            raise TypeError(f"{name}.dtype={t.dtype} must match the other inputs' {dtype}")
    assert device is not None, "check_jagged needs at least one tensor"
    return device


def visible_mask(
    len_q: int,
    len_kv: int,
    *,
    causal: bool,
    window: int | None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The visibility rule as a bool `[len_q, len_kv]` matrix (True = query i sees key j).

    Bottom-right aligned: query i sits at key position i' = i + (len_kv - len_q).
    """
    i = torch.arange(len_q, device=device).unsqueeze(1) + (len_kv - len_q)
    j = torch.arange(len_kv, device=device).unsqueeze(0)
    mask = torch.ones(len_q, len_kv, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= i
    if window is not None:
        mask &= (j > i - window) if causal else ((i - j).abs() < window)
    return mask


def kv_range(
    q_lo: int, q_hi: int, len_q: int, len_kv: int, *, causal: bool, window: int | None
) -> tuple[int, int]:
    """Keys [lo, hi) that queries [q_lo, q_hi) may see (a superset; for tiling/FLOP counts)."""
    shift = len_kv - len_q
    lo, hi = 0, len_kv
    if causal:
        hi = min(hi, q_hi - 1 + shift + 1)
    if window is not None:
        lo = max(lo, q_lo + shift - window + 1)
        if not causal:
            hi = min(hi, q_hi - 1 + shift + window)
    return lo, max(lo, hi)


def pad_jagged(values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """Jagged `[T, *F]` -> padded `[B, max_len, *F]` (zeros past each length).

    Sequences longer than `max_len` are truncated. Sync-free: no host read of `offsets`.
    """
    b = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(max_len, device=values.device)
    valid = pos.unsqueeze(0) < lengths.unsqueeze(1)  # [B, max_len]
    idx = (offsets[:-1].unsqueeze(1) + pos.unsqueeze(0)).clamp(max=max(values.shape[0] - 1, 0))
    out = values.new_zeros((b, max_len, *values.shape[1:]))
    if values.shape[0] == 0:
        return out + values.sum() * 0  # keeps autograd's graph to `values`
    gathered = values[idx.reshape(-1)].reshape(b, max_len, *values.shape[1:])
    shape = (b, max_len) + (1,) * (values.dim() - 1)
    return torch.where(valid.reshape(shape), gathered, out)


def unpad_jagged(padded: torch.Tensor, offsets: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Padded `[B, L, *F]` -> jagged `[T, *F]` (the inverse of `pad_jagged`).

    Args:
        padded: `[B, L, *F]`.
        offsets: int64 `[B+1]`.
        total: T if known on the host (avoids a device sync to read offsets[-1]).
    """
    b, max_len = padded.shape[0], padded.shape[1]
    if total is None:
        total = int(offsets[-1])
    t = torch.arange(total, device=padded.device)
    seq = torch.searchsorted(offsets[1:].contiguous(), t, right=True).clamp(max=max(b - 1, 0))
    pos = (t - offsets[:-1][seq]).clamp(max=max(max_len - 1, 0))
    return padded[seq, pos]


def check_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    window: int | None,
) -> torch.device:
    """The public-boundary checks every q/kv attention op shares (JFA, GDPA); returns the
    common device. Errors name the argument and the rule."""
    device = check_jagged({"q": q, "k": k, "v": v})
    if k.shape != v.shape:
        raise ValueError(f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)} must be equal")
    if q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q.shape={tuple(q.shape)} and k.shape={tuple(k.shape)} must share [H, D]")
    for name, off in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if isinstance(off, torch.Tensor) and off.device != device:
            raise ValueError(f"{name}.device={off.device} must be q's device {device}")
    check_offsets(q_offsets, "q_offsets", total=q.shape[0], max_len=max_q_len, max_len_name="max_q_len")
    check_offsets(kv_offsets, "kv_offsets", total=k.shape[0], max_len=max_kv_len, max_len_name="max_kv_len")
    if q_offsets.shape != kv_offsets.shape:
        raise ValueError(
            f"q_offsets.shape={tuple(q_offsets.shape)} and kv_offsets.shape="
            f"{tuple(kv_offsets.shape)} must be equal (one [B+1] per batch)"
        )
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window={window!r} must be None or an int >= 1")
    return device


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b are the same elements in the same layout (an in-place source and its slot)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
