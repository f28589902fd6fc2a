"""Spawned workers for test_hsdp.py (module level so spawn can pickle them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

DIM, BATCH, STEPS, LR = 16, 16, 5, 1e-2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """A single-device model: input projection, a ModuleList of blocks, a head."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(8, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h).squeeze(-1)


def data(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, generator=g))
            for _ in range(STEPS)]


def reference(seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = Net(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for x, y in data(seed):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_all(rank: int, world: int, seed: int, ckpt_dir: str) -> dict[str, Any]:
    """Three scenarios in one world (spawning is the slow part): fp32 + checkpoint,
    activation checkpointing + compile (eager backend), bf16 mixed precision."""
    out = {"fp32": run_hsdp(rank, world, seed, False, False, False, ckpt_dir),
           "ac_compile": run_hsdp(rank, world, seed, True, "eager", False, ""),
           "bf16": run_hsdp(rank, world, seed, False, False, True, "")}
    # the same runs with FSDP's all-gathers through gem_comms (copy engines over shared memory
    # on CPU, and "auto", which picks gloo on CPU); `calls` proves the hook carried them
    for comms in ("copy_engine", "auto"):
        for bf16 in (False, True):
            out[f"{comms}_{'bf16' if bf16 else 'fp32'}"] = run_hsdp(
                rank, world, seed, False, False, bf16, "", comms=comms)
    return out


def run_hsdp(rank: int, world: int, seed: int, ac: bool, compile: bool | str, bf16: bool,
             ckpt_dir: str, comms: str = "nccl") -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.tensor import DTensor

    from gem_parallel import BF16_MIXED, ParallelDims, apply_hsdp

    dims = ParallelDims(hosts=2, gpus_per_host=world // 2, dp_replicate=2, dp_shard=world // 2)
    meshes = dims.build_meshes("cpu")
    import gem_comms

    calls = [0]
    original = gem_comms.all_gather_into_tensor

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    gem_comms.all_gather_into_tensor = counting  # type: ignore[assignment]
    model = apply_hsdp(Net(seed), meshes, mp_policy=BF16_MIXED if bf16 else None, ac=ac,
                       compile=compile, comms=comms)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    per = BATCH // world
    losses = []
    for x, y in data(seed):
        xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        # .float(): under BF16_MIXED the output is bf16; torch 2.11's mse_loss backward refuses a
        # bf16 input beside an fp32 target ("Found dtype Float but expected BFloat16").
        loss = torch.nn.functional.mse_loss(model(xs).float(), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().float().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    placements = {n: (type(p).__name__, tuple(p.placements), tuple(p.device_mesh.mesh.shape))
                  for n, p in model.named_parameters() if isinstance(p, DTensor)}
    n_params = sum(1 for _ in model.parameters())
    gem_comms.all_gather_into_tensor = original  # type: ignore[assignment]
    params = [p.full_tensor() for p in model.parameters()]  # type: ignore[operator]
    out: dict[str, Any] = {"losses": losses, "placements": placements, "n_params": n_params,
                           "params": params, "comms_calls": calls[0]}
    if ckpt_dir:
        sd = get_model_state_dict(model)
        out["sd_types"] = sorted({type(v).__name__ for v in sd.values()})
        dcp.save(sd, checkpoint_id=ckpt_dir)
        # load back into a freshly initialised, differently seeded sharded model
        fresh = apply_hsdp(Net(seed + 99), meshes, mp_policy=None)
        fsd = get_model_state_dict(fresh)
        dcp.load(fsd, checkpoint_id=ckpt_dir)
        set_model_state_dict(fresh, fsd)
        same = all(torch.equal(a.full_tensor(), b.full_tensor())  # type: ignore[union-attr]
                   for a, b in zip(model.parameters(), fresh.parameters()))
        out["reload_equal"] = same
    return out
