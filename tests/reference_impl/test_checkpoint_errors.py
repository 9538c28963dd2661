"""Every error condition of SPEC section 5, strict/non-strict loading, and file safety.

Each rank function runs many checks in one job (jobs are the expensive part) and returns
a list of the checks it passed, so the controller asserts that every rank ran every check.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from harness import run_on_ranks
from reference_impl.checkpoint import (
    is_sharded_checkpoint,
    is_sharded_module,
    load_checkpoint,
    save_checkpoint,
)

FULL = StateDictOptions(full_state_dict=True)


class Opaque:
    """Not loadable with weights_only=True."""


class Counter:
    """Metadata saved through state_dict()/load_state_dict()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.n = sd["n"]


class Small(nn.Module):
    def __init__(self, seed: int, extra: bool = False, shift: bool = True) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)
        if shift:
            self.register_buffer("shift", torch.rand(3))
        if extra:
            self.register_buffer("extra", torch.full((2,), 7.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def sharded(seed: int = 0, family: str = "fsdp2", **kwargs: Any) -> nn.Module:
    model = Small(seed, **kwargs)
    if family == "fsdp1":
        return FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    fully_shard(model)
    return model


def two_groups(model: nn.Module) -> torch.optim.Optimizer:
    named = list(model.named_parameters())
    return torch.optim.SGD(
        [
            {"params": [p for n, p in named if ".a." in f".{n}"], "lr": 0.1},
            {"params": [p for n, p in named if ".a." not in f".{n}"], "lr": 0.2},
        ],
        momentum=0.9,
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def on_rank0(fn: Any) -> None:
    if dist.get_rank() == 0:
        fn()
    dist.barrier()


def expect(exc: type[BaseException], match: str, fn: Any, root: Path) -> None:
    """``fn`` raises ``exc`` matching ``match`` and leaves every file under ``root`` as it was."""
    dist.barrier()
    before = snapshot(root)
    with pytest.raises(exc, match=match):
        fn()
    dist.barrier()
    after = snapshot(root)
    dist.barrier()  # no rank writes before every rank has looked
    assert after == before, "files changed after an error"


def rank_save_errors(ctx: Any) -> list[str]:
    root, done = Path(ctx.tmp_dir), []
    model = sharded()
    assert is_sharded_module(model) and not is_sharded_module(Small(0))
    path = root / "ckpt.pt"
    expect(
        ValueError,
        "Could not find a sharded model",
        lambda: save_checkpoint(path, {"model": Small(0)}, full=True),
        root,
    )
    expect(
        ValueError,
        "multiple sharded models.*'m1', 'm2'",
        lambda: save_checkpoint(path, {"m1": model, "m2": sharded(1)}, full=True),
        root,
    )
    expect(
        NotImplementedError,
        "only supported for full",
        lambda: save_checkpoint(
            root / "d", {"model": model}, full=False, filter={"model": lambda k, v: True}
        ),
        root,
    )
    expect(
        ValueError,
        "filter names the key 'nope'",
        lambda: save_checkpoint(
            path, {"model": model}, full=True, filter={"nope": lambda k, v: True}
        ),
        root,
    )
    expect(
        TypeError,
        r"filter\['model'\] must be a callable",
        lambda: save_checkpoint(path, {"model": model}, full=True, filter={"model": 3}),
        root,
    )
    done.append("arguments")
    # CKPT-SAVE-3: a directory that is not a checkpoint is left untouched
    plain_dir = root / "notes"
    on_rank0(lambda: (plain_dir.mkdir(), (plain_dir / "keep.txt").write_text("mine")))
    expect(
        IsADirectoryError,
        "not a checkpoint",
        lambda: save_checkpoint(plain_dir, {"model": model}, full=True),
        root,
    )
    # full over a sharded checkpoint, sharded over a file: replaced
    save_checkpoint(root / "swap", {"model": model, "step": 1}, full=False)
    assert is_sharded_checkpoint(root / "swap")
    save_checkpoint(root / "swap", {"model": model, "step": 2}, full=True)
    assert (root / "swap").is_file()
    assert torch.load(root / "swap", weights_only=True)["step"] == 2
    save_checkpoint(root / "swap", {"model": model, "step": 3}, full=False)
    assert is_sharded_checkpoint(root / "swap")
    assert torch.load(root / "swap" / "meta.pt", weights_only=True) == {"step": 3}
    assert not [p.name for p in root.iterdir() if ".partial-" in p.name or ".old-" in p.name]
    done.append("replace")
    # CKPT-SAVE-2: rank 0's path wins
    save_checkpoint(root / f"rank{ctx.rank}.pt", {"model": model}, full=True)
    dist.barrier()
    assert (root / "rank0.pt").is_file() and not (root / "rank1.pt").exists()
    # CKPT-SAVE-5 and CKPT-SAVE-4: filters; stateful objects saved through state_dict()
    state = {"model": model, "meta": {"x": 1, "y": 2}, "counter": Counter(5)}
    filters = {"model": lambda k, v: k.startswith("a."), "meta": lambda k, v: k == "x"}
    save_checkpoint(path, state, full=True, filter=filters)
    content = torch.load(path, weights_only=True)
    assert sorted(content["model"]) == ["a.bias", "a.weight"]
    assert content["meta"] == {"x": 1} and content["counter"] == {"n": 5}
    done.append("filter")
    return done


def test_save_errors_and_replacement() -> None:
    """CKPT-SAVE-1..5."""
    assert run_on_ranks(rank_save_errors, world_size=2) == [["arguments", "replace", "filter"]] * 2


def rank_load_errors(ctx: Any, family: str) -> list[str]:
    root, done = Path(ctx.tmp_dir), []
    model = sharded(family=family)
    opt = two_groups(model)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    full, shard = root / "full.pt", root / "sharded"
    state = {"model": model, "optimizer": opt, "counter": Counter(4), "epoch": 9, "tag": "x"}
    save_checkpoint(full, state, full=True)
    save_checkpoint(shard, state, full=False)
    # CKPT-LOAD-1: the state and the path
    expect(ValueError, "needs a state", lambda: load_checkpoint(full, {}, strict=True), root)
    expect(ValueError, "needs a state", lambda: load_checkpoint(full, None, strict=True), root)
    expect(
        NotImplementedError, "bare optimizer", lambda: load_checkpoint(full, opt, strict=True), root
    )
    expect(
        ValueError,
        "bare module .*directory",
        lambda: load_checkpoint(shard, sharded(1, family), strict=True),
        root,
    )
    for bad in (root / "missing.pt", root):
        expect(
            ValueError,
            f"{bad}.* neither a checkpoint file nor",
            lambda b=bad: load_checkpoint(b, {"model": sharded(1, family)}, strict=True),
            root,
        )
    on_rank0(lambda: torch.save(Small(5).state_dict(), root / "bare.pt"))
    bare = sharded(1, family)
    assert load_checkpoint(root / "bare.pt", bare, strict=True) == {}
    for key, value in get_model_state_dict(bare, options=FULL).items():
        assert torch.equal(value, Small(5).state_dict()[key]), key
    done.append("arguments")
    # DCP's CheckpointException (a BaseException) reaches the caller as RuntimeError
    broken = root / "broken"
    save_checkpoint(broken, {"model": model}, full=False)
    on_rank0(lambda: [p.write_bytes(b"garbage") for p in broken.glob("*.distcp")])
    expect(
        RuntimeError,
        "torch.distributed.checkpoint failed to load",
        lambda: load_checkpoint(broken, {"model": sharded(1, family)}, strict=True),
        root,
    )
    # CKPT-SEC-1: no arbitrary unpickling, full file or meta.pt
    on_rank0(lambda: torch.save({"model": {}, "evil": Opaque()}, root / "evil.pt"))
    expect(
        pickle.UnpicklingError,
        "arbitrary unpickling",
        lambda: load_checkpoint(root / "evil.pt", {"model": sharded(1, family)}, strict=False),
        root,
    )
    save_checkpoint(root / "evil", {"model": model}, full=False)
    on_rank0(lambda: torch.save({"evil": Opaque()}, root / "evil" / "meta.pt"))
    expect(
        pickle.UnpicklingError,
        "arbitrary unpickling",
        lambda: load_checkpoint(root / "evil", {"model": sharded(1, family)}, strict=False),
        root,
    )
    done.append("unsafe")
    for path in (full, shard):
        done += check_strictness(path, family, root)
    return done


def check_strictness(path: Path, family: str, root: Path) -> list[str]:
    """CKPT-STRICT-1/2, CKPT-LOAD-2 and group mismatches against one checkpoint."""
    expected = torch.load(root / "full.pt", weights_only=True)
    extra = sharded(1, family, extra=True)
    expect(
        KeyError,
        "Missing key.*'extra'",
        lambda: load_checkpoint(path, {"model": extra}, strict=True),
        root,
    )
    rest = load_checkpoint(path, {"model": extra}, strict=False)
    assert {k: v for k, v in rest.items() if k != "optimizer"} == {
        "counter": {"n": 4},
        "epoch": 9,
        "tag": "x",
    }
    assert ("optimizer" in rest) == path.is_file()  # a full file returns all unrequested keys
    loaded = get_model_state_dict(extra, options=FULL)
    assert torch.equal(loaded["extra"], torch.full((2,), 7.0))
    assert all(torch.equal(loaded[k], v) for k, v in expected["model"].items())
    lacking = sharded(1, family, shift=False)
    expect(
        KeyError,
        "Unexpected key.*'shift'",
        lambda: load_checkpoint(path, {"model": lacking}, strict=True),
        root,
    )
    load_checkpoint(path, {"model": lacking}, strict=False)
    # metadata: requested restored in place, objects through load_state_dict, rest returned
    state = {"model": sharded(1, family), "counter": Counter(0), "epoch": 0, "absent": 5}
    expect(KeyError, "'absent'", lambda: load_checkpoint(path, state, strict=True), root)
    rest = load_checkpoint(path, state, strict=False)
    assert state["counter"].n == 4 and state["epoch"] == 9 and state["absent"] == 5
    assert rest["tag"] == "x" and "epoch" not in rest and "counter" not in rest
    # optimizer groups must match even when not strict (CKPT-STRICT-2)
    m = sharded(1, family)
    one_group = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    expect(
        ValueError,
        r"2 parameter group\(s\) but the optimizer has 1",
        lambda: load_checkpoint(path, {"model": m, "optimizer": one_group}, strict=False),
        root,
    )
    named = list(m.named_parameters())
    moved = torch.optim.SGD(
        [{"params": [p for _, p in named[:1]]}, {"params": [p for _, p in named[1:]]}], lr=0.1
    )
    expect(
        ValueError,
        "Parameter group 0 of optimizer 'optimizer'",
        lambda: load_checkpoint(path, {"model": m, "optimizer": moved}, strict=False),
        root,
    )
    return [f"strict:{path.name}"]


@pytest.mark.parametrize("family", ["fsdp1", "fsdp2"])
def test_load_errors_and_strictness(family: str) -> None:
    """CKPT-LOAD-1/2, CKPT-STRICT-1/2, CKPT-SEC-1, and files unchanged after each error."""
    expected = ["arguments", "unsafe", "strict:full.pt", "strict:sharded"]
    assert run_on_ranks(rank_load_errors, family, world_size=2) == [expected] * 2
