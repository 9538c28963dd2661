"""Results, errors and strategy agreement through real multi-rank jobs."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch
import torch.distributed as dist

from harness import RankContext, RankFailure, StrategySpec, Unsupported, api, run_on_ranks
from harness.rank.context import StrategyAgreementError


def rank_info(ctx: RankContext, scale: int) -> dict:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "sum": t.item() * scale,
        "pid": os.getpid(),
        "dist_rank": dist.get_rank(),
    }


def test_results_come_back_per_rank() -> None:
    results = run_on_ranks(rank_info, 10, world_size=4)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    for r in results:
        assert r["world_size"] == 4
        assert r["dist_rank"] == r["rank"]
        assert r["device"] == "cpu"
        assert r["backend"] == "gloo"
        assert r["sum"] == 60.0
    assert len({r["pid"] for r in results}) == 4


def test_pool_is_reused_between_jobs() -> None:
    first = [r["pid"] for r in run_on_ranks(rank_info, 1, world_size=2)]
    second = [r["pid"] for r in run_on_ranks(rank_info, 1, world_size=2)]
    assert first == second


def write_and_list(ctx: RankContext) -> list[str]:
    with open(os.path.join(ctx.tmp_dir, f"rank{ctx.rank}"), "w") as f:
        f.write("x")
    dist.barrier()
    return [ctx.tmp_dir, *sorted(os.listdir(ctx.tmp_dir))]


def test_tmp_dir_is_shared_and_fresh_per_job() -> None:
    first = run_on_ranks(write_and_list, world_size=2)
    second = run_on_ranks(write_and_list, world_size=2)
    for results in (first, second):
        assert results[0] == results[1]
        assert results[0][1:] == ["rank0", "rank1"]
    assert first[0][0] != second[0][0]
    assert not os.path.exists(first[0][0])


def raise_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        raise KeyError("only rank one fails")
    return ctx.rank


def test_exception_on_one_rank_reports_its_traceback() -> None:
    with pytest.raises(RankFailure, match=r"rank 1 raised KeyError") as info:
        run_on_ranks(raise_on_rank_one, world_size=2)
    ok, failed = info.value.outcomes
    assert ok.kind == "ok" and ok.value == 0
    assert failed.kind == "raised"
    assert failed.error is not None
    assert "raise_on_rank_one" in failed.error.traceback
    assert 'raise KeyError("only rank one fails")' in failed.error.traceback
    assert isinstance(failed.exception, KeyError)
    assert info.value.failed_ranks == [1]
    assert run_on_ranks(rank_info, 1, world_size=2)[1]["rank"] == 1


def failed_assert(ctx: RankContext) -> None:
    expected = {"a": 1, "b": 2}
    got = {"a": 1, "b": 2 + ctx.rank}
    assert got == expected


def test_failed_assert_on_a_rank_shows_the_values() -> None:
    with pytest.raises(RankFailure) as info:
        run_on_ranks(failed_assert, world_size=2)
    message = str(info.value)
    assert "rank 1 raised AssertionError" in message
    assert "{'a': 1, 'b': 3} == {'a': 1, 'b': 2}" in message
    assert info.value.outcomes[0].ok


def base_exception_on_rank_zero(ctx: RankContext) -> None:
    if ctx.rank == 0:
        raise BaseException("not an Exception")


def test_base_exception_is_caught_on_the_rank() -> None:
    with pytest.raises(RankFailure, match=r"rank 0 raised BaseException: not an Exception"):
        run_on_ranks(base_exception_on_rank_zero, world_size=2)


def return_a_lock(ctx: RankContext) -> object:
    return threading.Lock() if ctx.rank == 1 else "fine"


def test_unpicklable_return_value_gives_a_clear_error() -> None:
    with pytest.raises(RankFailure, match=r"return value of rank 1 is not picklable") as info:
        run_on_ranks(return_a_lock, world_size=2)
    assert info.value.outcomes[0].value == "fine"
    assert info.value.outcomes[1].error.type_name == "TypeError"  # type: ignore[union-attr]


def print_things(ctx: RankContext) -> None:
    import sys
    import warnings

    print(f"stdout of rank {ctx.rank}")
    print(f"stderr of rank {ctx.rank}", file=sys.stderr)
    os.write(1, f"fd-level write from rank {ctx.rank}\n".encode())
    warnings.warn(f"careful on rank {ctx.rank}", UserWarning, stacklevel=1)


def test_output_and_warnings_are_captured_per_rank() -> None:
    seen = []
    previous = api.set_output_sink(seen.extend)
    try:
        run_on_ranks(print_things, world_size=2)
    finally:
        api.set_output_sink(previous)
    assert [o.rank for o in seen] == [0, 1]
    for o in seen:
        assert f"stdout of rank {o.rank}" in o.stdout
        assert f"fd-level write from rank {o.rank}" in o.stdout
        assert o.stderr.strip() == f"stderr of rank {o.rank}"
        assert f"UserWarning: careful on rank {o.rank}" in o.warnings


# --- make_strategy ------------------------------------------------------------------------


def echo_factory(spec: StrategySpec) -> tuple:
    return ("strategy", spec.family, spec.rank, spec.world_size, spec.precision, dict(spec.extra))


def refusing_factory(spec: StrategySpec) -> None:
    raise Unsupported("no hybrid here", option="sharding_strategy", value=spec.sharding_strategy)


def refuse_on_rank_one(spec: StrategySpec) -> tuple:
    if spec.rank == 1:
        raise Unsupported("rank 1 cannot", option="precision", value=spec.precision)
    return echo_factory(spec)


def broken_on_rank_zero(spec: StrategySpec) -> tuple:
    if spec.rank == 0:
        raise RuntimeError("factory bug")
    return echo_factory(spec)


def build(ctx: RankContext, factory: str, options: dict) -> object:
    ctx = dataclasses.replace(
        ctx, factory=f"{__name__}:{factory}", strategy_options={"from_cli": 1}
    )
    strategy = ctx.make_strategy("fsdp", **options)
    dist.barrier()  # every rank got past make_strategy: no one is left waiting
    return strategy


def test_make_strategy_builds_the_spec_on_every_rank() -> None:
    results = run_on_ranks(
        build, "echo_factory", {"precision": "bf16-mixed", "extra": {"x": 2}}, world_size=2
    )
    assert results == [
        ("strategy", "fsdp", 0, 2, "bf16-mixed", {"from_cli": 1, "x": 2}),
        ("strategy", "fsdp", 1, 2, "bf16-mixed", {"from_cli": 1, "x": 2}),
    ]


def test_unsupported_on_every_rank_is_raised_in_the_controller() -> None:
    with pytest.raises(Unsupported, match=r"sharding_strategy=HYBRID_SHARD \(no hybrid here\)"):
        run_on_ranks(build, "refusing_factory", {"sharding_strategy": "HYBRID_SHARD"}, world_size=2)


def test_unsupported_on_one_rank_is_raised_on_every_rank() -> None:
    with pytest.raises(Unsupported, match=r"precision=16-true \(rank 1 cannot\)"):
        run_on_ranks(build, "refuse_on_rank_one", {"precision": "16-true"}, world_size=4)


def test_factory_error_on_one_rank_stops_every_rank() -> None:
    with pytest.raises(RankFailure, match=r"rank 0 raised RuntimeError: factory bug") as info:
        run_on_ranks(build, "broken_on_rank_zero", {}, world_size=2)
    other = info.value.outcomes[1]
    assert other.kind == "raised"
    assert isinstance(other.exception, StrategyAgreementError)
    assert "raised on rank 0" in str(other.exception)


def test_make_strategy_rejects_unknown_options() -> None:
    with pytest.raises(
        RankFailure,
        match=r"TypeError: make_strategy got unknown option\(s\) "
        r"shard_degree",
    ):
        run_on_ranks(build, "echo_factory", {"shard_degree": 2}, world_size=2)
