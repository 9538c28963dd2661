"""Bugs planted in the independent strategies, each of a kind real strategy code has.

Each factory here builds one of the independent strategies with one bug, as a small
subclass: ``--strategy independent.planted:<name>``. :data:`BUGS` says, for each, the
clause whose method breaks and what the tests in ``test_planted_bugs.py`` expect.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from harness import StrategySpec, Unsupported
from independent import fsdp1_team, fsdp2_team, plumbing

__all__ = ["BUGS"]


# --- FSDP2 (model_parallel) -------------------------------------------------------------


class _LocalShardOptimizer(fsdp2_team.FSDP2TeamStrategy):
    """A wrong value in a save: the full file holds this rank's optimizer shard, not the
    gathered state (``get_optimizer_state_dict`` without ``full_state_dict``)."""

    def _optim_state(self, module: nn.Module, optimizer: Optimizer, full: bool) -> Any:
        if not full:
            return super()._optim_state(module, optimizer, full)
        osd = get_optimizer_state_dict(module, optimizer)
        state = {
            fqn: {k: v.to_local().cpu() if isinstance(v, DTensor) else v for k, v in s.items()}
            for fqn, s in osd["state"].items()
        }
        return {"state": state, "param_groups": osd["param_groups"]}


class _LocalShardsInSharded(fsdp2_team.FSDP2TeamStrategy):
    """A wrong value in a sharded save: the team hands DCP each rank's local shards as plain
    tensors (``to_local()``, "plain tensors are simpler to save"). DCP takes a plain tensor
    for one every rank holds alike and writes it once, from rank 0: the directory holds rank
    0's shard of each sharded parameter under the whole parameter's name."""

    def _gather(
        self, key: str, module: nn.Module, optimizers: dict[str, Any], full: bool
    ) -> dict[str, Any]:
        content = super()._gather(key, module, optimizers, full)
        if not full:
            content[key] = {
                name: value.to_local() if isinstance(value, DTensor) else value
                for name, value in content[key].items()
            }
        return content


class _StateBeforeFirstStep(fsdp2_team.FSDP2TeamStrategy):
    """A save before the first optimizer step writes optimizer state the plain optimizer
    does not have: torch's ``get_optimizer_state_dict`` initializes the state of an
    optimizer that never stepped (a step at learning rate 0), and the team keeps it (the
    team's own ``_optim_state`` drops it). Met by every check that saves before a step: the
    moments' round trip, the resume machine's first save, a drawn plan of 0 steps."""

    def _optim_state(self, module: nn.Module, optimizer: Optimizer, full: bool) -> Any:
        options = fsdp2_team._FULL if full else StateDictOptions()
        return get_optimizer_state_dict(module, optimizer, options=options)


class _BareAssertInLoad(fsdp2_team.FSDP2TeamStrategy):
    """torch-style bare ``AssertionError`` inside ``load_checkpoint``: the team assumed a
    sharded checkpoint always loads at the world size it was saved at."""

    def _save_sharded(self, path: str, key: str, module: nn.Module, *args: Any) -> None:
        optimizers, rest = args
        rest = {**rest, "saved_world_size": dist.get_world_size()}
        super()._save_sharded(path, key, module, optimizers, rest)

    def _read_sharded(self, path: str, *args: Any) -> dict[str, Any]:
        saved = super()._read_sharded(path, *args)
        _check_world(saved.pop("saved_world_size", None))
        return saved


def _check_world(saved: Any) -> None:
    assert saved == dist.get_world_size()


class _LeftoverScratch(fsdp2_team.FSDP2TeamStrategy):
    """Leftover files with random names: a failed sharded save leaves its scratch
    directory (``ckpt.tmp-<hex>``) beside the path."""

    def _save_sharded(self, path: str, key: str, module: nn.Module, *args: Any) -> None:
        optimizers, rest = args
        content = self._gather(key, module, optimizers, full=False)
        scratch = plumbing.scratch_path(path)
        error: BaseException | None = None
        try:
            import torch.distributed.checkpoint as dcp

            dcp.save(content, checkpoint_id=scratch)
            if dist.get_rank() == 0:
                torch.save(plumbing.plain_metadata(rest), os.path.join(scratch, "meta.pt"))
        except BaseException as exc:
            error = exc
        plumbing.agree(error, f"saving {path!r}")  # raises, and the scratch stays
        if dist.get_rank() == 0:
            plumbing.place_atomically(scratch, path)
        dist.barrier()


class _LoadLeavesPlainState(fsdp2_team.FSDP2TeamStrategy):
    """A later call fails on state a broken load left: a full load writes the saved
    (whole, plain) tensors into the optimizer's state instead of this rank's shards, so the
    next ``optimizer_step`` mixes tensors and DTensors."""

    def _load_optimizers(self, module: nn.Module, name: str, value: Any, saved: Any) -> None:
        values = [v for s in saved.get("state", {}).values() for v in s.values()]
        sharded = any(isinstance(v, DTensor) for v in values)
        if not isinstance(value, Optimizer) or not values or sharded:
            return super()._load_optimizers(module, name, value, saved)
        params = dict(module.named_parameters())
        for fqn, values in saved["state"].items():
            if isinstance(fqn, str) and fqn in params:
                value.state[params[fqn]] = dict(values)
        return None


class _UnsupportedFromMethod(fsdp2_team.FSDP2TeamStrategy):
    """An ``Unsupported`` raised from a method, not the factory: ``strict=False`` loads are
    refused when asked for, on every rank alike."""

    def load_checkpoint(self, path: str, state: Any = None, strict: bool = True) -> dict[str, Any]:
        if not strict:
            raise Unsupported("non-strict loads are not implemented", "strict", False)
        return super().load_checkpoint(path, state, strict)


# --- FSDP1 (fsdp) ------------------------------------------------------------------------


class _ReturnsBeforeWritten(fsdp1_team.FSDP1TeamStrategy):
    """A save that returns on one rank before another finished: rank 0 writes the full
    file in a background thread and nobody waits for it."""

    def save_checkpoint(self, path: str, state: dict[str, Any], *args: Any, **kw: Any) -> None:
        if not self.full:
            return super().save_checkpoint(path, state, *args, **kw)
        path = self.broadcast(os.fspath(path))
        key, optimizers, rest = plumbing.split_state(state, self._is_mine)
        if key is None:
            raise ValueError("could not find the set-up module in state; pass it as a value.")
        content = self._full_content(key, state[key], optimizers)
        content.update(plumbing.plain_metadata(rest))
        if dist.get_rank() == 0:
            threading.Thread(target=_write_later, args=(content, path), daemon=True).start()
        return None


def _write_later(content: dict[str, Any], path: str) -> None:
    time.sleep(1.0)
    torch.save(content, path)


class _BarrierOnRankZero(fsdp1_team.FSDP1TeamStrategy):
    """A collective on one rank only: rank 0 waits at a barrier before reading a full
    checkpoint's model state; the other ranks go on into the next collective."""

    def _load_full_model(self, module: nn.Module, saved: dict[str, Any], strict: bool) -> None:
        if dist.get_rank() == 0:
            dist.barrier()
        super()._load_full_model(module, saved, strict)


class _RefusesOnRankZero(fsdp1_team.FSDP1TeamStrategy):
    """A refusal on one rank only: rank 0 refuses to replace a file with a sharded
    directory, the other ranks go on into DCP's collectives."""

    def save_checkpoint(self, path: str, state: dict[str, Any], *args: Any, **kw: Any) -> None:
        if not self.full and dist.get_rank() == 0 and os.path.isfile(path):
            raise FileExistsError(f"{path!r} is a file; refusing to replace it with a directory")
        return super().save_checkpoint(path, state, *args, **kw)


class _ShapeErrorInSave(fsdp1_team.FSDP1TeamStrategy):
    """A shape error inside ``save_checkpoint``: the team stacks every gathered parameter
    into one checksum, which works only when they have one shape."""

    def _full_content(self, key: str, module: nn.Module, optimizers: Any) -> dict[str, Any]:
        content = super()._full_content(key, module, optimizers)
        content["checksum"] = torch.stack(list(content[key].values())).sum()
        return content


# --- factories ---------------------------------------------------------------------------


def _factory(build: Callable[[StrategySpec], Any], cls: type) -> Callable[[StrategySpec], Any]:
    def make(spec: StrategySpec) -> Any:
        strategy = build(spec)  # the team's factory: its refusals and validation
        strategy.__class__ = cls
        return strategy

    return make


local_shard_optimizer = _factory(fsdp2_team.make_strategy, _LocalShardOptimizer)
local_shards_in_sharded = _factory(fsdp2_team.make_strategy, _LocalShardsInSharded)
state_before_first_step = _factory(fsdp2_team.make_strategy, _StateBeforeFirstStep)
bare_assert_in_load = _factory(fsdp2_team.make_strategy, _BareAssertInLoad)
leftover_scratch = _factory(fsdp2_team.make_strategy, _LeftoverScratch)
load_leaves_plain_state = _factory(fsdp2_team.make_strategy, _LoadLeavesPlainState)
unsupported_from_method = _factory(fsdp2_team.make_strategy, _UnsupportedFromMethod)
returns_before_written = _factory(fsdp1_team.make_strategy, _ReturnsBeforeWritten)
barrier_on_rank_zero = _factory(fsdp1_team.make_strategy, _BarrierOnRankZero)
refuses_on_rank_zero = _factory(fsdp1_team.make_strategy, _RefusesOnRankZero)
shape_error_in_save = _factory(fsdp1_team.make_strategy, _ShapeErrorInSave)

#: factory name -> (the clauses to run, the clause whose method breaks); a bug that two
#: clauses' checks meet is filed under the first check's, and which one fails first depends
#: on the examples drawn: "CKPT-RT-5|CKPT-RT-1" accepts either
BUGS: dict[str, tuple[str, str]] = {
    "local_shard_optimizer": ("CKPT-RT-1", "CKPT-RT-1"),
    "local_shards_in_sharded": ("CKPT-RT-2", "CKPT-RT-2"),
    "bare_assert_in_load": ("CKPT-RT-3", "CKPT-RT-3"),
    "leftover_scratch": ("CKPT-SAVE-6", "CKPT-SAVE-6"),
    "load_leaves_plain_state": ("CKPT-RT-1,CKPT-RT-5", "CKPT-RT-5|CKPT-RT-1"),
    "unsupported_from_method": ("CKPT-STRICT-2", "CKPT-STRICT-2"),
    "returns_before_written": ("CKPT-RT-1", "CKPT-RT-1"),
    "barrier_on_rank_zero": ("CKPT-RT-1", "CKPT-RT-1"),
    "refuses_on_rank_zero": ("CKPT-SAVE-3", "CKPT-SAVE-3"),
    "shape_error_in_save": ("CKPT-RT-1", "CKPT-RT-1"),
}
