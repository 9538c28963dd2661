"""Issue 13, part 4: the suites catch a zoo of real bugs, each on its own clause.

Every strategy of ``selfcheck_zoo.broken`` carries one bug reported upstream (FSDP, DCP,
Lightning, FairScale, torchtitan): checkpoint bugs, run against the checkpoint suites, and
bugs that need the transformer-shaped zoo, run against ``suites/test_training.py``. Each
inner run selects only the checks of the clause the bug breaks (``--clauses``), stops at the
first failure (``-x``) and does not shrink (Hypothesis profile ``selfcheck``). It must fail,
the conformance report must record the clause as ``failed``, and a failed check of
that clause must say what went wrong (the key words below). The reference strategy must
pass the same selection.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from selfcheck_ckpt.run_suites import SUITES, run_suites

#: factory in selfcheck_zoo.broken -> (the clause it breaks, what its failure must say)
ZOO: dict[str, tuple[str, str]] = {
    # the round trip reads the saved checkpoint before loading it: it holds the
    # non-persistent buffer of Scale
    "saves_non_persistent_buffers": ("CKPT-BUF-1", r"non-persistent buffers.*scale\.offset"),
    # loading the trainer file at data-parallel 2: the rank with the empty shard of
    # scale.gate (1 element) finds no torch.chunk piece
    "chunks_optimizer_state_to_empty_shards": ("CKPT-TRAINER-1", r"IndexError"),
    # ids shifted past the frozen parameters: a trainable parameter ends without state
    "rekeys_without_frozen_parameters": ("CKPT-REKEY-1", r"is not in the optimizer state"),
    # the sharded checkpoint lacks the tied head's name: judged as written (the list of
    # optimizers' check, when its job fails), or met by the strict load of the round trip
    "saves_tied_weight_once": (
        "CKPT-RT-2",
        r"(as written lacks model\['|Missing key.*)head\.weight",
    ),
    # judged as written, before the plain model's strict load_state_dict meets the key
    "saves_wrapper_prefixed_keys": ("CKPT-REKEY-2", r"_forward_module\..*a wrapper.s name"),
    # the root's own gain is trained on each rank's batch alone
    "leaves_root_parameters_out_of_units": ("TRAIN-1", r"parameter/buffer 'gain'"),
    # the shared Block's second call adds no gradient
    "loses_repeated_call_gradients": ("TRAIN-1", r"parameter/buffer 'shared\."),
    # the rotary tables keep what to_empty left there
    "no_reset_for_buffer_only_modules": (
        "INIT-1",
        r"non-persistent buffer 'blocks\.\d\.attn\.rotary\.(cos|sin)'",
    ),
}
#: the suite files of the clauses that are not checkpoint clauses
MODEL_SUITES = {"TRAIN-1": ["suites/test_training.py"], "INIT-1": ["suites/test_training.py"]}

RUN_TIMEOUT_S = 170


def _run(
    strategy: str, clauses: list[str], tmp: Path, *, first_failure: bool
) -> tuple[Any, str, dict]:
    """Run the suites of ``clauses`` against ``strategy`` on them; return the process, its
    output and the conformance report."""
    suites = sorted({f for c in clauses for f in MODEL_SUITES.get(c, SUITES)})
    args = [
        "--strategy", strategy,
        "--clauses", ",".join(clauses),
        *(["-x"] if first_failure else []),
        "--nproc", "4",
        "--hypothesis-profile=selfcheck",
        "--conformance-report", str(tmp / "report"),
        "-q",
    ]  # fmt: skip
    env = {"HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / "hypothesis")}
    result = run_suites(args, timeout=RUN_TIMEOUT_S, env=env, suites=suites)
    output = result.stdout + result.stderr
    report_file = tmp / "report" / "report.json"
    assert report_file.is_file(), f"{strategy}: no report.json\n{output[-4000:]}"
    return result, output, json.loads(report_file.read_text())


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("factory", sorted(ZOO))
def test_zoo_bug_is_caught_on_its_clause(factory: str, tmp_path: Path) -> None:
    clause, words = ZOO[factory]
    result, output, report = _run(
        f"selfcheck_zoo.broken:{factory}", [clause], tmp_path, first_failure=True
    )
    tail = output[-4000:]
    assert result.returncode == 1, (
        f"{factory}: the suites did not fail (rc={result.returncode})\n{tail}"
    )
    recorded = report["clauses"].get(clause)
    assert recorded == "failed", f"{factory}: report.json records {clause} as {recorded!r}\n{tail}"
    failed = [c for c in report["checks"] if clause in c["clauses"] and c["outcome"] == "failed"]
    texts = [c["failure"] or "" for c in failed]
    assert any(re.search(words, text, re.DOTALL) for text in texts), (
        f"{factory}: no failed {clause} check says {words!r}; failures: {texts}\n{tail}"
    )


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_reference_passes_the_zoo_clauses(tmp_path: Path) -> None:
    clauses = sorted({clause for clause, _ in ZOO.values()})
    result, output, report = _run(
        "reference_impl:make_strategy", clauses, tmp_path, first_failure=False
    )
    tail = output[-4000:]
    assert result.returncode == 0, f"the reference fails {clauses} (rc={result.returncode})\n{tail}"
    for clause in clauses:
        assert report["clauses"].get(clause) == "passed", (
            f"report.json records {clause} as {report['clauses'].get(clause)!r} for the "
            f"reference\n{tail}"
        )
