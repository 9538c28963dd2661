"""Each planted bug of :mod:`selfcheck_fsdp2.frozen_start` (an FSDP2 unit frozen at the
model's first forward, unfrozen later, under a mixed precision) fails the frozen-start check
of ``suites/test_training_session.py`` on PREC-2, saying what the unit reduces in."""

from __future__ import annotations

import pytest
from selfcheck_ckpt.run_suites import assert_clause_fails

#: factory -> words the PREC-2 failure must say
PLANTED = {
    "keeps_frozen_start_dtypes": ("frozen at the model's first forward", "first backward raised"),
    "reduces_unfrozen_unit_in_float32": ("reduces its gradients in torch.float32",),
}


@pytest.mark.parametrize("factory", sorted(PLANTED))
def test_frozen_start_bug_fails_prec_2(factory: str) -> None:
    assert_clause_fails(
        f"selfcheck_fsdp2.frozen_start:{factory}",
        "PREC-2",
        suites=["suites/test_training_session.py"],
        extra=["-k", "frozen_at_first_forward"],
        words=PLANTED[factory],
    )
