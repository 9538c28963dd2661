"""The load into a never-stepped optimizer whose parameters hold gradients (CKPT-RT-1/2, the
round trip at every moment): each planted bug of :mod:`selfcheck_ckpt.pending_grads` fails
the moments' check on its clause, with a message saying what the load got wrong."""

from __future__ import annotations

import pytest

from selfcheck_ckpt.run_suites import assert_clause_fails

#: factory -> (clause, case of the moments' check, words the failure must say)
PLANTED = {
    "keeps_grads_at_load": (
        "CKPT-RT-2",
        "model_parallel-sharded",
        ("gradients held", "right after the load the optimizer holds no state"),
    ),
    "steps_with_held_grads": (
        "CKPT-RT-1",
        "fsdp-full",
        ("gradients held", "after the load"),
    ),
}


@pytest.mark.parametrize("factory", sorted(PLANTED))
def test_pending_grads_load_bug_is_caught(factory: str) -> None:
    clause, case, words = PLANTED[factory]
    test = f"suites/test_checkpoint_roundtrip.py::test_round_trip_at_every_moment[{case}]"
    strategy = f"selfcheck_ckpt.pending_grads:{factory}"
    assert_clause_fails(strategy, clause, suites=[test], words=words)
