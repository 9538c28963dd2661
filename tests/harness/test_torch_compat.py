"""The supported torch range, and each private torch internal read through
:mod:`harness.torch_compat` on the installed torch (the torch matrix runs this file with
each version)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness import RankContext, run_on_ranks, torch_compat


@pytest.mark.parametrize(
    ("version", "parsed"),
    [("2.11.0+cu130", (2, 11)), ("2.14.1", (2, 14)), ("2.15.0a0+git1234", (2, 15))],
)
def test_torch_version_reads_major_and_minor(version: str, parsed: tuple[int, int]) -> None:
    assert torch_compat.torch_version(version) == parsed


def test_an_old_torch_is_refused_in_one_line() -> None:
    with pytest.raises(torch_compat.TorchVersionError) as info:
        torch_compat.check_torch_version("2.10.0+cpu")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("shardcheck needs torch 2.11 or newer (tested 2.11 to 2.14), ")
    assert "but torch 2.10.0+cpu is installed" in message
    assert "pip install 'torch>=2.11'" in message


@pytest.mark.parametrize("version", ["2.11.0", "2.14.1", "2.15.0", "3.0.0"])
def test_supported_and_newer_torches_are_accepted(version: str) -> None:
    torch_compat.check_torch_version(version)


def test_an_unreadable_version_is_refused() -> None:
    with pytest.raises(torch_compat.TorchVersionError, match=r"cannot read a torch version"):
        torch_compat.torch_version("nightly")


def test_the_installed_torch_is_supported() -> None:
    torch_compat.check_torch_version()


def _fsdp2_internals(ctx: RankContext) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    fully_shard(model[0], mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model(torch.ones(2, 4)).sum().backward()
    model[0].set_requires_gradient_sync(False, recurse=False)
    groups = torch_compat.fsdp2_param_groups(model[0])
    return {
        "groups": len(groups),
        "sync": [(g.reduce_grads, g.all_reduce_grads) for g in groups],
        "param_dtype": str(torch_compat.fsdp2_mp_policy(model).param_dtype),
    }


def test_fsdp2_internals() -> None:
    for rank, seen in enumerate(run_on_ranks(_fsdp2_internals, world_size=2)):
        assert seen == {
            "groups": 1,
            "sync": [(False, False)],
            "param_dtype": "torch.bfloat16",
        }, f"rank {rank}"


def _fsdp1_internals(ctx: RankContext) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(nn.Linear(4, 3), use_orig_params=True, device_id=ctx.device)
    handle = torch_compat.fsdp1_handle(model)
    with model.no_sync():
        in_no_sync = torch_compat.fsdp1_sync_gradients(model)
    model(torch.ones(2, 4)).sum().backward()
    local, unsharded, params, count = torch_compat.fsdp1_flat_param_sizes(model) or (0, 0, 0, 0)
    return {
        "orig": torch_compat.fsdp1_uses_orig_params(handle),
        "low": torch_compat.fsdp1_uses_low_precision(handle),
        "shared": torch_compat.fsdp1_shared_params(handle),
        "sync": (in_no_sync, torch_compat.fsdp1_sync_gradients(model)),
        "root": torch_compat.fsdp1_is_root(model),
        "sizes": (local, unsharded, params, count),
    }


def test_fsdp1_internals() -> None:
    for rank, seen in enumerate(run_on_ranks(_fsdp1_internals, world_size=2)):
        assert seen == {
            "orig": True,
            "low": False,
            "shared": [],
            "sync": (False, True),
            "root": True,
            "sizes": (8, 16, 15, 2),  # 15 elements in a flat parameter of 16, half a rank
        }, f"rank {rank}"


def _c10d_internals(ctx: RankContext) -> dict[str, Any]:
    before = torch_compat.process_groups()
    group = dist.new_group([0, 1])
    created = torch_compat.created_process_groups(before)
    state = torch_compat.group_registry_state()
    torch_compat.set_default_pg_timeout(30.0)
    backends = list(torch_compat.default_group_backends())
    dist.destroy_process_group(group)
    torch_compat.clear_mesh_stack()
    torch_compat.clear_sharding_cache()
    debug = torch_compat.c10d_debug()
    return {
        "created": created == [group],
        "counted": state["group_count"] >= 1 and len(state["groups"]) >= 2,
        "after": torch_compat.created_process_groups(before),
        "backends": len(backends) >= 1,
        "debug": debug.get_debug_level() in list(debug.DebugLevel.__members__.values()),
        "helper": callable(torch_compat.new_process_group_helper()),
        "logger": torch_compat.c10d_logger().name,
    }


def test_c10d_internals() -> None:
    for rank, seen in enumerate(run_on_ranks(_c10d_internals, world_size=2)):
        assert seen == {
            "created": True,
            "counted": True,
            "after": [],
            "backends": True,
            "debug": True,
            "helper": True,
            "logger": "c10d-NullHandler-default",
        }, f"rank {rank}"


def test_checkpoint_wrapper_and_wrap_policy() -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    wrapped = torch_compat.checkpoint_wrapper(
        nn.Linear(2, 2), checkpoint_impl=torch_compat.CheckpointImpl.NO_REENTRANT
    )
    assert isinstance(wrapped, torch_compat.CheckpointWrapper)
    assert isinstance(ModuleWrapPolicy({nn.Linear}), torch_compat.WrapPolicyBase)
