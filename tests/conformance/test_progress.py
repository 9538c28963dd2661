"""The lines a run writes as it goes: each new finding once, and progress once a minute."""

from __future__ import annotations

import pytest

from harness.conformance.output.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (45, "45 s"), (60, "1 min"), (130, "2 min 10 s"), (3900, "1 h 5 min")],
)
def test_durations_read_as_people_say_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_finding_is_announced_once_with_its_reproducer() -> None:
    lines: list[str] = []
    progress = Progress(lines.append)
    message = "CKPT-LOAD-1: CKPT-LOAD-1: optimizer state lost\nmore"
    progress.finding("F1", ["CKPT-LOAD-1"], message, "test_x.test_y[a]")
    progress.reproduce("pytest suites/test_x.py::test_y[a]")
    progress.finding("F1", ["CKPT-LOAD-1"], "optimizer state lost", "test_x.test_z")
    assert lines == [
        "shardcheck: F1 new finding, CKPT-LOAD-1: optimizer state lost",
        "  in test_x.test_y[a]",
        "  reproduce: pytest suites/test_x.py::test_y[a]",
    ]


def test_a_listed_failure_is_expected_not_new() -> None:
    """A green run whose only failures are listed prints no ``new finding`` line; the same
    finding met in a check the file does not list is news after all."""
    lines: list[str] = []
    progress = Progress(lines.append)
    assert not progress.finding("F1", ["CKPT-LOAD-1"], "state lost", "t.a", listed=True)
    assert not progress.finding("F1", ["CKPT-LOAD-1"], "state lost", "t.b", listed=True)
    assert lines == [
        "shardcheck: F1 expected finding, CKPT-LOAD-1: state lost "
        "(in t.a, listed in --expected-failures)"
    ]
    assert progress.finding("F1", ["CKPT-LOAD-1"], "state lost", "t.c")
    assert lines[1:] == ["shardcheck: F1 new finding, CKPT-LOAD-1: state lost", "  in t.c"]
    assert not any("new finding" in line for line in lines[:1])


def test_progress_once_a_minute_with_an_estimate() -> None:
    lines: list[str] = []
    clock = Clock()
    progress = Progress(lines.append, clock=clock)
    clock.now += 30
    progress.checks_done(10, 100)
    assert lines == []  # the first line waits a minute
    clock.now += 40  # 70 s: 20 checks done, 80 to go at 3.5 s each
    progress.checks_done(20, 100)
    clock.now += 10
    progress.checks_done(21, 100)  # not a minute since the last line
    assert lines == ["shardcheck: 20 of 100 checks, 1 min 10 s, about 4 min 40 s left"]


def test_nothing_is_written_without_a_terminal() -> None:
    progress = Progress(None)
    progress.finding("F1", ["API-1"], "m", "c")
    progress.checks_done(1, 2)
    assert progress.announced == set()


def test_the_count_is_of_test_items_so_duplicates_do_not_overrun_it(
    pytester: pytest.Pytester,
) -> None:
    """``--keep-duplicates`` runs one check (one node id) more than once: the line once read
    "2 of 1 checks" there; it counts the items pytest runs."""
    from harness.conformance import PLUGIN_NAME

    path = pytester.makepyfile(
        test_fake='import pytest\n\n@pytest.mark.clause("API-1")\ndef test_a():\n    pass\n'
    )
    seen: list[tuple[int, int]] = []

    class Spy:
        config: pytest.Config

        def pytest_configure(self, config: pytest.Config) -> None:
            self.config = config

        @pytest.hookimpl(trylast=True)
        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.when == "teardown":
                plugin = self.config.pluginmanager.get_plugin(PLUGIN_NAME)
                assert plugin is not None
                seen.append((plugin.items_done, plugin.items_total))

    result = pytester.inline_run(
        "-p", "no:cacheprovider", "--keep-duplicates", str(path), str(path), plugins=[Spy()]
    )
    result.assertoutcome(passed=2)
    assert seen == [(1, 2), (2, 2)]
