"""What a strategy says about itself, declared once: :class:`StrategyTraits`.

One frozen value per strategy class (``Strategy.traits``). Part of it travels in every
run file (the root attribute ``strategy_traits``, :data:`FILE_FIELDS`), so that
analysis, traces and the simulator read a strategy's behaviour from the file and never
key anything by its name; the rest are the capabilities ``syncbench train`` checks its
flags against. No MPI here: ``syncbench.analysis`` imports this module too.

The run file's per-step timing phases (:data:`PHASES`) and the step orders are defined
here for the same reason: the timers (``algorithms.timing``) and the schema
(``analysis.schema``) name them from one place.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Per-step timing phases (the column order of the run file). A step runs ``delay``
#: right after ``compute``; :attr:`StrategyTraits.step_order` is the order a strategy
#: runs them in, for drawing. ``codec`` is the encoding, decoding and summing of
#: compressed codes (``--compress``, ``--quantize``, ``--gossip-codec``), kept out of
#: ``update`` so that ``compute`` and ``update`` mean the same in every strategy; it is
#: last because files written before it lack it (readers fill in zeros).
PHASES: tuple[str, ...] = ("data", "compute", "comm", "wait", "update", "delay", "codec")

#: A lock-step strategy's order: compute, then encode and communicate, then update.
LOCK_STEP_ORDER: tuple[str, ...] = ("data", "compute", "delay", "codec", "comm", "wait",
                                    "update")
#: A local-steps strategy's order: each local step updates before a round encodes and
#: communicates.
LOCAL_FIRST_ORDER: tuple[str, ...] = ("data", "compute", "delay", "update", "codec", "comm",
                                      "wait")


@dataclass(frozen=True)
class StrategyTraits:
    """A strategy's traits: what analysis needs to know (written to the run file) and
    what the driver checks its flags against.

    In the run file (:data:`FILE_FIELDS`):

    - ``step_order``: the phases of a step in the order it runs them (traces draw them
      so; the fairness metrics find where compute and delay start).
    - ``split_phases``: a phase run twice in a step around compute, with the share of
      its seconds that falls before compute (drawn once, before compute).
    - ``hides_comm``: the hidden-communication fraction against the blocking-Allreduce
      reference applies.
    - ``snapshot_evaluations``: evaluation rows come from parameter copies evaluated
      after training (no pause in the steps).
    - ``label_variants``: (option, value, suffix) of variants that are not the
      published algorithm and carry a suffix in every table.
    - ``simulation``: the communication pattern the simulator models ("" none).

    Capabilities (not in the file):

    - ``supports_checkpoint``: ``--checkpoint-every``/``--resume`` resume the run exactly.
    - ``supports_stop_at_target``: evaluation points occur during training.
    - ``deterministic``: same flags and seed give bit-identical parameters.
    - ``lock_step``: every rank takes the same steps and step i of every rank runs the
      same collectives (``--sync-bn`` may reduce inside a step).
    - ``stop_vote_lag``: evaluation points between posting a stop vote and completing it
      (``bench/train/stopping.py``): 1 where a blocking reduction of every rank lies
      between two points, 2 where step n's reduction completes at step n+1.
    - ``local_optimizers``: the ``--optimizer`` values it can step with, its default
      first (:mod:`~syncbench.algorithms.local_optimizer`).
    """

    step_order: tuple[str, ...] = LOCK_STEP_ORDER
    split_phases: Mapping[str, float] = field(default_factory=dict)
    hides_comm: bool = False
    snapshot_evaluations: bool = False
    label_variants: tuple[tuple[str, Any, str], ...] = ()
    simulation: str = ""
    supports_checkpoint: bool = True
    supports_stop_at_target: bool = True
    deterministic: bool = True
    lock_step: bool = True
    stop_vote_lag: int = 2
    local_optimizers: tuple[str, ...] = ("sgd", "adamw")

    def to_json(self) -> str:
        """The run file's ``strategy_traits`` attribute: the :data:`FILE_FIELDS`."""
        return json.dumps({"step_order": list(self.step_order),
                           "split_phases": dict(self.split_phases),
                           "hides_comm": self.hides_comm,
                           "snapshot_evaluations": self.snapshot_evaluations,
                           "label_variants": [list(v) for v in self.label_variants],
                           "simulation": self.simulation}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> StrategyTraits:
        """Traits from the attribute's JSON; unknown keys are ignored, capabilities keep
        their defaults (a file does not carry them)."""
        data = json.loads(text)
        return cls(step_order=tuple(data.get("step_order", LOCK_STEP_ORDER)),
                   split_phases=dict(data.get("split_phases", {})),
                   hides_comm=bool(data.get("hides_comm", False)),
                   snapshot_evaluations=bool(data.get("snapshot_evaluations", False)),
                   label_variants=tuple(tuple(v) for v in data.get("label_variants", ())),
                   simulation=str(data.get("simulation", "")))

    def in_file(self) -> StrategyTraits:
        """These traits as a run file holds them (capabilities at their defaults)."""
        return dataclasses.replace(self, **{f.name: f.default for f in dataclasses.fields(self)
                                            if f.name not in FILE_FIELDS})


#: The traits a run file carries (``StrategyTraits.to_json``).
FILE_FIELDS: frozenset[str] = frozenset({"step_order", "split_phases", "hides_comm",
                                         "snapshot_evaluations", "label_variants",
                                         "simulation"})
