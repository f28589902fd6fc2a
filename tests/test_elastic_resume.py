"""Resume on another world size: a checkpoint written by 2 gloo processes is loaded by 1 and
by 3, with dense tables (`get_state_dict`'s FQN-keyed state, DTensors where sharded) and
with torchrec table-wise tables (ShardedTensors, which each world size places differently);
and 2-D tables (`--sparse-mp`) on 4 processes <-> table-wise on 2, both ways.

What every rank holds after the trainer's own load is gathered into full tensors and
compared, bit for bit, with an independent reading of the same checkpoint: DCP's
`dcp_to_torch_save`, which assembles each tensor from the saved shards in one process with no
process group. Every model parameter and every optimizer state tensor must match: a shard
read into the wrong rows, a table left at its fresh initialisation or an optimizer state
keyed to the wrong parameter all show. Then the resumed run trains on.
"""
from __future__ import annotations

import inspect
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from _run import env, losses, stderr_tail, torchrun_cmd
from gem_trainer import _preflight, presets_tiny

COMMON = ["--eval-batches", "0", "--log-every", "1", "--no-progress", "--lr", "1e-3", "--batch-size", "16"]
SAVED_AT = 4

# Run under torchrun: the trainer's CLI resumes from the checkpoint; right after the
# Checkpointer's load, each rank's model and optimizer state (what `gem_parallel` `TrainState.state_dict`
# hands to DCP) is gathered into full tensors and rank 0 writes them to argv[1]. With
# `--steps` equal to the checkpoint's step the run then ends without training.
DUMP = r'''
import sys
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor
import gem_checkpoint
from gem_trainer.__main__ import main

out, argv = sys.argv[1], sys.argv[2:]
real = gem_checkpoint.Checkpointer.load

def shards(v):
    """DTensor over torchrec's LocalShardsWrapper (2-D tables): this rank's (offset, shard)s."""
    local = v.to_local()
    if hasattr(local, "local_shards"):
        return [(tuple(o), t.detach().clone()) for o, t in zip(local.local_offsets(), local.local_shards())]
    return None

def full(v):
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if isinstance(v, ShardedTensor):
        buf = torch.empty(v.size(), dtype=v.dtype) if rank0 else None
        v.gather(dst=0, out=buf)
        return buf
    if isinstance(v, DTensor):
        mine = shards(v)
        if mine is None:
            return v.full_tensor()
        # Every rank's shards (the replica groups each hold a full copy): assemble, and fail
        # if two ranks hold different values for the same rows.
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        buf, seen = torch.empty(v.shape, dtype=v.dtype), torch.zeros(v.shape, dtype=torch.bool)
        for part in everyone:
            for off, t in part:
                idx = tuple(slice(o, o + n) for o, n in zip(off, t.shape))
                if seen[idx].any() and not torch.equal(buf[idx][seen[idx]], t[seen[idx]]):
                    raise AssertionError(f"replicas disagree on a shard of {tuple(v.shape)} at {off}")
                buf[idx], seen[idx] = t, True
        if not seen.all():
            raise AssertionError(f"shards cover {int(seen.sum())} of {seen.numel()} elements")
        return buf
    return v.detach().clone() if isinstance(v, torch.Tensor) else v

def load(self, state, step=None):
    got = real(self, state, step)
    acc = _flat(state["app"].state_dict(), "app", {}, full)  # (_flat: the test's, written above)
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save({"step": got, "state": acc}, out)
    return got

gem_checkpoint.Checkpointer.load = load
sys.exit(main(argv))
'''


def _flat(v: Any, path: str, acc: dict[str, Any], leaf: Any = None) -> dict[str, Any]:
    """Nested dicts and lists as one dict of dotted paths; each leaf through `leaf` if given."""
    if isinstance(v, dict):
        for k, x in v.items():
            _flat(x, f"{path}.{k}", acc, leaf)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _flat(x, f"{path}.{i}", acc, leaf)
    else:
        acc[path] = leaf(v) if leaf is not None else v
    return acc


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, stderr_tail(r.stderr)
    return r


def _save(tmp_path: Path, nproc: int, *layout: str) -> tuple[Path, dict[str, Any]]:
    """A checkpoint at SAVED_AT written by `nproc` processes, and DCP's independent reading of
    it: every saved tensor assembled in this process, keyed `app.<path>`."""
    ck = tmp_path / "ck"
    _run(torchrun_cmd(nproc, *COMMON, *layout, "--steps", str(SAVED_AT), "--ckpt-dir", str(ck),
                      "--ckpt-every", str(SAVED_AT), "--log-dir", str(tmp_path / "log_saved")))
    dcp_to_torch_save(ck / f"step_{SAVED_AT}", tmp_path / "ref.pt")
    ref = {k[1:]: v for k, v in _flat(torch.load(tmp_path / "ref.pt", weights_only=False), "", {}).items()
           if k.startswith(".app.")}
    n_tables = sum(1 for k in ref if k.startswith("app.model.sparse.") and k.endswith(".weight"))
    assert n_tables >= 2 and any(k.startswith("app.optim.") for k in ref), sorted(ref)[:20]
    return ck, ref


def _resume_elsewhere(tmp_path: Path, ck: Path, ref: dict[str, Any], saved_world: int, world: int,
                      *layout: str) -> None:
    """Resume a copy of `ck` on `world` processes with `layout`: the state right after the
    trainer's load equals `ref` bit for bit, then the run trains two steps and says that the
    global batch changed."""
    name = f"{world}{''.join(layout)}"
    run_ck = tmp_path / f"ck_{name}"
    shutil.copytree(ck, run_ck)
    script, dump = tmp_path / "dump.py", tmp_path / f"loaded_{name}.pt"
    script.write_text("from typing import Any\n\n" + inspect.getsource(_flat) + DUMP)
    args = [*COMMON, *layout, "--ckpt-dir", str(run_ck), "--ckpt-every", str(SAVED_AT), "--resume"]
    _run(_torchrun_script(world, script, dump, *args, "--steps", str(SAVED_AT)))
    got = torch.load(dump, weights_only=False)
    assert got["step"] == SAVED_AT
    state = got["state"]
    assert sorted(state) == sorted(ref), (name, sorted(set(state) ^ set(ref))[:20])
    for k, want in ref.items():
        have = state[k]
        if isinstance(want, torch.Tensor):
            assert isinstance(have, torch.Tensor) and have.dtype == want.dtype, (name, k, type(have))
            assert torch.equal(have, want), f"{name}: {k} differs from the saved tensor"
        else:
            assert have == want, (name, k, have, want)
    # ... and the resumed run trains on from the loaded step, on the new world size, and says
    # that the global batch changed with it (--batch-size is per rank)
    logs = tmp_path / f"log_{name}"
    r = _run(torchrun_cmd(world, *args, "--steps", str(SAVED_AT + 2), "--log-dir", str(logs)))
    said = f"resumed step {SAVED_AT}, written by {saved_world} process(es), on {world}:"
    assert said in r.stderr and f"--batch-size=16 samples is per rank, so a step now takes {world}/{saved_world}" \
        in r.stderr, stderr_tail(r.stderr)
    got_losses = losses(logs)
    assert sorted(got_losses) == [SAVED_AT + 1, SAVED_AT + 2], got_losses
    assert all(0.0 < v < 2.0 for v in got_losses.values()), got_losses


@pytest.mark.parametrize("tables", ["none", "table_wise"])
def test_a_two_process_checkpoint_loads_exactly_on_one_and_three(tmp_path: Path, tables: str) -> None:
    layout = ("--sparse-sharding", tables)
    ck, ref = _save(tmp_path, 2, *layout)
    for world in (1, 3):
        _resume_elsewhere(tmp_path, ck, ref, 2, world, *layout)


@pytest.mark.parametrize("saved", ["2d", "table_wise"])
def test_2d_and_table_wise_checkpoints_load_on_each_other(tmp_path: Path, saved: str) -> None:
    """4 processes with 2-D tables (`--sparse-mp 2`: table-wise over 2 ranks, 2 replica
    groups; DTensors over torchrec's LocalShardsWrapper) <-> 2 processes table-wise
    (ShardedTensors). On the 2-D side every replica must hold the saved rows."""
    two_d = ("--sparse-sharding", "table_wise", "--sparse-mp", "2")
    flat = ("--sparse-sharding", "table_wise")
    if saved == "2d":
        ck, ref = _save(tmp_path, 4, *two_d)
        _resume_elsewhere(tmp_path, ck, ref, 4, 2, *flat)
    else:
        ck, ref = _save(tmp_path, 2, *flat)
        _resume_elsewhere(tmp_path, ck, ref, 2, 4, *two_d)


def test_world_change_notice() -> None:
    cfg = presets_tiny(batch_size=8)
    assert _preflight.world_change_notice(cfg, 7, 2, 2) is None  # same world size
    assert _preflight.world_change_notice(cfg, 7, None, 2) is None  # unknown (an older marker)
    got = _preflight.world_change_notice(cfg, 7, 4, 2)
    assert got is not None and "resumed step 7, written by 4 process(es), on 2" in got and "2/4" in got, got
    assert "batch_size=8 samples is per rank" in got and "batch_size=16 keeps it" in got, got
    tok = _preflight.world_change_notice(presets_tiny(batch_tokens=4096), 7, 2, 3)
    assert tok is not None and "batch_tokens=4096 tokens is per rank" in tok and "3/2" in tok, tok
    assert "keeps it" not in tok, tok  # 8192 tokens do not split into 3 equal budgets


def _torchrun_script(nproc: int, script: Path, *args: object) -> list[str]:
    """`torchrun --nproc-per-node nproc script args` on a free port (gloo on CPU)."""
    cmd = torchrun_cmd(nproc)
    i = cmd.index("-m", cmd.index("--master-port"))  # drop `-m gem_trainer`
    return [*cmd[:i], str(script), *map(str, args)]
