"""Name -> strategy class. A new strategy is one module plus one ``register`` call.

The built-in strategies are registered below. A strategy defined elsewhere
(a test module, a user's experiment) registers itself with :func:`register`
when its module is imported; ``SYNCBENCH_STRATEGIES`` (comma-separated module
names) imports such modules in every process of a run, so that ranks started
by ``mpiexec`` know them too. Everything that lists strategies (the flags of
``syncbench train``, ``syncbench simulate --algorithm``, the registry-wide
tests) reads :data:`ALGORITHMS`. Importing this module does not load ``mpi4py.MPI``
(strategies name MPI through :mod:`syncbench.algorithms.mpi`): listing strategies,
building their flags and checking them need no MPI.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

from syncbench.algorithms.adpsgd import ADPSGD
from syncbench.algorithms.asgd import ASGD
from syncbench.algorithms.base import Strategy
from syncbench.algorithms.diloco import DiLoCo
from syncbench.algorithms.dpsgd import DPSGD
from syncbench.algorithms.flags import validate_options
from syncbench.algorithms.hierarchical import Hierarchical
from syncbench.algorithms.localsgd import LocalSGD
from syncbench.algorithms.odsgd import ODSGD
from syncbench.algorithms.oscars import Oscars
from syncbench.algorithms.slowmo import SlowMo
from syncbench.algorithms.ssgd import SSGD

#: Environment variable naming extra modules that register strategies.
PLUGINS_ENV = "SYNCBENCH_STRATEGIES"

ALGORITHMS: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Add ``cls`` under ``cls.name`` (usable as a class decorator).

    A name names one strategy: registering a different class under a taken
    name is a ``ValueError`` (re-importing the same module is not).
    """
    other = ALGORITHMS.get(cls.name)
    if other is not None and (other.__module__, other.__qualname__) != (
            cls.__module__, cls.__qualname__):
        raise ValueError(f"strategy name {cls.name!r} is taken by {other.__qualname__}")
    ALGORITHMS[cls.name] = cls
    return cls


for _cls in (SSGD, ASGD, LocalSGD, Oscars, ODSGD, SlowMo, DiLoCo, Hierarchical, DPSGD,
             ADPSGD):
    register(_cls)


def get_algorithm(name: str) -> type[Strategy]:
    """The class registered as ``name``; ``ValueError`` lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown --algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}"
        ) from None


def validate(cls: type[Strategy], config: object, world_size: int) -> None:
    """Raise ``ValueError`` with a one-line message for bad options of ``cls`` in
    ``config`` on ``world_size`` ranks (every rank agrees)."""
    validate_options(cls.Options, config, world_size)


def option_owners() -> dict[str, tuple[dataclasses.Field, tuple[str, ...]]]:
    """Every strategy option by its ``config`` key: its field and the strategies that
    take it, in registration order.

    Read from each strategy's ``Options`` (:mod:`syncbench.algorithms.flags`), so a
    strategy's flags are declared once, where its options are: a field another
    strategy's ``Options`` inherits (``--period``: Local SGD's and Oscars') is taken by
    both. ``syncbench train`` refuses a flag its ``--algorithm`` does not take.
    """
    owners: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for cls in ALGORITHMS.values():
        for field in dataclasses.fields(cls.Options):
            owners.setdefault(field.name, (field, []))[1].append(cls.name)
    return {key: (field, tuple(names)) for key, (field, names) in owners.items()}


def load_plugins(spec: str | None = None) -> None:
    """Import the modules named in ``spec`` (default ``$SYNCBENCH_STRATEGIES``)."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    for module in filter(None, (m.strip() for m in spec.split(","))):
        importlib.import_module(module)


load_plugins()
