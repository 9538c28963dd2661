"""Each planted FSDP2 bug (``selfcheck_fsdp2/broken.py``) fails its own fsdp2 clause.

Each inner run selects the checks of that clause only (``--clauses``), stops at the first
failure (``-x``) and does not shrink (Hypothesis profile ``selfcheck``); it must fail, and
the conformance summary must list the clause as ``failed``.
"""

from __future__ import annotations

import pytest
from selfcheck_ckpt.run_suites import assert_clause_fails

#: factory in selfcheck_fsdp2.broken -> the clause it breaks
PLANTED = {
    "leaves_a_unit_unwrapped": "FSDP2-1",
    "ignores_reshard_after_forward": "FSDP2-2",
    "hsdp_replicas_never_all_reduce": "FSDP2-3",
    "reduces_in_float32": "FSDP2-4",
}
#: planted bugs of other clauses, each in its own suite: factory -> (clause, suite)
OTHER = {
    "writes_running_var_low": ("PREC-4", "suites/test_precision.py"),
    "rewraps_the_users_units": ("WRAP-2", "suites/test_sharding.py"),
    "ignores_the_mesh_tuple": ("CFG-3", "suites/test_config.py"),
    "ignores_module_wrap_policy": ("CFG-4", "suites/test_config.py"),
}


@pytest.mark.parametrize("factory", sorted(PLANTED) + sorted(OTHER))
def test_planted_fsdp2_bug_fails_its_clause(factory: str) -> None:
    clause, suite = OTHER.get(factory, (PLANTED.get(factory, ""), "suites/test_fsdp2.py"))
    assert_clause_fails(f"selfcheck_fsdp2.broken:{factory}", clause, suites=[suite])
