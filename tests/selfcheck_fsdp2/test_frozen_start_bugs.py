"""Each planted bug of :mod:`selfcheck_fsdp2.frozen_start` (an FSDP2 unit frozen at the
model's first forward, unfrozen later, under a mixed precision) fails the frozen-start check
of ``suites/test_training_session.py`` on PREC-2, saying what the unit reduces in."""

from __future__ import annotations

import re

import pytest
from selfcheck_ckpt.run_suites import run_suites

#: factory -> words the PREC-2 failure must say
PLANTED = {
    "keeps_frozen_start_dtypes": ("frozen at the model's first forward", "first backward raised"),
    "reduces_unfrozen_unit_in_float32": ("reduces its gradients in torch.float32",),
}


@pytest.mark.parametrize("factory", sorted(PLANTED))
def test_frozen_start_bug_fails_prec_2(factory: str) -> None:
    args = [
        "--strategy",
        f"selfcheck_fsdp2.frozen_start:{factory}",
        "--clauses",
        "PREC-2",
        "-k",
        "frozen_at_first_forward",
        "-x",
        "--nproc",
        "4",
        "--hypothesis-profile=selfcheck",
        "-q",
    ]
    result = run_suites(args, timeout=170, suites=["suites/test_training_session.py"])
    output = result.stdout + result.stderr
    tail = output[-4000:]
    assert result.returncode == 1, (
        f"{factory}: the check did not fail (rc={result.returncode})\n{tail}"
    )
    line = re.search(r"^\s+PREC-2\s+(\S+)\s+(\S+): (.*)$", output, re.MULTILINE)
    assert line is not None, f"{factory}: no summary line for PREC-2\n{tail}"
    assert line.group(1) == "failed", f"{factory}: PREC-2 is {line.group(1)}, not failed\n{tail}"
    failure = re.search(r"AssertionError: PREC-2: .*", output)
    assert failure is not None, f"{factory}: no assertion naming PREC-2\n{tail}"
    first = re.search(r"first failure after [^)]*", output)
    print(f"{factory}: PREC-2 failed ({first.group(0) if first else 'no timing'})")
    for word in words_of(factory):
        assert word in failure.group(0), f"{factory}: the failure does not say {word!r}\n{tail}"


def words_of(factory: str) -> tuple[str, ...]:
    return PLANTED[factory]
