"""`Parallelized.train_state`: a parallelized model and its optimizers as one DCP Stateful.
Plain models go through torch's get_state_dict (FQN keys); a model holding torchrec-sharded
tables is saved module by module. Both round-trip exactly through DCP into a model built with
other values."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from gem_parallel import Parallelized


def _plain(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 12), nn.LayerNorm(12), nn.GELU(), nn.Linear(12, 3))
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)


def test_plain_model_round_trips_with_fqn_keys(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    net, opt = _plain(seed)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(5, 6)).square().mean().backward()
        opt.step()
    state = Parallelized(net).train_state([opt])
    assert state.sharded == [] and Parallelized(net).replica_sync() is None
    msd, osd = get_state_dict(net, [opt])
    sd = state.state_dict()
    assert sorted(sd["model"]) == sorted(msd) and sorted(sd["optim"]["state"]) == sorted(osd["state"])
    dcp.save({"app": state}, checkpoint_id=str(tmp_path))

    net2, opt2 = _plain(seed + 1)
    assert not torch.equal(net[0].weight, net2[0].weight)
    dcp.load({"app": Parallelized(net2).train_state([opt2])}, checkpoint_id=str(tmp_path))
    for (n, p), (_, q) in zip(net.named_parameters(), net2.named_parameters()):
        assert torch.equal(p, q), n
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[q][key]), (n, key)


def test_train_state_refuses_what_is_not_a_model_or_optimizer() -> None:
    net, opt = _plain(0)
    with pytest.raises(TypeError, match="model=dict must be an nn.Module"):
        Parallelized({}).train_state([opt])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"optimizers must be torch.optim.Optimizer instances; got \['str'\]"):
        Parallelized(net).train_state(["adam"])  # type: ignore[list-item]


def test_torchrec_sharded_tables_round_trip_module_by_module(tmp_path: Path) -> None:
    pytest.importorskip("torchrec")
    from _dist import run_world
    from _state_workers import run_sharded_round_trip

    res = run_world(run_sharded_round_trip, 2, random.randrange(1 << 20), str(tmp_path / "ck"))
    for r in res:
        assert r["sharded"] == ["sparse.ebc"], r["sharded"]
        # the tables under the sharded module's own keys, the rest under their usual ones
        assert "sparse.scale" in r["keys"] and "dense.weight" in r["keys"], r["keys"]
        assert {k for k in r["keys"] if k.startswith("sparse.ebc.")} == \
            {f"sparse.ebc.embedding_bags.{t}.weight" for t in ("t0", "t1", "t2")}, r["keys"]
        assert r["tables"] and all(r["tables"].values()), r["tables"]
        assert any(r["moved"].values()), r["moved"]  # (the load changed the tables this rank holds)
        assert r["dense"] and all(r["dense"].values()), r["dense"]
        assert r["momentum"] and all(r["momentum"]), r["momentum"]
        assert r["sync"]  # 1-D tables: no replica sync


class _WithTables(nn.Module):
    """A model whose `tables` child stands in for a torchrec-sharded module: the index-keyed
    path's logic does not depend on what that child is (torchrec itself: the test above)."""

    def __init__(self, seed: int, *, dense_bias: bool = True, mid: int = 12) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tables = nn.Embedding(10, 6)
        self.dense = nn.Sequential(nn.Linear(6, mid), nn.LayerNorm(mid), nn.Linear(mid, 3, bias=dense_bias))


def _index_keyed(net: nn.Module, steps: int) -> tuple[Any, torch.optim.Optimizer]:
    opt = torch.optim.AdamW(net.dense.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        net.dense(net.tables(torch.randint(0, 10, (5,)))).square().mean().backward()
        opt.step()
    state = Parallelized(net).train_state([opt])
    state.sharded = ["tables"]  # the module-by-module path, optimizer state keyed by index
    return state, opt


def test_index_keyed_state_round_trips_and_refuses_other_parameters() -> None:
    """The index-keyed optimizer state loads into the same model, and a checkpoint of a model
    with other parameters (DCP + gem_checkpoint deliver every saved entry) is refused before
    anything is loaded: a parameter fewer at the end (its index is past the last), or one of
    another shape (a width changed)."""
    seed = random.randrange(1 << 30)
    state, opt = _index_keyed(_WithTables(seed), 3)
    sd = state.state_dict()
    assert sorted(sd["optim"]["0"]["state"]) == ["0", "1", "2", "3", "4", "5"]

    twin = _WithTables(seed + 1)
    state2, opt2 = _index_keyed(twin, 0)
    state2.load_state_dict(sd)
    for p, q in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"], strict=True):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[q][key]), key

    # what fits a [12, 6] weight: row-wise [12] and factored [12, 1] / [1, 6] states; not [6]
    from gem_parallel._state import _check_index_state

    names = dict((id(p), n) for n, p in twin.named_parameters())
    for shape, fits in (((12,), True), ((12, 1), True), ((1, 6), True), ((6,), False), ((12, 6, 1), False)):
        bad = {0: {"sum": torch.zeros(shape), "step": torch.tensor(3.0)}}
        if fits:
            _check_index_state(0, opt2, bad, names)
        else:
            with pytest.raises(ValueError, match="does not fit that parameter"):
                _check_index_state(0, opt2, bad, names)

    for other, match in ((_WithTables(seed + 2, dense_bias=False), "parameter index 5, but optimizer 0 has 5"),
                         (_WithTables(seed + 3, mid=8), r"shape \(12, 6\), which does not fit that parameter \(dense.0.weight\) "
                                                        r"of shape \(8, 6\)")):
        state3, opt3 = _index_keyed(other, 0)
        before = {n: p.detach().clone() for n, p in other.named_parameters()}
        with pytest.raises(ValueError, match=match):
            state3.load_state_dict(sd)
        assert all(torch.equal(p, before[n]) for n, p in other.named_parameters())  # nothing loaded
        assert not opt3.state
