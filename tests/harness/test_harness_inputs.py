"""Bad input gets a clear error in the controller, never a hang."""

from __future__ import annotations

import functools
import types

import pytest

from harness import RankContext, api, run_on_ranks
from harness.plugin import marker_sizes, refuse_xdist


def returns_rank(ctx: RankContext) -> int:
    return ctx.rank


def test_lambda_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not importable on the ranks .*define it at module"):
        run_on_ranks(lambda ctx: 1, world_size=2)


def test_nested_function_is_refused() -> None:
    def nested(ctx: RankContext) -> int:
        return 1

    with pytest.raises(ValueError, match=r"fn=<function .*nested.*not importable"):
        run_on_ranks(nested, world_size=2)


def test_non_callable_is_refused() -> None:
    with pytest.raises(TypeError, match=r"fn=3\): fn must be a module-level function"):
        run_on_ranks(3, world_size=2)  # type: ignore[arg-type]


def test_function_not_reachable_by_its_name_is_refused() -> None:
    wrapped = functools.partial(returns_rank)
    with pytest.raises(ValueError, match=r"not importable on the ranks"):
        run_on_ranks(wrapped, world_size=2)
    impostor = types.FunctionType(returns_rank.__code__, {}, "returns_rank")
    impostor.__module__ = __name__
    with pytest.raises(ValueError, match=r"does not name this function"):
        run_on_ranks(impostor, world_size=2)


def test_world_size_larger_than_nproc_is_an_environment_skip() -> None:
    too_big = api.max_world_size() + 1
    with pytest.raises(pytest.skip.Exception) as skipped:
        run_on_ranks(returns_rank, world_size=too_big)
    assert str(skipped.value.msg).startswith(
        f"environment: needs world size {too_big} but --nproc is {too_big - 1}; "
        f"run with --nproc {too_big} or more"
    )


@pytest.mark.parametrize("bad", [0, -2])
def test_world_size_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"world_size={bad}\): must be at least 1"):
        run_on_ranks(returns_rank, world_size=bad)


def test_world_size_must_be_an_int() -> None:
    with pytest.raises(TypeError, match=r"world_size='2'\): expected an int"):
        run_on_ranks(returns_rank, world_size="2")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 0, -0.5])
def test_non_positive_timeout_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=rf"timeout={bad}\): must be a positive number"):
        run_on_ranks(returns_rank, world_size=1, timeout=bad)


def test_unpicklable_argument_is_refused() -> None:
    with pytest.raises(TypeError, match=r"arguments cannot be pickled"):
        run_on_ranks(returns_rank, lambda: 1, world_size=1)


def test_nccl_without_gpus_is_refused() -> None:
    if api._gpu_count() >= 2:
        pytest.skip("this machine has GPUs")
    with pytest.raises(ValueError, match=r"--backend nccl needs one GPU per rank"):
        api.resolve_backend("nccl", 2)
    with pytest.raises(ValueError, match=r"--backend nccl needs one GPU per rank"):
        api.configure(backend="nccl")
    assert api.current_config().backend != "nccl"


def test_bad_configuration_values_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--nproc=0 must be at least 1"):
        api.configure(nproc=0)
    with pytest.raises(ValueError, match=r"--rank-timeout=-3 must be a positive"):
        api.configure(rank_timeout=-3)
    with pytest.raises(ValueError, match=r"--backend='mpi' is not one of auto, gloo, nccl"):
        api.configure(backend="mpi")


def test_auto_backend_on_cpu_is_gloo() -> None:
    if api._gpu_count() >= 2:
        pytest.skip("this machine has GPUs")
    assert api.resolve_backend("auto", 4) == "gloo"


def test_xdist_is_refused_clearly() -> None:
    config = types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=4))
    with pytest.raises(pytest.UsageError, match=r"cannot run under pytest-xdist \(-n 4\)"):
        refuse_xdist(config)
    worker = types.SimpleNamespace(option=types.SimpleNamespace(), workerinput={})
    with pytest.raises(pytest.UsageError, match=r"pytest-xdist"):
        refuse_xdist(worker)
    refuse_xdist(types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=None)))


@pytest.mark.parametrize("args", [(), (0,), ("2",), (True,)])
def test_world_size_marker_arguments_are_checked(args: tuple) -> None:
    with pytest.raises(ValueError, match=r"give one or more positive ints"):
        marker_sizes(pytest.mark.world_size(*args).mark)
