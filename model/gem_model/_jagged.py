"""Jagged-sequence plumbing of the model: token→sample index, the CLS layout, RoPE, kernel calls.

A sequence batch is flat values `[T, d]` + int64 offsets `[B+1]` + a host int `max_len`
(STYLE.md point 3). Everything here avoids host syncs: sizes come from tensor shapes and
host ints, never from reading offsets.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import gem_kernels


def lengths_of(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def token_sample(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """`[T]` sample index of each jagged token (no host sync: output size is given)."""
    b = offsets.shape[0] - 1
    ar = torch.arange(b, device=offsets.device)
    return torch.repeat_interleave(ar, lengths_of(offsets), output_size=total)


def uniform_offsets(batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Offsets `[B+1]` of B sequences of exactly n tokens each."""
    return torch.arange(batch + 1, device=device, dtype=torch.int64) * n


class PrefixLayout(NamedTuple):
    """The sequence batch with `n` CLS rows before each sequence, built once per batch.

    The layers keep the token stream in this layout from the first layer to the last (the
    CLS rows are overwritten with each layer's CLS tokens), so no layer copies the sequence
    into a prefixed buffer and back (issue 16). Row r of the combined `[Tc, d]` stream,
    `Tc = T + B*n`, belongs to sample `sample[r]`.

    Attributes:
        offsets: int64 `[B+1]` offsets of the combined layout (each sequence n rows longer).
        max_len: host int, the original max_len + n.
        n: CLS rows per sequence (0: the layout is the plain sequence batch).
        sample: `[Tc]` sample of each combined row.
        seq_rows: `[T]` combined row of each original token (in order).
        cls_rows: `[B*n]` combined rows of the CLS tokens, sample-major.
        seq_offsets: the original offsets `[B+1]`.
        seq_max_len: the original host max_len.
        cos: `[Tc, D]` fp32 RoPE table at each row's recency position (`rope_tables`).
        sin: `[Tc, D]` fp32, likewise (sign-folded).
    """

    offsets: torch.Tensor
    max_len: int
    n: int
    sample: torch.Tensor
    seq_rows: torch.Tensor
    cls_rows: torch.Tensor
    seq_offsets: torch.Tensor
    seq_max_len: int
    cos: torch.Tensor
    sin: torch.Tensor


def prefix_layout(
    offsets: torch.Tensor, max_len: int, total: int, n: int, *, head_dim: int, rope_base: float
) -> PrefixLayout:
    """Builds the `PrefixLayout` of a sequence batch (offsets `[B+1]`, T = `total` tokens).

    Sync-free: sizes come from `total`, `n` and the batch size, never from reading offsets.
    RoPE positions count back from each sequence's newest event (`recency_positions`).
    """
    b = offsets.shape[0] - 1
    dev = offsets.device
    shift = torch.arange(b + 1, device=dev, dtype=torch.int64) * n
    off = offsets + shift
    tc = total + b * n
    seq_sample = token_sample(offsets, total)
    seq_rows = torch.arange(total, device=dev) + shift[1:][seq_sample]
    cls_rows = (off[:-1, None] + torch.arange(n, device=dev)).reshape(-1)
    sample = token_sample(off, tc)
    cos, sin = rope_tables(recency_positions(off, tc, n, sample), head_dim, rope_base)
    return PrefixLayout(off, max_len + n, n, sample, seq_rows, cls_rows, offsets, max_len, cos, sin)


def to_layout(seq: torch.Tensor, lay: PrefixLayout) -> torch.Tensor:
    """The tokens `[T, d]` placed in the combined layout `[Tc, d]` (CLS rows zero)."""
    if lay.n == 0:
        return seq
    out = seq.new_zeros(lay.sample.shape[0], seq.shape[1])
    return out.index_copy_(0, lay.seq_rows, seq)


class _UniqueRows(torch.autograd.Function):
    """`x.index_select(0, rows)` for `rows` without repeats, whose backward scatters.

    `index_select`'s own backward accumulates (`index_add`: atomics, since it must allow
    repeated rows), and torch.compile runs a bf16 `index_add` as an eager fallback plus a
    copy of the whole destination: ~0.8 ms per call on the h200 stream. The rows here (the
    layout's event and CLS rows) never repeat, so each gradient row is written once
    (`index_copy`: no atomics, bitwise reproducible, fused by inductor).
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        ctx.num_rows = x.shape[0]  # type: ignore[attr-defined]
        return x.index_select(0, rows)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (rows,) = ctx.saved_tensors  # type: ignore[attr-defined]
        out = g.new_zeros((ctx.num_rows, *g.shape[1:]))  # type: ignore[attr-defined]
        return out.index_copy(0, rows, g), None


def unique_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`x[rows]` along dim 0 for int64 `rows` that never repeat (not checked: that would
    read them on the host); the gradient is scattered, not accumulated (`_UniqueRows`)."""
    out: torch.Tensor = _UniqueRows.apply(x, rows)  # type: ignore[no-untyped-call]
    return out


def recent_rows(offsets: torch.Tensor, k: int, prefix: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `[B, k]` of the k most recent tokens of each sequence (oldest first; clamped to 0
    where a sequence is shorter) and their validity `[B, k, 1]` (False for those slots and for
    the `prefix` rows at the start of each sequence, e.g. a `PrefixLayout`'s CLS rows)."""
    idx = offsets[1:, None] - k + torch.arange(k, device=offsets.device)
    valid = (idx >= offsets[:-1, None] + prefix).unsqueeze(-1)
    return idx.clamp(min=0), valid


def _row_roles(off: torch.Tensor, sample: torch.Tensor, n: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row r of a `PrefixLayout` stream (offsets `off`, `sample` `[Tc]`, n CLS rows each):
    (is_cls `[Tc]`, its CLS index `s*n + j` (0 on event rows), its event index `r - (s+1)*n`
    (`prefix_layout`'s seq_rows inverted; 0 on CLS rows), its distance from the newest event
    of its sequence `off[s+1] - 1 - r`). Pointwise with one gather of `off`: inductor fuses it
    into the kernel that uses it."""
    r = torch.arange(sample.shape[0], device=sample.device)
    j = r - off[sample]
    is_cls = j < n
    return (is_cls, torch.where(is_cls, sample * n + j, 0), torch.where(is_cls, 0, r - (sample + 1) * n),
            off[sample + 1] - 1 - r)


class _WithCls(torch.autograd.Function):
    """The stream with its CLS rows replaced by this layer's CLS tokens (see `with_cls`)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, cls: torch.Tensor,
                off: torch.Tensor, sample: torch.Tensor, cls_rows: torch.Tensor, n: int) -> torch.Tensor:
        ctx.save_for_backward(off, sample, cls_rows)
        ctx.n = n  # type: ignore[attr-defined]
        if not torch.compiler.is_compiling():  # eager: a scatter of the few CLS rows, in place
            ctx.mark_dirty(x)
            return x.index_copy_(0, cls_rows, cls)
        # compiled: one select per row, which inductor fuses with the add that made x and the
        # layer norm that reads the result (a scatter in between kept them three passes).
        is_cls, cls_idx, _, _ = _row_roles(off, sample, n)
        return torch.where(is_cls[:, None], cls.index_select(0, cls_idx), x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        off, sample, cls_rows = ctx.saved_tensors  # type: ignore[attr-defined]
        is_cls = _row_roles(off, sample, ctx.n)[0]  # type: ignore[attr-defined]
        return torch.where(is_cls[:, None], 0, g), g.index_select(0, cls_rows), None, None, None, None


def with_cls(x: torch.Tensor, cls: torch.Tensor, lay: PrefixLayout) -> torch.Tensor:
    """x `[Tc, d]` in `lay` with its CLS rows replaced by `cls` `[B*n, d]` (sample-major).

    Eager it writes into x (an activation nothing else needs: the FFN's fresh output), compiled
    it returns a new tensor; use the result. The values of `x.index_copy(0, lay.cls_rows, cls)`;
    the gradient of x is g with the CLS rows zeroed, that of cls the CLS rows of g (gathered,
    never accumulated). Compiled, the replacement is a per-row select (`torch.where`) so
    inductor fuses it with its neighbours (GEMConfig.select_stream_rows).
    """
    if cls.shape != (lay.cls_rows.shape[0], x.shape[1]):
        raise ValueError(f"cls must be [B*n, d] = {(lay.cls_rows.shape[0], x.shape[1])}, got {tuple(cls.shape)}")
    out: torch.Tensor = _WithCls.apply(x, cls.to(x.dtype), lay.offsets, lay.sample,  # type: ignore[no-untyped-call]
                                       lay.cls_rows, lay.n)
    return out


class _StreamReads(torch.autograd.Function):
    """A block's reads of the stream after its attention, with one backward.

    Forward: the CLS rows, the k most recent event rows of each sequence (masked where a
    sequence is shorter), and optionally every event row, each an `index_select`, the same
    values as `unique_rows` / `recent_tokens`. Backward: read separately, each read writes a
    dense `[Tc, d]` gradient (a zero fill and a scatter) that autograd then adds into the
    stream's gradient. Here the one gradient is written once. Eager: when the event rows are
    read, events and CLS rows cover every row, so it starts uninitialized and needs no zero
    fill; the recent tokens are then added into their rows (`index_put_` accumulating: a masked
    slot adds zero to whatever row its clamped index names). Compiled with `gather_grad`
    (GEMConfig.gather_stream_grads, or select_stream_rows): each row gathers what it
    receives (its CLS token's or its event's gradient, plus its recent slot's when it is one
    of the k newest events), a pointwise form with no scatter, so inductor writes it in the
    same pass as autograd's sum with the stream's other gradient.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, comb: torch.Tensor, cls_rows: torch.Tensor,
                recent_rows: torch.Tensor, recent_valid: torch.Tensor,
                seq_rows: torch.Tensor | None, off: torch.Tensor, sample: torch.Tensor, n: int,
                gather_grad: bool) -> tuple[torch.Tensor, ...]:
        b, k = recent_rows.shape
        cls = comb.index_select(0, cls_rows)
        recent = comb.index_select(0, recent_rows.reshape(-1)).reshape(b, k, -1) * recent_valid
        ctx.save_for_backward(cls_rows, recent_rows, recent_valid, seq_rows, off, sample)  # type: ignore[arg-type]
        ctx.num_rows, ctx.n, ctx.gather = comb.shape[0], n, gather_grad  # type: ignore[attr-defined]
        if seq_rows is None:
            return cls, recent
        return cls, recent, comb.index_select(0, seq_rows)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cls_rows, recent_rows, recent_valid, seq_rows, off, sample = ctx.saved_tensors  # type: ignore[attr-defined]
        g_cls, g_recent = grads[0], grads[1]
        nones = (None,) * 8
        if ctx.gather and torch.compiler.is_compiling():  # type: ignore[attr-defined]
            n, (b, k) = ctx.n, recent_rows.shape  # type: ignore[attr-defined]
            is_cls, cls_idx, ev, back = _row_roles(off, sample, n)
            if seq_rows is None:
                base = torch.where(is_cls[:, None], g_cls.index_select(0, cls_idx), 0)
            else:
                g_ev = grads[2].index_select(0, ev) if grads[2].shape[0] else 0  # no events: all CLS
                base = torch.where(is_cls[:, None], g_cls.index_select(0, cls_idx), g_ev)
            is_recent = ~is_cls & (back < k)
            slot = torch.where(is_recent, sample * k + (k - 1) - back, 0)
            rec = g_recent.reshape(b * k, -1).index_select(0, slot)
            return (base + torch.where(is_recent[:, None], rec, 0), *nones)
        shape = (ctx.num_rows, *g_cls.shape[1:])  # type: ignore[attr-defined]
        if seq_rows is None:
            out = g_cls.new_zeros(shape)
        else:
            out = g_cls.new_empty(shape).index_copy_(0, seq_rows, grads[2])
        out.index_copy_(0, cls_rows, g_cls)
        rec = (g_recent * recent_valid).reshape(-1, *g_cls.shape[1:])
        out.index_put_((recent_rows.reshape(-1),), rec, accumulate=True)
        return (out, *nones)


def stream_reads(comb: torch.Tensor, lay: PrefixLayout, k: int, *, events: bool, gather_grad: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(CLS rows `[B*n, d]`, the k recent tokens `[B, k, d]`, the event rows `[T, d]` or None)
    of the stream in `lay`: `unique_rows(comb, lay.cls_rows)`,
    `recent_tokens(comb, lay.offsets, k, lay.n)` and `events_of(comb, lay)` in one autograd
    node whose backward writes the stream's gradient once (`_StreamReads`). The same values;
    the gradient differs from the three separate reads only in the order of its sums.
    `gather_grad`: when compiled, the backward gathers per row instead of scattering
    (`_StreamReads`; GEMConfig.gather_stream_grads, or select_stream_rows)."""
    if lay.n == 0 or k == 0 or comb.shape[0] == 0:
        raise ValueError(f"stream_reads needs CLS rows (lay.n={lay.n}), k >= 1 (k={k}) and a "
                         f"non-empty stream ({comb.shape[0]} rows); use the separate reads")
    rows, valid = recent_rows(lay.offsets, k, lay.n)
    out = _StreamReads.apply(comb, lay.cls_rows, rows, valid,  # type: ignore[no-untyped-call]
                             lay.seq_rows if events else None, lay.offsets, lay.sample, lay.n, gather_grad)
    return out[0], out[1], (out[2] if events else None)


class _SlotRows(torch.autograd.Function):
    """`x.index_select(0, rows) * valid` whose backward writes each row's gradient once.

    The valid slots name distinct rows (each sample's CLS rows and its newest events); an
    invalid slot (a recent slot of a sequence shorter than k) reads zero, so its gradient is
    dropped, not added into the clamped row it names. The backward is then a zero fill and
    one `index_copy` (no atomics, bitwise reproducible), the invalid slots sent to a spare
    row past the end; or, compiled with the layout's `off`, `sample`, `n` and `k` given
    (`slot_rows(gather_grad=)`), a per-row gather of each row's slot gradient, with no zero
    fill, that inductor fuses into the stream gradient's sum.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, rows: torch.Tensor,
                valid: torch.Tensor, off: torch.Tensor | None, sample: torch.Tensor | None, n: int,
                k: int) -> torch.Tensor:
        ctx.save_for_backward(rows, valid, off, sample)  # type: ignore[arg-type]
        ctx.num_rows, ctx.n, ctx.k = x.shape[0], n, k  # type: ignore[attr-defined]
        mask = valid.reshape(-1, *([1] * (x.dim() - 1)))
        return x.index_select(0, rows) * mask

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, valid, off, sample = ctx.saved_tensors  # type: ignore[attr-defined]
        num, n, k = ctx.num_rows, ctx.n, ctx.k  # type: ignore[attr-defined]
        nones = (None,) * 6
        if off is not None and sample is not None and torch.compiler.is_compiling():
            # The slots are `query_slots(lay, k)`'s: per sample its n CLS rows, then its k newest
            # events, oldest first. Each row gathers its slot's gradient (a CLS row's, or an
            # event's among the k newest: exactly the valid recent slots), else zero: pointwise,
            # so inductor adds it in the pass that sums the stream's other gradients.
            is_cls, cls_idx, _, back = _row_roles(off, sample, n)  # cls_idx = s*n + j
            is_recent = ~is_cls & (back < k)
            slot = torch.where(is_cls, cls_idx + sample * k,
                               torch.where(is_recent, sample * (n + k) + n + (k - 1) - back, 0))
            read = (is_cls | is_recent).reshape(-1, *([1] * (g.dim() - 1)))
            return (torch.where(read, g.index_select(0, slot), 0), *nones)
        out = g.new_zeros((num + 1, *g.shape[1:]))
        return (out.index_copy_(0, torch.where(valid, rows, num), g)[:num], *nones)


def query_slots(lay: PrefixLayout, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows a block reads from the stream after its attention when it does not pool:
    `[B, n + k]` (each sample's n CLS rows, then its k newest event rows, oldest first) and
    their validity `[B, n + k]` (False for the recent slots of a sequence shorter than k,
    whose rows are clamped: `recent_rows`)."""
    b = lay.offsets.shape[0] - 1
    cls = lay.cls_rows.reshape(b, lay.n)
    rec, ok = recent_rows(lay.offsets, k, lay.n)
    rows = torch.cat([cls, rec], dim=1)
    valid = torch.cat([torch.ones_like(cls, dtype=torch.bool), ok.squeeze(-1)], dim=1)
    return rows, valid


def slot_rows(x: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor,
              gather_grad: tuple[PrefixLayout, int] | None = None) -> torch.Tensor:
    """`x[rows] * valid` along dim 0 (rows, valid: `[S]` int64 / bool) for rows whose valid
    entries never repeat (not checked: that would read them on the host; `query_slots`'
    rows qualify). Invalid slots read zero and pass no gradient (`_SlotRows`).

    `gather_grad=(lay, k)`, for rows and valid that are `query_slots(lay, k)` flattened (not
    checked): when compiled, the backward gathers each row's gradient instead of scattering
    into a zero-filled buffer (GEMConfig.gather_stream_grads). The same gradient bit for bit:
    each row receives at most one slot's."""
    off, sample, n, k = (None, None, 0, 0) if gather_grad is None else (
        gather_grad[0].offsets, gather_grad[0].sample, gather_grad[0].n, gather_grad[1])
    out: torch.Tensor = _SlotRows.apply(x, rows, valid, off, sample, n, k)  # type: ignore[no-untyped-call]
    return out


def events_of(comb: torch.Tensor, lay: PrefixLayout) -> torch.Tensor:
    """The event rows `[T, d]` of the combined stream (a gather; no copy when n == 0)."""
    return comb if lay.n == 0 else unique_rows(comb, lay.seq_rows)


def recency_positions(off: torch.Tensor, total: int, n_cls: int, sample: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE positions `[T + B*n_cls]` counted back from each sequence's most recent event.

    `off` are the offsets of the CLS-prefixed layout. The most recent event is 0, the one
    before it 1, ...; the CLS tokens sit just after the newest event, at -1, -2, .... Since
    RoPE scores depend on the position difference, a CLS query sees each event's distance
    from the end of the history, whatever the history's length: recency is what a user's
    next action depends on (the planted task's recent-event terms, and the GEM post's "most
    recent tokens").
    """
    c = torch.arange(total, device=off.device)
    s = token_sample(off, total) if sample is None else sample
    j = c - off[s]
    return torch.where(j < n_cls, -1 - j, off[s + 1] - 1 - c)


def rope_tables(pos: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 tables `[T, D]` of the rotate-half rotary embedding at integer positions `[T]`.

    cos = [cos θ, cos θ] and sin = [-sin θ, sin θ] (the rotation's sign folded in), so
    `rope` is one swap of halves and one multiply-add: built once per batch, shared by
    every layer.
    """
    half = head_dim // 2
    inv = base ** (-torch.arange(half, device=pos.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


# Rotary embedding (rotate-half form) of `[T, ..., D]` with `rope_tables` `[T, D]`: the
# kernels' plain-PyTorch rotation, the one their rotary ops' reference paths differentiate.
rope = gem_kernels.rope


class _RopeQKV(torch.autograd.Function):
    """q, k rotated and v passed through, from the fused projection `[T, 3, H, D]`; the
    backward writes the projection's gradient in one pass (see `rope_qkv`)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, qkv: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.dtype = qkv.dtype  # type: ignore[attr-defined]
        q, k = rope(qkv[:, :2], cos, sin).unbind(1)
        return q, k, qkv[:, 2]

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, dq: torch.Tensor, dk: torch.Tensor,
                 dv: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        dt = ctx.dtype  # type: ignore[attr-defined]
        # The rotation's transpose (the rotation by -θ) and v's slot, in one pass: the Triton
        # kernel on CUDA (inductor's stack of the three slots ran at ~2.6 TB/s on the H200,
        # 1.23 ms per layer on the h200 preset), its plain-PyTorch reference elsewhere.
        return gem_kernels.rope_qkv_grad(dq.to(dt), dk.to(dt), dv.to(dt), cos, sin), None, None


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rope(q), rope(k), v) from a fused projection `[T, 3, H, D]`, as views.

    The same values and gradients as `rope(qkv[:, :2], ...).unbind(1)` plus `qkv[:, 2]`, but
    autograd's form of that (the rotation's backward into a sliced gradient, then v's
    `select_backward` added) compiled on the H200 to two passes over the `[T, 3, H, D]`
    gradient per layer (~0.8 ms each on the h200 preset); this backward is gem_kernels'
    `rope_qkv_grad`: one Triton pass on CUDA, its plain-PyTorch reference elsewhere.
    """
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be [T, 3, H, D], got {tuple(qkv.shape)}")
    q, k, v = _RopeQKV.apply(qkv, cos, sin)  # type: ignore[no-untyped-call]
    return q, k, v


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """bf16 (the autocast dtype) on CUDA under autocast, else the tensor's own dtype."""
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return x.dtype


def attention_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    *,
    window: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Jagged self-attention of a fused projection `qkv [T, 3, H, D]` with rotary q and k
    (`rope_tables` `[T, D]`), as `gem_kernels.jagged_flash_attention_qkv`: the values of
    `attention(*rope_qkv(qkv, cos, sin), ...)`, but the backward hands the projection one
    `[T, 3, H, D]` gradient that the attention's backward wrote into (FlashAttention-4: all
    three slots; ours: k's and v's), with q's and k's slots rotated back in place. Composed,
    the rotary backward read dq, dk, dv and wrote all three into a new buffer (one pass of
    `rope_qkv_grad`, 4.3 ms of a 174 ms h200 step on an H100)."""
    dt = kernel_dtype(qkv)
    return gem_kernels.jagged_flash_attention_qkv(
        qkv.to(dt), offsets, max_len, rope=(cos, sin), window=window, backend=backend
    )


def attention_kv(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q: int,
    max_kv: int,
    *,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Jagged softmax attention with k and v packed `[Tkv, 2, H, D]`, as one fused projection
    gives them (`gem_kernels.jagged_flash_attention_kv`). The same values as `attention(q,
    *kv.unbind(1), ...)`; the backward returns kv's gradient as one tensor, written by the
    attention's backward itself where the kernel can (FlashAttention-4, ours), instead of
    `unbind`'s backward stacking dk and dv into a new one (a copy of `[Tkv, 2, H, D]`).
    `rope`: `rope_tables` `[Tkv, D]` for the keys, rotated by the op (dk rotated back in place)."""
    dt = kernel_dtype(q)
    return gem_kernels.jagged_flash_attention_kv(
        q.to(dt), kv.to(dt), q_offsets, kv_offsets, max_q, max_kv, rope=rope, backend=backend
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_q: int,
    max_kv: int,
    *,
    window: int | None = None,
    activation: str = "softmax",
    backend: str = "auto",
) -> torch.Tensor:
    """Jagged attention through gem_kernels: softmax → JFA, any other activation → GDPA."""
    dt = kernel_dtype(q)
    # No .contiguous(): the kernels take any row/head strides with a unit stride on D, so
    # q/k/v are read straight out of the fused qkv projection (`.to` is a no-op under autocast).
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if activation == "softmax":
        return gem_kernels.jagged_flash_attention(
            q, k, v, q_offsets, kv_offsets, max_q, max_kv, window=window, backend=backend
        )
    return gem_kernels.generalized_dot_product_attention(
        q, k, v, q_offsets, kv_offsets, max_q, max_kv, activation=activation, backend=backend
    )
