"""An analytic communication-volume model: bytes per rank per step, per mesh dimension.

No cluster is here, so scale is planned on paper: for a model config and a topology (hosts x
GPUs per host, :class:`ParallelDims`), count what every collective of one training step
moves per rank, which mesh dimension it runs on, whether its group crosses hosts, and a
bandwidth-bound time estimate. Ring collectives over a group of n ranks move, per rank:
all-gather / reduce-scatter ``(n-1)/n * full``, all-reduce ``2 (n-1)/n * full``; an
all-to-all sends ``(n-1)/n`` of its input, of which the off-host share goes over the network.
Time is an alpha-beta estimate: bytes over the slowest link the group uses, plus a fixed
latency per ring step / all-to-all peer.

Collectives counted (per step):
* ``fsdp_allgather``  dense params, "shard" dim: forward, and again in backward when
  ``reshard_after_forward`` (FSDP2's default for blocks).
* ``fsdp_reducescatter``  dense grads, "shard" dim.
* ``hsdp_allreduce``  dense grad shards (1/shard of the model), "replicate" dim.
* ``emb_a2a_fwd`` / ``emb_a2a_bwd``  looked-up embedding rows (pooled features + sequence
  tokens) out / their gradients back, sparse "shard" (model-parallel) dim.
* ``sparse_sync``  2-D sparse: all-reduce (AVG) of each rank's table shard + optimizer state
  across the sparse "replicate" dim, amortised over ``sparse_sync_every`` steps.
"""

from __future__ import annotations

import dataclasses

from gem_parallel._dims import ParallelDims

NVLINK_BYTES_PER_S = 450e9
"""Per-GPU, per-direction NVLink 4 bandwidth of an H100/H200 HGX host (900 GB/s bidir.)."""
NETWORK_BYTES_PER_S = 50e9
"""Per-GPU inter-host bandwidth: one 400 Gb/s NIC per GPU (RoCE / InfiniBand NDR)."""
STEP_LATENCY_S = 5e-6
"""alpha of the alpha-beta model: per ring step, or per peer of an all-to-all. It is what makes
a 4096-way all-to-all slow even when its bytes are small (the case for 2-D sparse)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommConfig:
    """What a step moves (sizes in elements or bytes as named).

    Attributes:
        dense_params: dense (HSDP) parameter count.
        embedding_bytes: total bytes of all embedding tables (weights).
        embedding_dim: embedding dimension D.
        lookups_per_sample: embedding rows fetched per sample (pooled features count once,
            each sequence token counts once: sequence embeddings are not pooled).
        batch_per_rank: samples per rank per step.
        param_bytes: bytes per dense param on the all-gather wire (2 = bf16, 1 = FP8).
        grad_bytes: bytes per dense grad element in reduction (4 = fp32 reduce).
        act_bytes: bytes per embedding activation element in the all-to-all.
        optimizer_state_ratio: embedding optimizer-state bytes per table byte (row-wise
            Adagrad: ~1/D; Adam: 2).
        reshard_after_forward: FSDP re-all-gathers parameters in backward.
        sparse_sync_every: 2-D sparse replica sync period in steps.
    """

    dense_params: int
    embedding_bytes: int
    embedding_dim: int
    lookups_per_sample: int
    batch_per_rank: int
    param_bytes: int = 2
    grad_bytes: int = 4
    act_bytes: int = 2
    optimizer_state_ratio: float = 0.0
    reshard_after_forward: bool = True
    sparse_sync_every: int = 1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                raise ValueError(f"{f.name}={v} must be >= 0")
        if self.sparse_sync_every < 1:
            raise ValueError(f"sparse_sync_every={self.sparse_sync_every} must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommItem:
    """One collective of a step, per rank."""

    name: str
    mesh: str  # "dense" or "sparse"
    dim: str  # "shard" or "replicate"
    group_size: int
    bytes_per_rank: float
    offhost_bytes_per_rank: float
    crosses_hosts: bool
    seconds: float


def _group_hosts(dims: ParallelDims, ranks: list[int]) -> tuple[bool, float]:
    """(crosses hosts, share of rank ranks[0]'s peers that are on other hosts)."""
    me = dims.host_of(ranks[0])
    off = sum(dims.host_of(r) != me for r in ranks)
    return off > 0, off / len(ranks)


def _item(dims: ParallelDims, name: str, mesh: str, dim: str, ranks: list[int], full: float,
          kind: str) -> CommItem:
    n = len(ranks)
    crosses, off_share = _group_hosts(dims, ranks)
    frac = {"ag": (n - 1) / n, "rs": (n - 1) / n, "ar": 2 * (n - 1) / n, "a2a": (n - 1) / n}[kind]
    moved = full * frac
    if kind == "a2a":
        # each peer gets 1/n of the input; the off-host peers' shares go over the network
        off = full * off_share
        on = moved - off
        seconds = max(on / NVLINK_BYTES_PER_S, off / NETWORK_BYTES_PER_S)
        seconds += (n - 1) * STEP_LATENCY_S
    else:
        # a ring is as fast as its slowest link
        off = moved if crosses else 0.0
        seconds = moved / (NETWORK_BYTES_PER_S if crosses else NVLINK_BYTES_PER_S)
        seconds += (2 if kind == "ar" else 1) * (n - 1) * STEP_LATENCY_S
    return CommItem(name=name, mesh=mesh, dim=dim, group_size=n, bytes_per_rank=moved,
                    offhost_bytes_per_rank=off, crosses_hosts=crosses, seconds=seconds)


def comm_volume(cfg: CommConfig, dims: ParallelDims) -> list[CommItem]:
    """The collectives of one training step, per rank (rank 0's groups; all are alike).

    Args:
        cfg: model and batch sizes.
        dims: topology and degrees (validated here).

    Returns:
        One :class:`CommItem` per collective with a group larger than one rank.
    """
    dims.validate()
    dense, sparse = dims.dense_layout(), dims.sparse_layout()
    shard_g, rep_g = dense[0].tolist(), dense[:, 0].tolist()
    mp_g, srep_g = sparse[0].tolist(), sparse[:, 0].tolist()
    p = float(cfg.dense_params)
    items: list[CommItem] = []
    if len(shard_g) > 1:
        ag_times = 2 if cfg.reshard_after_forward else 1
        items.append(_item(dims, "fsdp_allgather", "dense", "shard", shard_g,
                           ag_times * p * cfg.param_bytes, "ag"))
        items.append(_item(dims, "fsdp_reducescatter", "dense", "shard", shard_g,
                           p * cfg.grad_bytes, "rs"))
    if len(rep_g) > 1:
        items.append(_item(dims, "hsdp_allreduce", "dense", "replicate", rep_g,
                           p * cfg.grad_bytes / len(shard_g), "ar"))
    if len(mp_g) > 1:
        act = float(cfg.batch_per_rank * cfg.lookups_per_sample * cfg.embedding_dim
                    * cfg.act_bytes)
        items.append(_item(dims, "emb_a2a_fwd", "sparse", "shard", mp_g, act, "a2a"))
        items.append(_item(dims, "emb_a2a_bwd", "sparse", "shard", mp_g, act, "a2a"))
    if len(srep_g) > 1:
        shard_bytes = cfg.embedding_bytes * (1 + cfg.optimizer_state_ratio) / len(mp_g)
        items.append(_item(dims, "sparse_sync", "sparse", "replicate", srep_g,
                           shard_bytes / cfg.sparse_sync_every, "ar"))
    return items


def comm_table(rows: list[tuple[str, ParallelDims, list[CommItem]]]) -> str:
    """Formats ``(label, dims, comm_volume(...))`` rows: GB per rank per step per collective.

    A ``*`` marks a collective whose group crosses hosts; ``est_ms`` is the bandwidth-bound
    time of all collectives run back to back (no overlap), the worst case.
    """
    names = ["fsdp_allgather", "fsdp_reducescatter", "hsdp_allreduce", "emb_a2a_fwd",
             "emb_a2a_bwd", "sparse_sync"]
    short = ["fsdp_AG", "fsdp_RS", "hsdp_AR", "a2a_fwd", "a2a_bwd", "sp_sync"]
    head = (f"{'config':<14}{'hosts x gpus':>13}{'dense RxS':>11}{'sparse MPxR':>12}"
            + "".join(f"{s:>10}" for s in short) + f"{'offhost GB':>11}{'est_ms':>9}")
    lines = [head, "-" * len(head)]
    for label, d, items in rows:
        by = {i.name: i for i in items}
        cells = []
        for n in names:
            it = by.get(n)
            cells.append(f"{'-':>10}" if it is None else
                         f"{it.bytes_per_rank / 1e9:>9.3f}{'*' if it.crosses_hosts else ' '}")
        off = sum(i.offhost_bytes_per_rank for i in items) / 1e9
        ms = sum(i.seconds for i in items) * 1e3
        lines.append(f"{label:<14}{f'{d.hosts} x {d.gpus_per_host}':>13}"
                     f"{f'{d.replicate}x{d.shard}':>11}"
                     f"{f'{d.sparse_model_parallel}x{d.sparse_replicas}':>12}"
                     + "".join(cells) + f"{off:>11.3f}{ms:>9.1f}")
    lines.append("GB per rank per step; * = group crosses hosts; est_ms at "
                 f"{NVLINK_BYTES_PER_S / 1e9:.0f} GB/s NVLink, {NETWORK_BYTES_PER_S / 1e9:.0f} "
                 f"GB/s network per GPU, {STEP_LATENCY_S * 1e6:g} us per ring step / a2a peer, "
                 "no overlap.")
    return "\n".join(lines)
