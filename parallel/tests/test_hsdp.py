"""HSDP (FSDP2 on a 2 x 2 replicate x shard mesh, 4 gloo processes) equals one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard

from _dense_workers import Net, STEPS, reference, run_all
from _dist import run_world

SEED = 7


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    ckpt = tmp_path_factory.mktemp("hsdp") / "ckpt"
    return run_world(run_all, 4, SEED, str(ckpt)), ckpt


def test_hsdp_2x2_matches_single_process(world: tuple[list[dict[str, Any]], Path]) -> None:
    want, _ = reference(SEED)
    assert abs(want[-1] - want[0]) > 1e-4  # it trains, so equality means something
    for r in world[0]:
        got = torch.tensor(r["fp32"]["losses"])
        assert len(got) == STEPS
        torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=0)


def test_hsdp_parameters_are_replicate_shard_dtensors(
        world: tuple[list[dict[str, Any]], Path]) -> None:
    n = len(list(Net(SEED).parameters()))
    for r in world[0]:
        res = r["fp32"]
        assert len(res["placements"]) == res["n_params"] == n
        for name, (kind, placements, shape) in res["placements"].items():
            assert kind == "DTensor" and shape == (2, 2), name
            assert placements == (Replicate(), Shard(0)), (name, placements)


def test_hsdp_state_dict_saves_with_dcp_and_reloads(
        world: tuple[list[dict[str, Any]], Path]) -> None:
    _, want_sd = reference(SEED)
    for r in world[0]:
        assert r["fp32"]["sd_types"] == ["DTensor"] and r["fp32"]["reload_equal"]
    # the DCP checkpoint of the 4-rank model loads into one unsharded process
    import torch.distributed.checkpoint as dcp

    sd = {k: torch.zeros_like(v) for k, v in want_sd.items()}
    dcp.load(sd, checkpoint_id=str(world[1]))
    for k, v in want_sd.items():
        torch.testing.assert_close(sd[k], v, rtol=1e-4, atol=1e-6)


def test_hsdp_with_activation_checkpointing_and_compile_matches(
        world: tuple[list[dict[str, Any]], Path]) -> None:
    want, _ = reference(SEED)
    for r in world[0]:
        torch.testing.assert_close(torch.tensor(r["ac_compile"]["losses"]), torch.tensor(want),
                                   rtol=1e-5, atol=0)


def test_hsdp_bf16_mixed_precision_trains_close(world: tuple[list[dict[str, Any]], Path]) -> None:
    want, _ = reference(SEED)
    got = torch.tensor(world[0][0]["bf16"]["losses"])
    assert not torch.equal(got, torch.tensor(want))  # bf16 compute really happened
    # within bf16 resolution of the fp32 run
    torch.testing.assert_close(got, torch.tensor(want), rtol=5e-2, atol=1e-2)
    for r in world[0]:
        assert torch.equal(got, torch.tensor(r["bf16"]["losses"]))


@pytest.mark.parametrize("comms", ["copy_engine", "auto"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hsdp_through_gem_comms_is_bitwise_equal(world: tuple[list[dict[str, Any]], Path],
                                                 comms: str, precision: str) -> None:
    # FSDP's parameter all-gathers go through gem_comms (set_custom_all_gather): the same
    # bytes arrive, so losses and final parameters equal the run without hooks, bit for bit.
    for r in world[0]:
        base, hooked = r[precision], r[f"{comms}_{precision}"]
        assert base["comms_calls"] == 0
        # 4 units (3 blocks + root) x (forward + backward re-gather of blocks) per step
        assert hooked["comms_calls"] >= STEPS * 4, hooked["comms_calls"]
        assert hooked["losses"] == base["losses"]
        for a, b in zip(hooked["params"], base["params"]):
            assert torch.equal(a, b)


def test_apply_hsdp_rejects_bad_arguments() -> None:
    from gem_parallel import apply_hsdp

    class _Mesh3:
        ndim = 3

    with pytest.raises(ValueError, match="mesh.ndim=3"):
        apply_hsdp(nn.Linear(2, 2), _Mesh3())  # type: ignore[arg-type]

    class _Mesh2:
        ndim = 2

    with pytest.raises(ValueError, match="comms='ucx' must be one of"):
        apply_hsdp(nn.Linear(2, 2), _Mesh2(), comms="ucx")  # type: ignore[arg-type]
