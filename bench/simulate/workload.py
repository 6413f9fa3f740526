"""What a rank computes per step: from a measured run file, or a named profile.

A :class:`Workload` gives the parameter count (what is communicated), the
batch size and the per-step local seconds of the ``data``, ``compute`` and
``update`` phases, drawn per rank and step:

* ``--workload RUN.h5``: the rows of a measured run, pooled over its ranks
  (leaving out the first two steps of each rank, and OD-SGD's warm-up), are
  resampled row by row, so each phase keeps its measured distribution and
  the phases their correlation. The model's parameter count is rebuilt from
  the run's ``--model`` and dataset shape; batch and dataset come from its
  config.
* ``--workload NAME``: a profile of ``profiles.toml``. ``mlp`` and ``lenet``
  carry seconds per step measured on this machine (lognormal with the
  measured mean and coefficient of variation); the others carry parameter
  counts and training FLOPs per sample from their papers, and need a device
  (``--device-flops``, or ``--device h100|a100|v100`` at a stated efficiency).

Stragglers (:func:`parse_stragglers`), on top of ``--slowdown`` (train's
per-rank factors, parsed by train's own parser): ``lognormal:SIGMA`` scales
every rank's every step by exp(N(0, SIGMA^2)); ``P/Q:Fx`` slows round(N*P/Q)
randomly chosen ranks by F for the whole run; ``P/Q:lognormal:SIGMA`` slows
each step of each rank with probability P/Q by 1 + exp(N(0, SIGMA^2)) (a
transient straggler: OS noise, a garbage collection, a throttled GPU). The
extra time is the ``delay`` phase, as ``--slowdown`` records it in train.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PROFILES_FILE = Path(__file__).with_name("profiles.toml")

#: Input shape and class count of the datasets runs use (for the parameter count).
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "fashion-mnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "synthetic": ((1, 28, 28), 10),
}
DATASET_SAMPLES = {"fashion-mnist": 60000, "mnist": 60000, "cifar10": 50000}

#: Layers assumed for a profile without a buildable model (equal sizes).
PROFILE_LAYERS = 50

#: Share of a step's compute that is the backward pass (buckets become ready in it).
BACKWARD_SHARE = 2.0 / 3.0


@dataclass
class Workload:
    """Per-step local work of one model."""

    name: str
    params: int
    batch_size: int
    dataset_samples: int
    itemsize: int = 4
    #: Measured rows to resample: columns data, compute, update (seconds).
    rows: np.ndarray | None = None
    #: Else lognormal compute with this mean and coefficient of variation.
    mean_compute_s: float = 0.0
    cv: float = 0.0
    mean_data_s: float = 0.0
    mean_update_s: float = 0.0
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Offset of each layer's parameters in the flat buffer (SSGD's bucket plan);
    #: empty: ``PROFILE_LAYERS`` layers of equal size.
    layer_offsets: list[int] = field(default_factory=list)

    def offsets(self) -> list[int]:
        if self.layer_offsets:
            return list(self.layer_offsets)
        return [self.params * i // PROFILE_LAYERS for i in range(PROFILE_LAYERS)]

    @property
    def param_bytes(self) -> float:
        return float(self.params * self.itemsize)

    def describe(self) -> dict[str, Any]:
        """The attributes recorded in a simulated run file."""
        out = {"name": self.name, "params": self.params, "batch_size": self.batch_size,
               "itemsize": self.itemsize, "source": self.source}
        if self.rows is not None:
            out.update(rows=len(self.rows), mean_step_s=float(self.rows.sum(axis=1).mean()))
        else:
            out.update(mean_compute_s=self.mean_compute_s, cv=self.cv)
        return {**out, **self.extra}

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Local seconds, shape ``(*shape, 3)``: data, compute, update of each step."""
        if self.rows is not None:
            idx = rng.integers(0, len(self.rows), size=shape)
            return self.rows[idx]
        out = np.empty((*shape, 3))
        out[..., 0] = self.mean_data_s
        out[..., 2] = self.mean_update_s
        if self.cv > 0:
            sigma = math.sqrt(math.log1p(self.cv ** 2))
            out[..., 1] = self.mean_compute_s * rng.lognormal(-sigma ** 2 / 2, sigma, shape)
        else:
            out[..., 1] = self.mean_compute_s
        return out


def model_layout(model: str, dataset: str) -> tuple[int, list[int]]:
    """(parameters, layer offsets) of ``model`` on ``dataset``'s inputs (built once, on CPU)."""
    from syncbench.kernels.zoo import build_model  # noqa: PLC0415

    shape, classes = DATASET_SHAPES.get(dataset, ((1, 28, 28), 10))
    built = build_model(model, shape, classes)
    return int(built.size), [int(o) for o in built.layer_offsets]


def from_run(path: str) -> Workload:
    """The workload of a measured run file (see the module docstring)."""
    from syncbench.analysis.runfile import RunFileError, read_run  # noqa: PLC0415

    try:
        run = read_run(path)
    except RunFileError as exc:
        raise ValueError(f"--workload {exc}") from None
    if run.attrs.get("simulated"):
        raise ValueError(f"--workload {path}: is a simulated run; give a measured one")
    skip = 2 + int(run.attrs.get("warmup_steps", 0) or 0)
    parts = []
    for cols in run.ranks.values():
        keep = slice(skip, None) if len(cols["step"]) > skip + 2 else slice(None)
        parts.append(np.stack([cols["t_data"][keep], cols["t_compute"][keep],
                               cols["t_update"][keep]], axis=1))
    rows = np.concatenate(parts) if parts else np.zeros((0, 3))
    if len(rows) == 0:
        raise ValueError(f"--workload {path}: has no step rows")
    config = run.config
    model = str(run.attrs.get("model") or config.get("model") or "mlp")
    dataset = str(run.attrs.get("dataset") or config.get("dataset") or "fashion-mnist")
    itemsize = 8 if config.get("dtype") == "float64" else 4
    samples = DATASET_SAMPLES.get(dataset, int(config.get("synthetic_samples", 8192)))
    params, offsets = model_layout(model, dataset)
    return Workload(name=model, params=params, layer_offsets=offsets,
                    batch_size=int(config.get("batch_size", 64)), dataset_samples=samples,
                    itemsize=itemsize, rows=rows, source=str(path),
                    extra={"dataset": dataset, "measured_world_size": run.world_size})


def load_profiles() -> dict[str, Any]:
    with open(PROFILES_FILE, "rb") as f:
        return tomllib.load(f)


def from_profile(name: str, device: str | None = None, device_flops: float | None = None,
                 efficiency: float | None = None) -> Workload:
    """The workload of a named profile (``ValueError`` with one line if it cannot be built)."""
    profiles = load_profiles()
    models, devices = profiles.get("model", {}), profiles.get("device", {})
    if name not in models:
        raise ValueError(f"--workload {name!r}: not a run file or a profile; profiles: "
                         f"{', '.join(sorted(models))}")
    p = models[name]
    extra: dict[str, Any] = {}
    offsets: list[int] = []
    if name in ("mlp", "lenet"):
        _, offsets = model_layout(name, "fashion-mnist")
    if "step_seconds" in p:
        mean_compute = float(p["step_seconds"])
        cv = float(p.get("cv", 0.0))
    else:
        if device_flops is None:
            if device is None:
                raise ValueError(f"--workload {name}: needs --device-flops F or --device "
                                 f"({', '.join(sorted(devices))})")
            if device not in devices:
                raise ValueError(f"--device {device!r}: choose one of {', '.join(sorted(devices))}")
            d = devices[device]
            eff = float(efficiency if efficiency is not None else d["efficiency"])
            device_flops = float(d["peak_flops"]) * eff
            extra.update(device=device, efficiency=eff)
        mean_compute = int(p["batch_size"]) * float(p["train_flops_per_sample"]) / device_flops
        cv = float(p.get("cv", 0.02))
        extra["device_flops"] = device_flops
    return Workload(name=name, params=int(p["params"]), batch_size=int(p["batch_size"]),
                    dataset_samples=int(p.get("dataset_samples", 60000)),
                    mean_compute_s=mean_compute, cv=cv,
                    mean_data_s=float(p.get("data_seconds", 0.0)),
                    mean_update_s=float(p.get("update_seconds", 0.0)),
                    source=f"profile {name}: {p.get('source', '')}", extra=extra,
                    layer_offsets=offsets)


# -- stragglers -------------------------------------------------------------------

@dataclass(frozen=True)
class Stragglers:
    """A parsed ``--stragglers`` model."""

    spec: str = ""
    every_sigma: float = 0.0  # lognormal:SIGMA on every step
    persistent_share: float = 0.0  # P/Q:Fx
    persistent_factor: float = 1.0
    transient_share: float = 0.0  # P/Q:lognormal:SIGMA
    transient_sigma: float = 0.0


def parse_stragglers(spec: str | None) -> Stragglers:
    """``lognormal:SIGMA``, ``P/Q:Fx`` or ``P/Q:lognormal:SIGMA``, comma-separated."""
    if not spec:
        return Stragglers()
    fields: dict[str, Any] = {"spec": spec}
    for item in spec.split(","):
        parts = item.strip().split(":")
        try:
            if parts[0] == "lognormal" and len(parts) == 2:
                fields["every_sigma"] = float(parts[1])
                ok = fields["every_sigma"] >= 0
            elif len(parts) == 2 and parts[1].endswith("x"):
                fields["persistent_share"] = float(Fraction(parts[0]))
                fields["persistent_factor"] = float(parts[1][:-1])
                ok = 0 <= fields["persistent_share"] <= 1 and fields["persistent_factor"] >= 1
            elif len(parts) == 3 and parts[1] == "lognormal":
                fields["transient_share"] = float(Fraction(parts[0]))
                fields["transient_sigma"] = float(parts[2])
                ok = 0 <= fields["transient_share"] <= 1 and fields["transient_sigma"] >= 0
            else:
                ok = False
        except (ValueError, ZeroDivisionError):
            ok = False
        if not ok:
            raise ValueError(f"--stragglers {spec!r}: expected lognormal:SIGMA, P/Q:Fx (F >= 1) "
                             f"or P/Q:lognormal:SIGMA, got {item!r}")
    return Stragglers(**fields)


def delay_factors(model: Stragglers, base: np.ndarray, rng: np.random.Generator,
                  shape: tuple[int, int]) -> np.ndarray:
    """Per rank and step, the factor compute is stretched by (>= 1; ``base``: --slowdown)."""
    n, steps = shape
    factor = np.repeat(np.asarray(base, dtype=float)[:, None], steps, axis=1)
    if model.every_sigma > 0:
        factor *= rng.lognormal(0.0, model.every_sigma, shape)
    if model.persistent_share > 0:
        count = int(round(n * model.persistent_share))
        slow = rng.choice(n, size=count, replace=False) if count else []
        factor[slow] *= model.persistent_factor
    if model.transient_share > 0:
        hit = rng.random(shape) < model.transient_share
        factor[hit] *= 1.0 + rng.lognormal(0.0, model.transient_sigma, int(hit.sum()))
    return np.maximum(factor, 1.0) if model.every_sigma == 0 else factor
