"""The load into a never-stepped optimizer whose parameters hold gradients (CKPT-RT-1/2, the
round trip at every moment): each planted bug of :mod:`selfcheck_ckpt.pending_grads` fails
the moments' check on its clause, with a message saying what the load got wrong."""

from __future__ import annotations

import re

import pytest

from selfcheck_ckpt.run_suites import run_suites

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
    args = [
        "--strategy",
        f"selfcheck_ckpt.pending_grads:{factory}",
        "--clauses",
        clause,
        "-x",
        "--nproc",
        "4",
        "--hypothesis-profile=selfcheck",
        "-q",
    ]
    result = run_suites(args, timeout=170, suites=[test])
    output = result.stdout + result.stderr
    tail = output[-4000:]
    assert result.returncode == 1, (
        f"{factory}: the check did not fail (rc={result.returncode})\n{tail}"
    )
    line = re.search(rf"^\s+{re.escape(clause)}\s+(\S+)\s+(\S+): (.*)$", output, re.MULTILINE)
    assert line is not None, f"{factory}: no summary line for {clause}\n{tail}"
    assert line.group(1) == "failed", f"{factory}: {clause} is {line.group(1)}, not failed\n{tail}"
    failure = re.search(rf"AssertionError: {re.escape(clause)}: .*", output)
    assert failure is not None, f"{factory}: no assertion naming {clause}\n{tail}"
    first = re.search(r"first failure after [^)]*", output)
    print(f"{factory}: {clause} failed ({first.group(0) if first else 'no timing'})")
    for word in words:
        assert word in failure.group(0), f"{factory}: the failure does not say {word!r}\n{tail}"
