"""The run's configuration coverage: pairs of axis values, supported and covered."""

from __future__ import annotations

from harness.conformance.outcomes.checks import Check
from harness.conformance.output.coverage import (
    MISSING_SHOWN,
    by_clause,
    coverage_of,
    in_scope,
    pairs_of,
)
from harness.report import Report, render_markdown
from harness.report.markdown import clause_coverage_line, coverage_line


def _check(outcome: str, *entries: dict[str, tuple[str, ...]]) -> Check:
    check = Check(f"c{outcome}{len(entries)}", "n", ["TRAIN-1"])
    check.outcome = outcome
    check.exercised = list(entries)
    return check


def test_pairs_are_every_value_of_one_axis_with_every_value_of_another() -> None:
    entry = {"family": ("fsdp",), "model": ("Block", "tied embedding"), "world_size": ("2",)}
    assert pairs_of(entry) == {
        ("family", "fsdp", "model", "Block"),
        ("family", "fsdp", "model", "tied embedding"),
        ("family", "fsdp", "world_size", "2"),
        ("model", "Block", "world_size", "2"),
        ("model", "tied embedding", "world_size", "2"),
    }


def test_a_pair_counts_as_covered_only_through_a_passing_check() -> None:
    passed = _check("passed", {"family": ("fsdp",), "precision": ("32-true",)})
    failed = _check("failed", {"family": ("fsdp",), "precision": ("bf16-mixed",)})
    both = coverage_of([passed, failed])
    assert both["pairs_covered"] == 1 and both["pairs_supported"] == 2
    assert both["values"] == {"family": ["fsdp"], "precision": ["32-true", "bf16-mixed"]}
    (row,) = both["by_axes"]
    assert row == {
        "axes": ["family", "precision"],
        "covered": 1,
        "supported": 2,
        "missing": [["fsdp", "bf16-mixed"]],
    }
    assert coverage_of([_check("passed")]) == {}  # no job reported its axes


def test_the_report_shows_the_figure_and_the_table_and_reads_it_back() -> None:
    entries: list[dict[str, tuple[str, ...]]] = [
        {"family": ("fsdp",), "world_size": (str(n),)} for n in range(12)
    ]
    coverage = coverage_of([_check("passed", entries[0]), _check("failed", *entries[1:])])
    report = Report("1", {}, {}, [], coverage=coverage)
    markdown = render_markdown(report)
    line = coverage_line(coverage)
    assert line.startswith("pairs of configuration values covered: 1 of 12 supported")
    assert "## Configuration coverage" in markdown and line in markdown
    missing = ", ".join(f"fsdp x {n}" for n in range(1, 1 + MISSING_SHOWN))
    assert f"| family x world_size | 1 | 12 | {missing} (+3 more) |" in markdown
    assert Report.from_dict(report.to_dict()).coverage == coverage


def test_a_declared_space_counts_its_pairs_and_lists_those_never_reached() -> None:
    reached = {"family": ("fsdp",), "precision": ("32-true",)}
    universe = {
        ("family", "fsdp", "precision", "32-true"),
        ("family", "fsdp", "precision", "16-true"),
        ("family", "model_parallel", "precision", "32-true"),
    }
    coverage = coverage_of([_check("passed", reached)], universe)
    assert coverage["pairs_declared"] == 3 and coverage["never_reached_count"] == 2
    assert coverage["never_reached"] == [
        ["family", "fsdp", "precision", "16-true"],
        ["family", "model_parallel", "precision", "32-true"],
    ]
    line = coverage_line(coverage)
    assert line.endswith("3 pairs in the suites' configuration space, 2 never reached")
    markdown = render_markdown(Report("1", {}, {}, [], coverage=coverage))
    assert "no job reached: family=fsdp x precision=16-true" in markdown


def test_per_clause_coverage_names_values_covered_reached_and_never_drawn() -> None:
    passed = _check("passed", {"family": ("fsdp",), "precision": ("32-true",)})
    failed = _check("failed", {"family": ("fsdp",), "precision": ("bf16-mixed",)})
    failed.clauses = ["CLIP-1"]
    universe = {("family", "fsdp", "precision", p) for p in ("32-true", "bf16-mixed", "16-true")}
    table = by_clause([passed, failed], universe)
    assert table["TRAIN-1"]["precision"] == {
        "covered": ["32-true"],
        "reached": ["32-true"],
        "never": ["16-true", "bf16-mixed"],
    }
    assert table["CLIP-1"]["precision"] == {
        "covered": [],
        "reached": ["bf16-mixed"],
        "never": ["16-true", "32-true"],
    }
    coverage = coverage_of([passed, failed], universe)
    assert clause_coverage_line(coverage) == (
        "(clause, axis value) pairs covered: 2 of 4 reached (2 clauses)"
    )
    markdown = render_markdown(Report("1", {}, {}, [], coverage=coverage))
    assert (
        "| CLIP-1 | 0 of 2 | family: fsdp; precision: bf16-mixed | precision: 16-true, 32-true |"
        in (markdown)
    )
    assert Report.from_dict(Report("1", {}, {}, [], coverage=coverage).to_dict()).coverage == (
        coverage
    )


def test_a_clause_scope_keeps_values_it_does_not_speak_of_out_of_never_reached() -> None:
    universe = {
        ("family", f, "precision", p)
        for f in ("fsdp", "model_parallel")
        for p in ("32-true", "bf16-mixed", "16-true")
    } | {("family", "model_parallel", "sharding", "tp"), ("family", "fsdp", "sharding", "NO_SHARD")}
    assert in_scope(universe, {"precision": ("bf16-mixed",)})["precision"] == {"bf16-mixed"}
    fsdp_only = in_scope(
        universe | {("precision", "16-true", "sharding", "tp")}, {"family": ("fsdp",)}
    )
    assert fsdp_only["sharding"] == {"NO_SHARD"}  # tp is never beside family fsdp
    mixed = _check("passed", {"family": ("fsdp",), "precision": ("bf16-mixed",)})
    mixed.clauses = ["PREC-2"]  # scope: bf16-mixed and 16-mixed
    mp = _check("passed", {"family": ("model_parallel",), "sharding": ("tp",)})
    mp.clauses = ["MP-4"]  # scope: the model_parallel family
    table = by_clause([mixed, mp], universe)
    assert table["PREC-2"]["precision"]["never"] == []  # 32-true and 16-true are out of scope
    assert table["PREC-2"]["family"]["never"] == ["model_parallel"]
    assert table["MP-4"]["sharding"]["never"] == []  # NO_SHARD is fsdp's
    assert table["MP-4"]["family"]["never"] == []


def test_arguments_are_listed_per_clause_but_left_out_of_the_pairs() -> None:
    entry = {"family": ("fsdp",), "precision": ("32-true",), "norm_type": ("inf", "2")}
    assert pairs_of(entry) == {("family", "fsdp", "precision", "32-true")}
    clip = _check("passed", entry)
    clip.clauses = ["CLIP-1"]  # scope: norm_type 2, 1, inf, 1.5; error_if_nonfinite
    universe = {("family", f, "precision", "32-true") for f in ("fsdp", "model_parallel")}
    coverage = coverage_of([clip], universe)
    assert coverage["pairs_supported"] == 1
    assert coverage["values"]["norm_type"] == ["2", "inf"]
    table = coverage["by_clause"]["CLIP-1"]
    assert table["norm_type"] == {
        "covered": ["2", "inf"],
        "reached": ["2", "inf"],
        "never": ["1", "1.5"],
    }
    # the scope's arguments restrict no configuration value: model_parallel is still in it
    assert table["family"]["never"] == ["model_parallel"]
    # a clause whose scope does not name an argument lists none of its values as never passed
    train = _check("passed", entry)
    assert by_clause([train], universe)["TRAIN-1"]["norm_type"]["never"] == []
    # the values inside a scope's argument are the scope's, with or without a declared space
    assert in_scope(set(), {"strict": ("False",)}) == {"strict": {"False"}}
    assert in_scope(universe, {"family": ("fsdp",), "strict": ("True",)}) == {
        "family": {"fsdp"},
        "precision": {"32-true"},
        "strict": {"True"},
    }


def test_a_run_whose_jobs_report_only_arguments_has_a_coverage_table() -> None:
    refusal = _check("passed", {"storage_options": ("None", "given")})
    refusal.clauses = ["CKPT-SAVE-1"]
    coverage = coverage_of([refusal])
    assert coverage["pairs_supported"] == 0
    assert coverage["values"] == {"storage_options": ["None", "given"]}
    assert coverage["by_clause"]["CKPT-SAVE-1"]["storage_options"]["never"] == []


def test_the_contracts_words_are_listed_per_clause_like_arguments() -> None:
    # a policy of classes met only instances of the listed class: WRAP-1 speaks of the other
    # two words too ("each instance of those classes"), TRAIN-1 of none of them
    entry = {"family": ("fsdp",), "wrap": ("classes",), "wrap classes": ("listed class",)}
    assert pairs_of(entry) == {("family", "fsdp", "wrap", "classes")}
    wrap = _check("passed", entry)
    wrap.clauses = ["WRAP-1"]
    universe = {("family", "fsdp", "wrap", "classes"), ("family", "fsdp2", "wrap", "classes")}
    coverage = coverage_of([wrap, _check("passed", entry)], universe)
    assert coverage["pairs_supported"] == 1
    assert coverage["by_clause"]["WRAP-1"]["wrap classes"] == {
        "covered": ["listed class"],
        "reached": ["listed class"],
        "never": ["same-named class from another module", "subclass of a listed class"],
    }
    assert coverage["by_clause"]["WRAP-1"]["family"]["never"] == []  # fsdp2 is FSDP2-1's
    assert coverage["by_clause"]["TRAIN-1"]["wrap classes"]["never"] == []
