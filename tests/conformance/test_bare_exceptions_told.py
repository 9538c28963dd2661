"""A bare exception text (a ``KeyError``'s key, torch's five-word "Expected device to be
set") becomes a sentence in the finding's headline: in which suite job, what the check was
doing, the type and the text, and the strategy's line; the signature keeps the text alone,
so grouping does not change."""

from __future__ import annotations

from pathlib import Path

from harness.conformance.findings.signatures import attribute
from harness.verdicts.outcomes import Outcome, RankFailure, RemoteError

ROOT = Path(__file__).resolve().parents[2]
JOBS = f"{ROOT}/suites/lib/ranks/checkpoint_interop_jobs.py"
TORCH = "/venv/lib/python3.11/site-packages/torch"
MINE = "/src/team/team.py"


def _failure(type_name: str, message: str, *frames: tuple[str, int, str]) -> RankFailure:
    lines = ["Traceback (most recent call last):"]
    lines.append(f'  File "{JOBS}", line 90, in trainer_load_rank')
    lines += [f'  File "{file}", line {line}, in {func}' for file, line, func in frames]
    error = RemoteError(type_name, message, "\n".join(lines) + "\n")
    return RankFailure("job 3: rank 0 raised", [Outcome(0, "raised", error=error)])


def test_a_keyerror_in_a_load_says_what_was_loading_and_where() -> None:
    failure = _failure(
        "KeyError",
        "'param_groups'",
        (MINE, 402, "load_checkpoint"),
        (MINE, 575, "_load_optimizers"),
    )
    attribution = attribute(failure)
    assert attribution.message == (
        "in trainer_load_rank, loading a checkpoint (load_checkpoint) raised KeyError "
        f"'param_groups' at {MINE}:575 _load_optimizers"
    )
    assert attribution.key == "'param_groups'"  # the signature is the text's, as before


def test_torchs_short_text_is_cited_at_the_strategys_line() -> None:
    failure = _failure(
        "RuntimeError",
        "Expected device to be set",
        (MINE, 310, "optimizer_step"),
        (f"{TORCH}/optim/adam.py", 220, "step"),
    )
    attribution = attribute(failure)
    assert attribution.message == (
        "in trainer_load_rank, an optimizer step (optimizer_step) raised RuntimeError: "
        f"Expected device to be set at {MINE}:310 optimizer_step"
    )


def test_a_message_that_says_what_happened_is_left_as_it_is() -> None:
    said = "Attempting to broadcast a dimension of length 3 at -2! Mismatching argument"
    attribution = attribute(_failure("RuntimeError", said, (MINE, 402, "load_checkpoint")))
    assert attribution.message == said
