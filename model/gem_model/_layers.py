"""InterFormer layer (arXiv 2411.09852) with the Kunlun switches (arXiv 2602.10016).

One layer, information flowing both ways:

    x [B, F, d] (non-sequence tokens)          seq [T, d] (jagged event tokens)
      │ NonSeqSummary (Cross arch, →seq)             │
      ├──────────── x_sum [B, n_cls, d] ──────► SeqFFN (personalized FFN | GDPA)
      │                                         SeqAttention (CLS = x_sum prepended, RoPE, JFA)
      │                                         SeqPooling (PMA | hierarchical seeds) + recent
      │ ◄──── s_sum [B, n_sum, d] ◄── SeqSummary (Cross arch, gated CLS + PMA + recent)
      ▼ Interaction (self-attention over [x; s_sum] + FFN)

Every submodule takes plain tensors and host ints, so a benchmark can run each alone, and
has `flops(shapes)` giving its analytic forward FLOPs (gem_model._flops conventions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from gem_model import _flops, _jagged
from gem_model._config import GEMConfig


def _glu(lin: nn.Linear, z: torch.Tensor) -> torch.Tensor:
    a, g = lin(z).chunk(2, dim=-1)
    out: torch.Tensor = a * torch.sigmoid(g)
    return out


def _drop_bias(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    state_dict.pop(prefix + "bias", None)


def _plain_linear(lin: nn.Module) -> TypeGuard[nn.Linear]:
    """An `nn.Linear` whose forward is nn.Linear's own (not a precision recipe's)."""
    return isinstance(lin, nn.Linear) and type(lin).forward is nn.Linear.forward


def _add_linear(res: torch.Tensor, lin: nn.Module, x: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """`res + lin(x)`, with the residual added by the GEMM itself (`addmm(res, x, Wᵀ)`: no
    separate add pass over the stream, and one rounding instead of two) where `lin` is a plain
    bias-free `nn.Linear`, both operands are 2-D, and `res` already has the product's dtype
    (the autocast dtype under autocast, else the weight's), so the sum's dtype is the plain
    form's. Anything else (a bias, a precision recipe's linear, a float32 stream under bf16
    autocast) takes the plain form.

    `in_place` (GEMConfig.inplace_residual_gemm), compiled only: the same values bit for bit
    by `_ResidualGemm` (a copy of `res` that the GEMM adds into in place) instead of `addmm`,
    which copies `res` into its output by a device-to-device copy before the GEMM."""
    if _plain_linear(lin) and lin.bias is None and res.dim() == 2 and x.dim() == 2:
        dev = x.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else lin.weight.dtype
        if res.dtype == dt:
            if in_place and torch.compiler.is_compiling() and x.dtype == dt:
                return _ResidualGemm.apply(res, x, lin.weight.to(dt))
            return torch.addmm(res, x, lin.weight.t())
    out: torch.Tensor = res + lin(x)
    return out


@torch.library.custom_op("gem_model::addmm_into", mutates_args=("out",))
def _addmm_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """out += x @ wᵀ in place: cuBLAS reads and writes the one buffer (C = D), no copy."""
    out.addmm_(x, w.t())


@_addmm_into.register_fake
def _addmm_into_fake(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    return None


class _ResidualGemm(torch.autograd.Function):
    """`res + x @ wᵀ` (one dtype) as `res.clone()` that `gem_model::addmm_into` adds into.

    `torch.addmm(res, x, wᵀ)` gives the same bits but copies `res` into its fresh output
    first (a device-to-device copy, a read and a write of the stream, per call). Here the copy
    is a graph node: inductor writes it in a kernel that already reads `res` (the layer norm
    before the GEMM), and reinplaces the mutation into that fresh buffer, so the stream is
    not read twice. The backward is addmm's (the gradient passes to `res` unchanged)."""

    @staticmethod
    def forward(ctx: Any, res: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = res.clone()
        torch.ops.gem_model.addmm_into(out, x, w)
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        dx = g @ w if ctx.needs_input_grad[1] else None
        dw = g.t() @ x if ctx.needs_input_grad[2] else None
        return g, dx, dw


def _token_mix(n_in: int, n_out: int) -> nn.Linear:
    """A linear over the token axis whose output a LayerNorm over d normalizes: without a
    bias, which would add one constant per token that the LayerNorm's mean removes (a
    parameter with no effect, whose gradient is rounding noise that Adam turns into full
    moves). Checkpoints of gem-model < 0.5, which had the bias, still load: the hook drops it,
    exactly, since it had no effect."""
    lin = nn.Linear(n_in, n_out, bias=False)
    lin.register_load_state_dict_pre_hook(_drop_bias)  # type: ignore[no-untyped-call]
    return lin


class NonSeqSummary(nn.Module):
    """Cross arch, non-sequence → sequence: F feature tokens → n_cls gated summary tokens."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.f, self.n, self.d = cfg.num_tokens, cfg.num_cls, cfg.d_model
        self.mix = _token_mix(self.f, self.n)  # over the token axis, then self.norm
        self.norm = nn.LayerNorm(self.d)
        self.glu = nn.Linear(self.d, 2 * self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.mix(x.transpose(1, 2)).transpose(1, 2)  # [B, n_cls, d]
        return _glu(self.glu, self.norm(z))

    def flops(self, s: _flops.Shapes) -> float:
        return _flops.linear(s.batch * self.d, self.f, self.n) + _flops.linear(s.batch * self.n, self.d, 2 * self.d)


class PersonalizedFFN(nn.Module):
    """Sequence FFN modulated per sample by the non-sequence summary (FiLM-style PFFN)."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.d, self.h = cfg.d_model, cfg.ffn_mult * cfg.d_model
        self.norm = nn.LayerNorm(self.d)
        self.film = nn.Linear(self.d, 2 * self.d)
        self.w1 = nn.Linear(self.d, self.h, bias=cfg.stream_bias)
        self.w2 = nn.Linear(self.h, self.d, bias=cfg.stream_bias)
        self.in_place = cfg.inplace_residual_gemm

    def forward(
        self, seq: torch.Tensor, x_sum: torch.Tensor, offsets: torch.Tensor, max_len: int,
        sample: torch.Tensor,
    ) -> torch.Tensor:
        gamma, beta = self.film(x_sum.mean(dim=1)).chunk(2, dim=-1)  # [B, d] each
        h = self.norm(seq) * (1.0 + gamma[sample]) + beta[sample]
        return _add_linear(seq, self.w2, F.gelu(self.w1(h)), self.in_place)

    def flops(self, s: _flops.Shapes) -> float:
        t = s.tokens
        return _flops.linear(s.batch, self.d, 2 * self.d) + 2 * _flops.linear(t, self.d, self.h)


class GDPAFFN(nn.Module):
    """Kunlun: the personalized FFN as GDPA cross-attention over a short per-sample kv.

    Queries are the jagged sequence tokens; keys/values are `gdpa_kv_len` tokens mixed from
    the non-sequence summary. `out = act(q kᵀ/√D) v / kv_len` (gem_kernels GDPA).
    """

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.d, self.heads, self.dh = cfg.d_model, cfg.num_heads, cfg.head_dim
        self.n_cls, self.n_kv = cfg.num_cls, cfg.gdpa_kv_len
        self.act, self.backend = cfg.gdpa_activation, cfg.attention_backend
        self.norm = nn.LayerNorm(self.d)
        self.kv_mix = _token_mix(self.n_cls, self.n_kv)  # then kv_norm
        self.kv_norm = nn.LayerNorm(self.d)
        self.wq = nn.Linear(self.d, self.d, bias=cfg.stream_bias)
        self.wkv = nn.Linear(self.d, 2 * self.d)
        self.wo = nn.Linear(self.d, self.d, bias=cfg.stream_bias)
        self.in_place = cfg.inplace_residual_gemm

    def forward(
        self, seq: torch.Tensor, x_sum: torch.Tensor, offsets: torch.Tensor, max_len: int,
        sample: torch.Tensor,
    ) -> torch.Tensor:
        b, t = x_sum.shape[0], seq.shape[0]
        kvs = self.kv_norm(self.kv_mix(x_sum.transpose(1, 2)).transpose(1, 2))  # [B, n_kv, d]
        k, v = self.wkv(kvs).reshape(b * self.n_kv, 2, self.heads, self.dh).unbind(1)
        q = self.wq(self.norm(seq)).reshape(t, self.heads, self.dh)
        kv_off = _jagged.uniform_offsets(b, self.n_kv, seq.device)
        o = _jagged.attention(
            q, k, v, offsets, kv_off, max_len, self.n_kv, activation=self.act, backend=self.backend
        )
        return _add_linear(seq, self.wo, o.reshape(t, self.d), self.in_place)

    def flops(self, s: _flops.Shapes) -> float:
        b, t = s.batch, s.tokens
        return (
            _flops.linear(b * self.d, self.n_cls, self.n_kv)
            + _flops.linear(b * self.n_kv, self.d, 2 * self.d)
            + 2 * _flops.linear(t, self.d, self.d)
            + _flops.attention(t * self.n_kv, self.heads, self.dh)
        )


def _out_slice(lin: nn.Module) -> Callable[[torch.Tensor, int, int], torch.Tensor] | None:
    """How to compute `lin(x)[..., start:stop]` from `lin`'s weight rows `start:stop` alone: a
    plain `nn.Linear` by slicing its weight and bias; a converted one (a precision recipe's
    linear, whose forward is its own) through its `forward_slice(x, start, stop)` (gem_precision's
    FP8 linears have one); None for any other module, whose caller then projects whole."""
    if _plain_linear(lin):
        w, bias = lin.weight, lin.bias
        return lambda x, start, stop: F.linear(x, w[start:stop], None if bias is None else bias[start:stop])
    fs = getattr(lin, "forward_slice", None)
    return fs if callable(fs) else None


class SeqAttention(nn.Module):
    """MHA over each jagged sequence with its CLS tokens prepended; RoPE; optional window.

    Works on the combined stream of a `_jagged.PrefixLayout` (its CLS rows already hold this
    layer's CLS tokens): the fused projection `[Tc, 3, H, D]` goes to one op
    (`_jagged.attention_qkv`) that rotates q and k, attends, and writes the projection's
    gradient itself (the attention's backward into its slots, q and k rotated back in place).
    """

    def __init__(self, cfg: GEMConfig, query_slots: int | None = None) -> None:
        super().__init__()
        if query_slots is not None and (query_slots < 1 or cfg.window is not None):
            raise ValueError(f"query_slots={query_slots} must be None, or >= 1 without a window "
                             f"(window={cfg.window})")
        self.d, self.heads, self.dh = cfg.d_model, cfg.num_heads, cfg.head_dim
        self.n_cls, self.window, self.base = cfg.num_cls, cfg.window, cfg.rope_base
        self.backend = cfg.attention_backend
        self.query_slots = query_slots
        self.gather_grads = cfg.gathers_stream_grads
        self.norm = nn.LayerNorm(self.d)
        self.wqkv = nn.Linear(self.d, 3 * self.d, bias=cfg.stream_bias)
        self.wo = nn.Linear(self.d, self.d, bias=cfg.stream_bias)
        self.in_place = cfg.inplace_residual_gemm

    def forward(self, comb: torch.Tensor, lay: _jagged.PrefixLayout,
                slots: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """comb `[Tc, d]` (CLS rows filled) → comb + attention `[Tc, d]`.

        With `query_slots` (the last layer, whose stream only these rows leave): `slots` =
        `_jagged.query_slots(lay, k)` (rows `[B, S]`, validity), and only those rows are
        attended and projected: → (comb + attention)[rows] `[B, S, d]`, zero in invalid slots.
        Keys and values still cover every row.
        """
        if (slots is None) != (self.query_slots is None):
            raise ValueError(f"slots must be given exactly when query_slots={self.query_slots} is set")
        tc = comb.shape[0]
        if slots is None:
            # One op from the fused projection: q and k rotated, the attention, and a backward
            # that writes the projection's gradient in place (gem_kernels' packed qkv).
            qkv = self.wqkv(self.norm(comb)).reshape(tc, 3, self.heads, self.dh)
            o = _jagged.attention_qkv(qkv, lay.cos, lay.sin, lay.offsets, lay.max_len, window=self.window,
                                      backend=self.backend)
            return _add_linear(comb, self.wo, o.reshape(tc, self.d), self.in_place)
        rows, valid = slots
        b, n = rows.shape
        if n != self.query_slots:
            raise ValueError(f"slots hold {n} rows per sample, must hold query_slots={self.query_slots}")
        rows, valid = rows.reshape(-1), valid.reshape(-1)
        # the residual's rows (zero in invalid slots); `slots` are query_slots(lay, n - lay.n)
        read = _jagged.slot_rows(comb, rows, valid, (lay, n - lay.n) if self.gather_grads else None)
        proj = _out_slice(self.wqkv)
        if proj is not None:
            # q for the slot rows only: the LayerNorm is per row, so norm(comb)[rows] is
            # norm(read), and the one gather serves the residual and q. (An invalid slot's q
            # is the LayerNorm's bias projected; its output is zeroed below, so it passes no
            # gradient.) A linear that cannot be sliced keeps the fused call.
            # k and v stay packed `[Tc, 2, H, D]`: the attention rotates k itself and writes
            # their gradient into one buffer (dk rotated back in place).
            kv = proj(self.norm(comb), self.d, 3 * self.d).reshape(tc, 2, self.heads, self.dh)
            q = proj(self.norm(read), 0, self.d)
            q = _jagged.rope(q.reshape(b * n, self.heads, self.dh), lay.cos[rows], lay.sin[rows])
            o = _jagged.attention_kv(q, kv, _jagged.uniform_offsets(b, n, comb.device), lay.offsets, n, lay.max_len,
                                     rope=(lay.cos, lay.sin), backend=self.backend)
        else:
            qkv = self.wqkv(self.norm(comb)).reshape(tc, 3, self.heads, self.dh)
            q, k, v = _jagged.rope_qkv(qkv, lay.cos, lay.sin)
            q = _jagged.slot_rows(q, rows, valid)
            o = _jagged.attention(
                q, k, v, _jagged.uniform_offsets(b, n, comb.device),
                lay.offsets, n, lay.max_len, backend=self.backend,
            )
        out: torch.Tensor = (read + self.wo(o.reshape(b * n, self.d))) * valid[:, None]
        return out.reshape(b, n, self.d)

    def flops(self, s: _flops.Shapes) -> float:
        """Useful forward FLOPs. With `query_slots`, only the valid slots' queries count (the
        CLS rows and up to `query_slots - num_cls` newest events per sample; the invalid slots
        are attended, unused. A converted `wqkv` without `forward_slice` still projects q for
        every row, uncounted."""
        tc = s.tokens + s.batch * self.n_cls
        if self.query_slots is not None:
            k = self.query_slots - self.n_cls
            q_rows = [self.n_cls + min(k, n) for n in s.lengths]
            return (
                _flops.linear(tc, self.d, 2 * self.d) + 2 * _flops.linear(sum(q_rows), self.d, self.d)
                + _flops.attention(sum(r * (n + self.n_cls) for r, n in zip(q_rows, s.lengths)), self.heads, self.dh)
            )
        pairs = sum(_flops.band_pairs(n + self.n_cls, self.window) for n in s.lengths)
        return (
            _flops.linear(tc, self.d, 3 * self.d) + _flops.linear(tc, self.d, self.d)
            + _flops.attention(pairs, self.heads, self.dh)
        )


class SeqPooling(nn.Module):
    """PMA: learned seeds attend over the jagged sequence (kv = the sequence).

    Hierarchical (Kunlun): `hier_seeds` seeds, then a rank-`hier_rank` compression over the
    seed axis to `num_pma_seeds` outputs — more views of a long history for little compute.
    """

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.d, self.heads, self.dh = cfg.d_model, cfg.num_heads, cfg.head_dim
        self.hier = cfg.hierarchical_pooling
        self.n_seeds = cfg.hier_seeds if self.hier else cfg.num_pma_seeds
        self.n_out, self.rank = cfg.num_pma_seeds, cfg.hier_rank
        self.backend = cfg.attention_backend
        self.seeds = nn.Parameter(torch.randn(self.n_seeds, self.d) * 0.02)
        self.wq = nn.Linear(self.d, self.d)
        self.norm = nn.LayerNorm(self.d)
        self.wkv = nn.Linear(self.d, 2 * self.d, bias=cfg.stream_bias)
        self.wo = nn.Linear(self.d, self.d)
        self.down: nn.Linear | None = None
        self.up: nn.Linear | None = None
        if self.hier:
            self.down = nn.Linear(self.n_seeds, self.rank, bias=False)
            self.up = _token_mix(self.rank, self.n_out)  # SeqSummary's norm follows

    def forward(self, seq: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        b, t = offsets.shape[0] - 1, seq.shape[0]
        q = self.wq(self.seeds).reshape(1, self.n_seeds, self.heads, self.dh)
        q = q.expand(b, -1, -1, -1).reshape(b * self.n_seeds, self.heads, self.dh)
        kv = self.wkv(self.norm(seq)).reshape(t, 2, self.heads, self.dh)
        q_off = _jagged.uniform_offsets(b, self.n_seeds, seq.device)
        o = _jagged.attention_kv(q, kv, q_off, offsets, self.n_seeds, max_len, backend=self.backend)
        p: torch.Tensor = self.wo(o.reshape(b * self.n_seeds, self.d)).reshape(b, self.n_seeds, self.d)
        p = p + self.seeds.to(p.dtype)
        if self.down is not None and self.up is not None:
            p = self.up(self.down(p.transpose(1, 2))).transpose(1, 2)
        return p  # [B, num_pma_seeds, d]

    def flops(self, s: _flops.Shapes) -> float:
        b, t = s.batch, s.tokens
        f = (
            _flops.linear(self.n_seeds, self.d, self.d) + _flops.linear(t, self.d, 2 * self.d)
            + _flops.attention(self.n_seeds * t, self.heads, self.dh)
            + _flops.linear(b * self.n_seeds, self.d, self.d)
        )
        if self.hier:
            f += _flops.linear(b * self.d, self.n_seeds, self.rank) + _flops.linear(b * self.d, self.rank, self.n_out)
        return f


class MeanPooling(nn.Module):
    """Ablation stand-in for PMA (`sequence_attention=False`): the mean of each sequence,
    mapped to `num_pma_seeds` tokens by one linear. Empty sequences pool to zeros."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.d, self.n_out = cfg.d_model, cfg.num_pma_seeds
        self.norm = nn.LayerNorm(self.d)
        self.proj = nn.Linear(self.d, self.n_out * self.d)

    def forward(self, seq: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        b, t = offsets.shape[0] - 1, seq.shape[0]
        sample = _jagged.token_sample(offsets, t)
        z = self.norm(seq)
        total = torch.zeros(b, self.d, device=seq.device, dtype=z.dtype).index_add_(0, sample, z)
        mean = total / _jagged.lengths_of(offsets).clamp(min=1).to(z.dtype)[:, None]
        out: torch.Tensor = self.proj(mean).reshape(b, self.n_out, self.d)
        return out

    def flops(self, s: _flops.Shapes) -> float:
        return _flops.linear(s.batch, self.d, self.n_out * self.d)


def recent_tokens(seq: torch.Tensor, offsets: torch.Tensor, k: int, prefix: int = 0) -> torch.Tensor:
    """The k most recent tokens of each sequence `[B, k, d]`, oldest first, zeros if shorter.

    `prefix` rows at the start of each sequence (the CLS rows of a `PrefixLayout`) are not
    events: they are never taken.
    """
    b = offsets.shape[0] - 1
    if k == 0 or seq.shape[0] == 0:
        return seq.new_zeros(b, k, seq.shape[1])
    rows, valid = _jagged.recent_rows(offsets, k, prefix)
    return seq[rows] * valid


class SeqSummary(nn.Module):
    """Cross arch, sequence → non-sequence: gated [CLS; PMA; recent] summary tokens."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.n, self.d = cfg.num_summary, cfg.d_model
        self.norm = nn.LayerNorm(self.d)
        self.glu = nn.Linear(self.d, 2 * self.d)

    def forward(self, cls: torch.Tensor, pooled: torch.Tensor, recent: torch.Tensor) -> torch.Tensor:
        z = torch.cat([cls, pooled.to(cls.dtype), recent.to(cls.dtype)], dim=1)
        return _glu(self.glu, self.norm(z))

    def flops(self, s: _flops.Shapes) -> float:
        return _flops.linear(s.batch * self.n, self.d, 2 * self.d)


class Interaction(nn.Module):
    """Interaction arch: self-attention over [feature tokens; sequence summary], then FFN."""

    def __init__(self, cfg: GEMConfig) -> None:
        super().__init__()
        self.f, self.n = cfg.num_tokens, cfg.num_tokens + cfg.num_summary
        self.d, self.heads, self.dh = cfg.d_model, cfg.num_heads, cfg.head_dim
        self.h = cfg.ffn_mult * cfg.d_model
        self.norm1 = nn.LayerNorm(self.d)
        self.wqkv = nn.Linear(self.d, 3 * self.d)
        self.wo = nn.Linear(self.d, self.d)
        self.norm2 = nn.LayerNorm(self.d)
        self.w1 = nn.Linear(self.d, self.h)
        self.w2 = nn.Linear(self.h, self.d)

    def forward(self, x: torch.Tensor, s_sum: torch.Tensor) -> torch.Tensor:
        """x `[B, F, d]`, s_sum `[B, n_sum, d]` -> the feature tokens `[B, F, d]`.

        Only the F feature tokens' outputs leave the layer (the next layer builds its own
        sequence summary), so only their queries are attended and projected by `wo`; the
        summary tokens serve as keys and values. The same output as attending all N tokens
        and dropping the summary rows, for 13 % fewer FLOPs at the h200 preset.
        """
        z = torch.cat([x, s_sum.to(x.dtype)], dim=1)
        b = z.shape[0]
        qkv = self.wqkv(self.norm1(z)).reshape(b, self.n, 3, self.heads, self.dh)
        q = qkv[:, : self.f, 0].transpose(1, 2)  # [B, H, F, Dh]
        k, v = qkv[:, :, 1:].permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, N, Dh]
        # Explicit products (not SDPA): N is tiny, and flop counters see them.
        p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh), dim=-1)
        a = torch.matmul(p, v).transpose(1, 2).reshape(b, self.f, self.d)
        x = x + self.wo(a)
        out: torch.Tensor = x + self.w2(F.gelu(self.w1(self.norm2(x))))
        return out

    def flops(self, s: _flops.Shapes) -> float:
        rows, queries = s.batch * self.n, s.batch * self.f
        return (
            _flops.linear(rows, self.d, 3 * self.d)
            + _flops.linear(queries, self.d, self.d)
            + _flops.attention(queries * self.n, self.heads, self.dh)
            + 2 * _flops.linear(queries, self.d, self.h)
        )


class InterFormerLayer(nn.Module):
    """One InterFormer layer; `pools=False` (computation skip) reuses the given pooling."""

    def __init__(self, cfg: GEMConfig, layer: int) -> None:
        super().__init__()
        self.num_recent = cfg.num_recent
        self.merged_reads = cfg.merged_stream_reads and cfg.num_recent > 0
        self.select_rows = cfg.select_stream_rows
        self.gather_grads = cfg.gathers_stream_grads
        self.nonseq_summary = NonSeqSummary(cfg)
        self.seq_ffn: GDPAFFN | PersonalizedFFN = GDPAFFN(cfg) if cfg.gdpa_ffn else PersonalizedFFN(cfg)
        # The last layer's stream is read only at its CLS rows and newest events unless it
        # pools (the heads take x and the summary), so its attention computes just those.
        self.last_rows = (cfg.last_layer_rows_only and cfg.sequence_attention and layer == cfg.num_layers - 1
                          and not cfg.pools_at(layer) and cfg.window is None)
        self.seq_attention = None
        if cfg.sequence_attention:
            self.seq_attention = SeqAttention(cfg, cfg.num_cls + cfg.num_recent if self.last_rows else None)
        self.pooling: SeqPooling | MeanPooling | None = None
        if cfg.pools_at(layer):
            self.pooling = SeqPooling(cfg) if cfg.sequence_attention else MeanPooling(cfg)
        self.seq_summary = SeqSummary(cfg)
        self.interaction = Interaction(cfg)

    def forward(
        self, x: torch.Tensor, comb: torch.Tensor, lay: _jagged.PrefixLayout,
        pooled: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """x `[B, F, d]`, the token stream `[Tc, d]` in `lay`'s CLS layout → (x, stream,
        sequence summary `[B, n_sum, d]`, pooling).

        The stream is None from the model's last layer when it does not pool (`last_rows`,
        GEMConfig.last_layer_rows_only): its attention runs for the rows this layer reads
        (CLS tokens and the `num_recent` newest events) only, so no full stream is made.

        The FFN runs over the CLS rows too (a few % more rows, no gather/scatter of the
        sequence); their values are then replaced by this layer's CLS tokens, so nothing of
        them survives: the output per sample is the prefixed-copy formulation's.
        """
        x_sum = self.nonseq_summary(x)
        comb = self.seq_ffn(comb, x_sum, lay.offsets, lay.max_len, lay.sample)
        stream: torch.Tensor | None = comb
        cls_out = x_sum
        recent: torch.Tensor | None = None
        events: torch.Tensor | None = None
        if self.seq_attention is not None:
            cls_in = x_sum.reshape(-1, x_sum.shape[2])
            if self.select_rows:
                comb = _jagged.with_cls(comb, cls_in, lay)
            else:  # in place on the FFN's fresh output (its add saves nothing for backward)
                comb = comb.index_copy_(0, lay.cls_rows, cls_in.to(comb.dtype))
            if self.last_rows and comb.shape[0] > 0:  # (it does not pool: reads no event row)
                read = self.seq_attention(comb, lay, _jagged.query_slots(lay, self.num_recent))
                cls_out, recent, stream = read[:, : lay.n], read[:, lay.n:], None
            else:
                stream = comb = self.seq_attention(comb, lay)
                if self.merged_reads and lay.n > 0 and comb.shape[0] > 0:
                    cls_flat, recent, events = _jagged.stream_reads(
                        comb, lay, self.num_recent, events=self.pooling is not None,
                        gather_grad=self.gather_grads)
                else:
                    cls_flat = _jagged.unique_rows(comb, lay.cls_rows)
                cls_out = cls_flat.reshape(x_sum.shape)
        if self.pooling is not None:
            if events is None:
                events = _jagged.events_of(comb, lay)
            pooled = self.pooling(events, lay.seq_offsets, lay.seq_max_len)
        if pooled is None:
            raise ValueError("a computation-skip layer needs the previous layer's pooling")
        if recent is None:
            recent = recent_tokens(comb, lay.offsets, self.num_recent, lay.n)
        s_sum = self.seq_summary(cls_out, pooled, recent)
        return self.interaction(x, s_sum), stream, s_sum, pooled
