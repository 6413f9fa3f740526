"""The algorithm label of a run in tables: the registry name plus named variants.

A variant that changes what an algorithm computes, and is not the published
algorithm, is labelled in every table so that it cannot be mistaken for it:
OD-SGD with ``--local-lookahead`` is ``odsgd+la`` (see ALGORITHMS.md,
"OD-SGD"). Everything else is labelled by its ``algorithm`` root attribute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .schema import strategy_traits


def _config(attrs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run's flags: the ``config`` root attribute, parsed if it is still JSON text."""
    config = attrs.get("config")
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config or "{}")
        except json.JSONDecodeError:
            return {}
    return config if isinstance(config, Mapping) else {}


def run_label(attrs: Mapping[str, Any]) -> str:
    """``algorithm`` of a run's root attributes, with the suffix of its variant, if any.

    ``attrs`` are the root attributes (``Run.attrs``), whose ``config`` may be
    the parsed dict or the JSON text. An absent algorithm gives ``""``.
    """
    algorithm = str(attrs.get("algorithm") or "")
    config = _config(attrs)
    for flag, value, suffix in strategy_traits(attrs).label_variants:
        if config.get(flag) == value:
            algorithm += suffix
    return algorithm
