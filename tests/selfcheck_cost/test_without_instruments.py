"""Without torch's memory instrument the cost checks read ``environment`` and say which
instrument is missing; none reads passed."""

from __future__ import annotations

from selfcheck_ckpt.run_suites import run_suites


def test_cost_checks_read_environment_without_a_memory_tracker() -> None:
    result = run_suites(
        [
            "-p",
            "selfcheck_cost.no_tracker",
            "--nproc",
            "4",
            "--hypothesis-profile=ci",
            "-rs",
            "-k",
            "fsdp2-raf-true-32-true-w2",
        ],
        timeout=240,
        suites=["suites/test_cost.py"],
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert " passed" not in output.splitlines()[-1], output[-1500:]
    assert "no torch.distributed._tools.mem_tracker.MemTracker" in output, output[-3000:]
    assert "environment" in output
