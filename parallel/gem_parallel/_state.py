"""The training state of a parallelized model, as one DCP `Stateful`.

Without torchrec-sharded tables the model and its optimizers go through torch's
`get_state_dict` / `set_state_dict`: FQN-keyed optimizer state and DTensor shards, so DCP
reshards them on another world size.

torchrec's `DistributedModelParallel` (and `DMPCollection`, 2-D) expects to be the root
module: nested inside a model, the parent's `state_dict()` rewrites its keys, and
`get_state_dict` cannot name its parameters. So when the model holds one, the state is built
module by module: each torchrec-sharded submodule is asked for its own state dict
(ShardedTensors, or DTensors over `LocalShardsWrapper` for 2-D) under its qualified name, and
each subtree without one for its ordinary `state_dict()`. The optimizers' state is keyed by
parameter index, which does not depend on the world size; on load, every saved index must
name one of the optimizer's parameters with that state's shape (`_check_index_state`), so a
checkpoint of a model with other parameters is refused instead of loaded onto the wrong
ones. The tables' fused optimizer (torchrec's, inside the sharded module) keeps its own
state in the module's state dict.

Tested with gem_checkpoint in `tests/test_multiprocess_ckpt.py`, `tests/test_sparse_2d.py`
(bitwise resume) and `tests/test_elastic_resume.py` (resume on 1 and 3 processes, 2-D <->
table-wise), and here in `parallel/tests/test_state.py`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


def _torchrec_classes() -> tuple[type, ...]:
    """torchrec's sharded-model classes, or () where torchrec is not importable (the GPU box)."""
    try:
        from torchrec.distributed.model_parallel import DistributedModelParallel
    except ImportError:
        return ()
    return (DistributedModelParallel,)


def sharded_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The torchrec-sharded submodules of `model` (qualified name, module), outermost only."""
    classes = _torchrec_classes()
    if not classes:
        return []
    out: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, classes) and not any(name.startswith(p + ".") for p, _ in out):
            out.append((name, model.get_submodule(name)))  # (the same module, typed)
    return out


def replica_sync(model: nn.Module) -> Callable[[], None] | None:
    """The replica sync of 2-D sparse tables (`DMPCollection.sync`: average each table over
    its replica groups; call it after every optimizer step), or None when the model has none."""
    syncs = [getattr(m, "sync") for _, m in sharded_modules(model)
             if callable(getattr(m, "sync", None)) and hasattr(m, "_ctxs")]
    if not syncs:
        return None

    def sync() -> None:
        for s in syncs:
            s()
    return sync


class TrainState:
    """A model and its optimizers as one DCP `Stateful` (see the module docstring).

    Args:
        model: the parallelized model (torchrec-sharded submodules are found by type).
        optimizers: the optimizers of its parameters outside torchrec's fused optimizer.
    """

    def __init__(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model={type(model).__name__} must be an nn.Module")
        bad = [type(o).__name__ for o in optimizers if not isinstance(o, torch.optim.Optimizer)]
        if bad:
            raise TypeError(f"optimizers must be torch.optim.Optimizer instances; got {bad}")
        self.model, self.optimizers = model, list(optimizers)
        self.sharded = [name for name, _ in sharded_modules(model)]  # qualified names; [] = none

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(self.model, self.optimizers)
            return {"model": msd, "optim": osd}
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        # DCP loads in place: the optimizer's state must exist (a fresh one has none), and
        # its int keys are kept as strings (DCP's flattened paths are strings).
        # param_groups (hyper-parameters, param ids) come from the caller's config on resume.
        optim = {}
        for i, o in enumerate(self.optimizers):
            _init_optim_state(o)
            optim[str(i)] = {"state": {str(k): v for k, v in o.state_dict()["state"].items()}}
        return {"model": _module_state(self.model, "", set(self.sharded), {}), "optim": optim}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if not self.sharded:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            set_state_dict(self.model, self.optimizers, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"])
            return
        names = {id(p): n for n, p in self.model.named_parameters()}
        states = [{int(k): v for k, v in sd["optim"][str(i)]["state"].items()} for i in range(len(self.optimizers))]
        for i, (o, state) in enumerate(zip(self.optimizers, states)):
            _check_index_state(i, o, state, names)  # before anything is loaded
        _load_module_state(self.model, "", set(self.sharded), sd["model"])
        for o, state in zip(self.optimizers, states):
            o.load_state_dict({"state": state, "param_groups": o.state_dict()["param_groups"]})


def _check_index_state(i: int, opt: torch.optim.Optimizer, state: dict[int, Any], names: dict[int, str]) -> None:
    """Refuses index-keyed optimizer state that cannot be this optimizer's.

    Keyed by index, a checkpoint of a model with other parameters (one removed, added or
    reordered) would otherwise load each state onto whichever parameter now has its index:
    torch keeps entries past the last parameter as loose keys, and DCP stops only a
    mismatch of shapes it compares. So every saved index must name one of the optimizer's
    parameters, and every state tensor must fit that parameter's shape: each of its sizes
    equal to the parameter's at the same position, or 1, over no more dimensions (a
    per-element state, a row-wise one such as Row-wise Adagrad's `[rows]` sum, a factored
    one such as Adafactor's `[rows, 1]` / `[1, cols]`). Scalars (`step`) are not checked.
    """
    params = [p for g in opt.param_groups for p in g["params"]]
    for k, st in sorted(state.items()):
        if not 0 <= k < len(params):
            raise ValueError(
                f"the checkpoint holds optimizer {i}'s state for parameter index {k}, but optimizer {i} has "
                f"{len(params)} parameters: it was written for a model with other parameters (optimizer "
                "state of a model with torchrec-sharded tables is keyed by index)")
        p = params[k]
        for key, t in (st.items() if isinstance(st, dict) else ()):
            if isinstance(t, torch.Tensor) and t.dim() > 0 and not (
                    t.dim() <= p.dim() and all(a in (b, 1) for a, b in zip(t.shape, p.shape))):
                raise ValueError(
                    f"the checkpoint's optimizer {i} state {key!r} for parameter index {k} has shape "
                    f"{tuple(t.shape)}, which does not fit that parameter ({names.get(id(p), '?')}) of shape {tuple(p.shape)}: "
                    "it was written for a model with other parameters (optimizer state of a model with "
                    "torchrec-sharded tables is keyed by index)")


def _holds(name: str, sharded: set[str]) -> bool:
    """Whether the module at `name` ("" = the root) is, or contains, a torchrec-sharded module."""
    if not name:
        return bool(sharded)
    return any(s == name or s.startswith(name + ".") for s in sharded)


def _module_state(mod: nn.Module, name: str, sharded: set[str], out: dict[str, Any]) -> dict[str, Any]:
    prefix = name + "." if name else ""
    if name in sharded or not _holds(name, sharded):
        # a torchrec-sharded module answers for itself; a subtree without one as usual
        out.update({prefix + k: v for k, v in mod.state_dict().items()})
        return out
    for pname, p in mod.named_parameters(recurse=False):
        out[prefix + pname] = p.detach()
    for bname, b in mod.named_buffers(recurse=False):
        if bname not in mod._non_persistent_buffers_set:
            out[prefix + bname] = b
    for cname, child in mod.named_children():
        _module_state(child, prefix + cname, sharded, out)
    return out


def _load_module_state(mod: nn.Module, name: str, sharded: set[str], sd: dict[str, Any]) -> None:
    prefix = name + "." if name else ""
    if name in sharded or not _holds(name, sharded):
        mod.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
        return
    with torch.no_grad():
        for pname, p in mod.named_parameters(recurse=False):
            p.copy_(sd[prefix + pname])
        for bname, b in mod.named_buffers(recurse=False):
            if bname not in mod._non_persistent_buffers_set:
                b.copy_(sd[prefix + bname])
    for cname, child in mod.named_children():
        _load_module_state(child, prefix + cname, sharded, sd)
