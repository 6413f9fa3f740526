"""``MPI``: mpi4py's ``MPI`` module, loaded at its first use rather than at import.

Importing ``mpi4py.MPI`` loads the MPI library and, by mpi4py's default, calls
``MPI_Init``. The strategies, their parts and the communicator name MPI objects
(``MPI.SUM``, ``MPI.Request``, ``MPI.Win``) only inside code that runs on ranks, so
they refer to this proxy: importing the registry, listing the strategies, building
their flags or using their pure schedule math (the simulator, unit tests, ``--help``)
never loads MPI, and the first attribute read on a rank loads it exactly as the
plain import would (mpi4py's ``rc`` settings apply then).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _MPIOnFirstUse:
    """Attribute reads are forwarded to ``mpi4py.MPI``, imported by the first one."""

    __slots__ = ()

    @staticmethod
    def module() -> ModuleType:
        return importlib.import_module("mpi4py.MPI")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module(), name)

    def __repr__(self) -> str:
        return "<mpi4py.MPI, loaded at first use>"


MPI: Any = _MPIOnFirstUse()
