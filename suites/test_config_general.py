"""CONTRACT.md CFG-7..CFG-10, for every family (CFG-8 and CFG-9: model_parallel's options).

The precision (both families), the model_parallel mesh sizes and ``parallelize_fn``, and the
rule that an option is honoured or refused with an error naming it, never ignored. See
``test_config.py`` for how errors are checked (CFG-1..CFG-6 are there).
"""

from __future__ import annotations

import string
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness import run_on_ranks
from suites.lib.controller.dispatch import run
from suites.lib.controller.scenarios import job_world, world_sizes
from suites.lib.ranks.config_jobs import (
    EVERY_FAMILY,
    PRECISIONS,
    honour_rank,
    mp_sizes_rank,
    parallelize_fn_rank,
    precision_rank,
)

NEAR_MISS_PRECISION = ("32", "16", "bf16", "fp16-mixed", "64-true", "16-mixed ", "mixed", "")


class NotAPrecision:
    """An object that is no precision."""

    def __repr__(self) -> str:
        return "NotAPrecision()"


# --- CFG-7 ------------------------------------------------------------------------------

BAD_PRECISION = st.one_of(
    st.sampled_from(NEAR_MISS_PRECISION),
    st.text(string.ascii_letters + string.digits + "-", max_size=12).filter(
        lambda s: s not in PRECISIONS
    ),
    st.sampled_from((16, 32, 16.0, torch.float16, torch.bfloat16, ["32-true"], NotAPrecision())),
)


@pytest.mark.clause("CFG-7")
@given(bad=st.lists(BAD_PRECISION, min_size=1, max_size=6))
@example(bad=[*NEAR_MISS_PRECISION, 16, torch.float16, NotAPrecision()])
def test_precision_is_one_of_five(bad: list[Any]) -> None:
    jobs = run(precision_rank, bad, world_size=job_world(), families=EVERY_FAMILY)
    for rank, seen in enumerate(jobs):
        for key, plugin_methods in seen.items():
            assert plugin_methods == [True, True], (
                f"rank {rank}: {key}: the precision plugin lacks forward_context/convert_input"
            )


# --- CFG-8 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-8")
@given(
    world=world_sizes(),
    sizes=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 8)), min_size=1, max_size=4),
)
@example(world=2, sizes=[(2, 1), (1, 2), (2, 2), (1, 1)])
def test_model_parallel_sizes(world: int, sizes: list[tuple[int, int]]) -> None:
    names = ("data_parallel", "tensor_parallel")
    jobs = run(mp_sizes_rank, sizes, world_size=world, families=("model_parallel",))
    for rank, seen in enumerate(jobs):
        auto, rest = seen[0], seen[1:]
        per_node = auto[3]
        nodes = world // per_node
        assert auto[:2] == ((nodes, per_node), names), (
            f"rank {rank}: data_parallel_size/tensor_parallel_size 'auto' on {nodes} node(s) of "
            f"{per_node} process(es) built a mesh {auto[:3]}; expected shape ({nodes}, "
            f"{per_node}) (nodes x processes per node), {names}"
        )
        for (dp, tp), got in zip(sizes, rest, strict=True):
            expected = ((dp, tp), names, auto[2]) if dp * tp == world else "refused"
            assert got == expected, f"rank {rank}: sizes {(dp, tp)} at world {world}: {got}"


# --- CFG-9 ------------------------------------------------------------------------------


@pytest.mark.clause("CFG-9")
def test_parallelize_fn_must_return_a_module_and_fsdp1_is_refused() -> None:
    for rank, messages in enumerate(run_on_ranks(parallelize_fn_rank, world_size=job_world())):
        assert len(messages) == 5, f"rank {rank}: {messages}"


# --- CFG-10 -----------------------------------------------------------------------------


@pytest.mark.clause("CFG-10")
def test_options_are_honoured_or_refused_never_ignored() -> None:
    for rank, seen in enumerate(run_on_ranks(honour_rank, world_size=job_world())):
        for key, (kind, message) in seen.items():
            option = key.split(" ", 1)[1]
            if option == "precision" and kind == "ok":
                continue  # the strategy applied bf16 itself: honoured
            assert kind != "ok" and option in message and kind != "AssertionError", (
                f"rank {rank}: {key}: a strategy that cannot honour an option must say so "
                f"with an error naming it; got {kind}: {message or 'no error (ignored)'}"
            )
