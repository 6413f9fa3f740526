"""Name -> algorithm class. A new strategy is one module plus one line here."""

from __future__ import annotations

from syncbench.algorithms.asgd import ASGD
from syncbench.algorithms.base import Algorithm
from syncbench.algorithms.localsgd import LocalSGD
from syncbench.algorithms.odsgd import ODSGD
from syncbench.algorithms.oscars import Oscars
from syncbench.algorithms.ssgd import SSGD

ALGORITHMS: dict[str, type[Algorithm]] = {
    SSGD.name: SSGD,
    ASGD.name: ASGD,
    LocalSGD.name: LocalSGD,
    Oscars.name: Oscars,
    ODSGD.name: ODSGD,
}


def get_algorithm(name: str) -> type[Algorithm]:
    """The class registered as ``name``; ``ValueError`` lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown --algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}"
        ) from None
