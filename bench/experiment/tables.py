"""The old name of :mod:`.print_tables`, kept while tests/test_runner.py imports it."""

from syncbench.analysis.repeats import format_spread as fmt_spread

from .print_tables import comparison_table, hetero_table

__all__ = ["comparison_table", "fmt_spread", "hetero_table"]
