"""Validation rows for the ``--validate-pool`` tests (tests/unit and tests/e2e)."""

from __future__ import annotations

from syncbench.bench.simulate.validate_pool import ValidationRow


def rows_of(set_name: str, errors: dict[tuple[str, str], list[float]],
            link: float = 1.2e8) -> list[ValidationRow]:
    """A set's rows: each (label, configuration) with one run per error, measured 1000/s,
    on a link of ``link`` bytes/s."""
    return [ValidationRow(f"/{set_name}/{label}-{config}-r{i}.h5", "mlp", label, config,
                          1000.0, 1000.0 * (1 + err), link)
            for (label, config), errs in errors.items() for i, err in enumerate(errs)]
