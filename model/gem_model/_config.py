"""GEMConfig: every size and switch of the GEM-like model, in one frozen dataclass.

The model does not import gem_data: the feature sizes (vocabularies, number of event types,
sparse tables, dense width, domains, tasks) are copied into this config by the caller, e.g.
`gem_model.presets.tiny(event_vocab=..., ...)`. Variants via `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass

_BACKENDS = ("auto", "triton", "reference")
_STREAM_DTYPES = ("compute", "float32")
_ACTIVATIONS = ("softmax", "silu", "gelu", "relu", "relu2", "sigmoid", "identity")


@dataclass(frozen=True, kw_only=True)
class GEMConfig:
    """Sizes and switches of `GEMModel`.

    Feature sizes (from the data):
        event_vocab: item-id vocabulary of the event sequence.
        num_event_types: event types (click, like, purchase, ...), ids in [0, num_event_types).
        sparse_features: `((name, vocab), ...)` non-sequence sparse id features.
        num_dense: dense feature width (0 allowed: no dense token).
        num_domains: surfaces; the heads are conditioned on the domain id.
        tasks: task names; the model emits one logit per task.

    Dense blocks:
        d_model: token width everywhere after the embedding front end.
        num_heads: attention heads; head dim = d_model // num_heads (128 on the H200 preset).
        num_layers: InterFormer layers.
        emb_dim: width of each sparse (pooled) embedding table.
        event_emb_dim: width of the event-id table (the widest per-type width).
        ffn_mult: hidden = ffn_mult * d_model in the personalized and interaction FFNs.
        num_cls: CLS tokens prepended to each sequence (= non-sequence summary tokens).
        num_pma_seeds: PMA outputs per sample (learned seeds as queries over the sequence).
        num_recent: most recent tokens taken into the sequence summary.
        rank_buckets: buckets of an event's rank from the newest event (0 = newest), added
            to its token: ranks below 16 exact, then log2-bucketed; 0 switches it off.
        head_hidden: width of the shared bottom and of each task tower.
        rope_base: rotary embedding base.
        stream_bias: biases on the linears that run over every row of the token stream (the
            sequence FFN's / GDPA's projections, the sequence attention's `wqkv` and `wo`,
            the pooling's `wkv`). False drops them (as most large transformers do): each
            then costs no column sum over the token rows in the backward (a read of its whole
            output gradient; ~6 ms of an h200 step), and the residual projections (`wo`, the
            FFN's `w2`) add the residual inside their GEMM (`addmm(res, x, Wᵀ)`) instead of a
            separate add pass. Per-sample linears keep theirs. Of the dropped biases, those of
            `wqkv`, `wq`, `wkv` and `w1` follow a LayerNorm whose own bias β still shifts their
            output (by Wβ). True by default (the layout of every earlier checkpoint); the h200
            preset sets False (gem-model 0.6.0).

        sequence_attention: False switches attention over the event sequence off (an
            ablation baseline): no self-attention (the CLS outputs are the non-sequence
            summary itself) and mean pooling instead of PMA.

    Kunlun switches (arXiv 2602.10016):
        gdpa_ffn: replace the personalized FFN by GDPA cross-attention of the sequence tokens
            over `gdpa_kv_len` tokens built from the non-sequence summary.
        gdpa_activation: GDPA activation (silu as in Kunlun/HSTU).
        hierarchical_pooling: PMA with `hier_seeds` (> num_pma_seeds) seeds, then a rank-
            `hier_rank` compression over the seed axis down to `num_pma_seeds` outputs.
        window: sliding-window self-attention (symmetric band) over the sequence; None = full.
        computation_skip: odd layers reuse the previous layer's pooling (PMA + recent).
        event_widths: per-event-type embedding widths (event-level personalization),
            each in [1, event_emb_dim]; None = every type uses the full width.

    Runtime:
        attention_backend: gem_kernels backend ("auto": Triton on CUDA, reference on CPU).
        use_torchrec: sparse front end through torchrec's EmbeddingBagCollection; None = when
            importable.
        stream_dtype: dtype of the jagged token stream that every layer reads and adds into
            (the residual stream, `[T + B*num_cls, d_model]`, the largest activation):
            "compute" = the compute dtype (bf16 under CUDA autocast, the parameters' dtype
            otherwise); "float32" = float32 under autocast too (twice the memory traffic of
            every norm, residual add and their backward). Without autocast both hold
            float32 and agree to float32 rounding (the event front end sums its small
            tables inside the projection GEMM for "compute", by a lookup for "float32").
        merged_stream_reads: each layer reads the stream after its attention (CLS rows,
            recent tokens, and the event rows in pooling layers) through one autograd node
            whose backward writes the stream's gradient once, instead of three reads that
            each write a dense zero-filled gradient (`_jagged.stream_reads`). The same
            forward values; the gradient's sums in another order. On by default since
            0.3.3 (H200, h200 preset, 300 steps: 0.2429 s vs 0.2454 s per step; the quality
            bench's AUCs equal within 0.0002); False restores the separate reads.
        select_stream_rows: when compiled, each layer's CLS rows are replaced by a per-row
            select (`_jagged.with_cls`) instead of a scatter, and the merged stream reads'
            gradient is gathered per row instead of scattered into a fresh buffer, so
            inductor can fuse both with their neighbours (the FFN's residual add and the
            attention's layer norm; autograd's sum of the stream's gradients): on the H200
            those were four separate 0.38 ms add passes per layer in the h200 step. The same
            values bit for bit, the same gradients (tests/test_layout.py). Off by default:
            in the trainer (H100, h200 preset, three same-box pairs) it made the step 1.2-1.9 %
            slower (trainer/BENCHMARKS.md, 2026-12-06). `python3 tools/with_model.py
            select_stream_rows=true -- -m gem_trainer ...` runs it.
        gather_stream_grads: the backward half of `select_stream_rows` alone: when compiled,
            the gradient of each layer's sparse reads of the stream (its CLS rows and recent
            tokens, the event rows of a pooling layer, the last layer's query rows) is
            gathered per row, a pointwise form inductor writes in the same pass as autograd's
            sum with the stream's other gradient, instead of scattered into a fresh
            zero-filled (or event-filled) `[Tc, d]` buffer that a separate full-size add then
            sums. The forward keeps its in-place CLS scatter. The same gradients, in the same
            order of sums (tests/test_layout.py). Off by default: in the trainer (H100, h200
            preset, two same-box pairs) it made the step 0.9-1.4 % slower
            (trainer/BENCHMARKS.md, 2026-12-06, forty-second session); `python3
            tools/with_model.py gather_stream_grads=true -- -m gem_trainer ...` runs it.
        inplace_residual_gemm: when compiled, the stream's residual GEMMs (the FFN's `w2`, the
            attention's `wo`) add into a copy of the residual that inductor writes in the
            layer-norm kernel already reading it, by an in-place `addmm_` (cuBLAS's C = D),
            instead of `torch.addmm`, which first copies the residual into its output with a
            device-to-device copy (7 per h200 step, 2.6 ms on an H100: trainer/BENCHMARKS.md,
            2026-12-06, forty-second session). The same values bit for bit. On by default since
            gem-model 0.6.3: on an H100 the copies leave the profile and the h200 step is
            0.55-0.6 % faster in two same-box pairs (trainer/BENCHMARKS.md, 2026-12-06,
            forty-third session); eager runs are unchanged. `False` restores `torch.addmm`.
        last_layer_rows_only: the last layer's stream is read only at its CLS rows and its
            `num_recent` newest events (the heads take the feature tokens and the summary),
            unless that layer pools. So its attention computes queries, `wo` and the
            residual for those rows only, while keys and values still cover every row: the
            same outputs and gradients up to rounding, without the last layer's
            `[Tc, Tc]`-sized attention (a quarter of all attention at the h200 preset). On
            by default (gem-model 0.4.0); False attends every row, as before. Applies where
            the last layer does not pool (computation_skip with an even num_layers) and has
            no window (the band needs aligned query and key positions).

    Precision (MXFP8), activation checkpointing, compile and sharding are not model config:
    `gem_parallel.parallelize(model, ..., precision="mxfp8_rceil")` applies them from outside.
    """

    event_vocab: int
    num_event_types: int
    sparse_features: tuple[tuple[str, int], ...]
    num_dense: int
    num_domains: int
    tasks: tuple[str, ...] = ("click",)

    d_model: int = 64
    num_heads: int = 2
    num_layers: int = 2
    emb_dim: int = 32
    event_emb_dim: int = 32
    ffn_mult: int = 4
    num_cls: int = 2
    num_pma_seeds: int = 2
    num_recent: int = 2
    rank_buckets: int = 24
    head_hidden: int = 64
    rope_base: float = 10000.0
    stream_bias: bool = True
    sequence_attention: bool = True

    gdpa_ffn: bool = False
    gdpa_kv_len: int = 8
    gdpa_activation: str = "silu"
    hierarchical_pooling: bool = False
    hier_seeds: int = 8
    hier_rank: int = 4
    window: int | None = None
    computation_skip: bool = False
    event_widths: tuple[int, ...] | None = None

    attention_backend: str = "auto"
    use_torchrec: bool | None = None
    stream_dtype: str = "compute"
    merged_stream_reads: bool = True
    select_stream_rows: bool = False
    gather_stream_grads: bool = False
    inplace_residual_gemm: bool = True
    last_layer_rows_only: bool = True

    def __post_init__(self) -> None:
        positive = (
            "event_vocab", "num_event_types", "num_domains", "d_model", "num_heads", "num_layers",
            "emb_dim", "event_emb_dim", "ffn_mult", "num_cls", "num_pma_seeds", "head_hidden",
            "gdpa_kv_len", "hier_seeds", "hier_rank",
        )
        for name in positive:
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"GEMConfig.{name}={val!r} must be an int >= 1")
        for name in ("num_dense", "num_recent", "rank_buckets"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ValueError(f"GEMConfig.{name}={val!r} must be an int >= 0")
        for name in ("stream_bias", "merged_stream_reads", "select_stream_rows", "gather_stream_grads",
                     "inplace_residual_gemm", "last_layer_rows_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GEMConfig.{name}={getattr(self, name)!r} must be a bool")
        if not self.tasks:
            raise ValueError(f"GEMConfig.tasks={self.tasks!r} must name at least one task")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"GEMConfig.tasks={self.tasks!r} must be unique")
        names = [n for n, _ in self.sparse_features]
        if len(set(names)) != len(names):
            raise ValueError(f"GEMConfig.sparse_features names {names} must be unique")
        for n, vocab in self.sparse_features:
            if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
                raise ValueError(f"GEMConfig.sparse_features[{n!r}] vocab={vocab!r} must be >= 1")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"GEMConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"head dim d_model/num_heads={self.d_model // self.num_heads} must be even (RoPE)"
            )
        if self.gdpa_activation not in _ACTIVATIONS:
            raise ValueError(f"GEMConfig.gdpa_activation={self.gdpa_activation!r} must be one of {_ACTIVATIONS}")
        if self.hierarchical_pooling and self.hier_seeds <= self.num_pma_seeds:
            raise ValueError(
                f"GEMConfig.hier_seeds={self.hier_seeds} must exceed num_pma_seeds="
                f"{self.num_pma_seeds} when hierarchical_pooling is on"
            )
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1
        ):
            raise ValueError(f"GEMConfig.window={self.window!r} must be None or an int >= 1")
        if self.event_widths is not None:
            if len(self.event_widths) != self.num_event_types:
                raise ValueError(
                    f"GEMConfig.event_widths has {len(self.event_widths)} entries, must have "
                    f"num_event_types={self.num_event_types}"
                )
            if any(not 1 <= w <= self.event_emb_dim for w in self.event_widths):
                raise ValueError(
                    f"GEMConfig.event_widths={self.event_widths} must lie in [1, event_emb_dim="
                    f"{self.event_emb_dim}]"
                )
        if self.stream_dtype not in _STREAM_DTYPES:
            raise ValueError(f"GEMConfig.stream_dtype={self.stream_dtype!r} must be one of {_STREAM_DTYPES}")
        if self.attention_backend not in _BACKENDS:
            raise ValueError(f"GEMConfig.attention_backend={self.attention_backend!r} must be one of {_BACKENDS}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_tokens(self) -> int:
        """Non-sequence feature tokens: one per sparse feature, one dense, one domain."""
        return len(self.sparse_features) + (1 if self.num_dense else 0) + 1

    @property
    def num_summary(self) -> int:
        """Sequence-summary tokens: CLS outputs + PMA outputs + most recent tokens."""
        return self.num_cls + self.num_pma_seeds + self.num_recent

    @property
    def gathers_stream_grads(self) -> bool:
        """Whether compiled layers gather their stream reads' gradients per row
        (`gather_stream_grads`, or `select_stream_rows`, which includes it)."""
        return self.gather_stream_grads or self.select_stream_rows

    def pools_at(self, layer: int) -> bool:
        """Whether layer `layer` computes its pooling (False: reuses the cached one)."""
        return not (self.computation_skip and layer % 2 == 1)
