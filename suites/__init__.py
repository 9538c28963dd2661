"""The conformance suites: one ``test_*.py`` module per contract section, their helpers in
``suites/lib/`` (see its docstring for which side each helper runs on)."""

import pytest

# The rank jobs keep pytest's assertion rewriting, as they had inside the test modules: a
# failed ``assert`` on a rank shows its values (harness/wire/fnref.py sends a rewritten module's
# path, and the ranks import it rewritten).
pytest.register_assert_rewrite("suites.lib.ranks")
