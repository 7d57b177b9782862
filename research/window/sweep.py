"""The paper's parameter sweeps for ``switchyard window --sweep NAME --values ...``.

A sweep names one setting of the window simulation and the values it takes; every value
runs every selected scheduler for every seed, the rest of the configuration unchanged.

=====================  ======================  =========================================
sweep                  setting                 default values
=====================  ======================  =========================================
``deadline``           ``--deadline-s``        0.05, 0.1, 0.15, 0.2, 0.3 (mean, s)
``deadline-std``       ``--deadline-std-s``    0, 0.025, 0.05, 0.075 (s)
``apps``               ``--apps``              1, 2, 3, 4, 6 (copies past the registry)
``requests-per-window``  ``--requests-per-window``  6, 12, 18, 24, 36
``penalty``            ``--penalty``           step, linear, sigmoid
``heterogeneity``      ``--heterogeneity``     0.5, 1, 2, 4
``latency-scale``      ``--latency-scale``     50, 100, 200, 400 (the device's compute)
``load-scale``         ``--load-scale``        10, 50, 100, 150, 200 (its swap-in)
=====================  ======================  =========================================

The last two are not the paper's: they move the emulated device, the ingredient that
decides whether request-by-request schedulers keep up (docs/benchmarks.md).

Model-variant heterogeneity ``h`` (> 0) spreads an application's variants' latencies
apart, keeping their geometric mean. The ``n`` variants are ranked from fastest to
slowest by the geometric mean of all their profiled batch latencies (ties by name); the
variant of rank ``i`` (0-based) gets the position ``r_i = 2 i / (n - 1) - 1`` in
[-1, 1] (``r = 0`` for a lone variant), and every one of its batch latencies, for every
worker type and batch size, is multiplied by ``h ** r_i``. Hence:

* ``h = 1`` leaves the profiles as measured; ``h = 2`` halves the fastest variant's
  latencies and doubles the slowest's (the ratio slowest / fastest grows 4x); ``h = 0.5``
  does the opposite (the ratio shrinks 4x, and is inverted when it was below 4).
* The factors' product is ``h ** sum(r_i) = 1``, so at every batch size the geometric
  mean of the variants' latencies is unchanged: the device is no faster or slower on
  the whole, only more or less heterogeneous.
* For ``h >= 1`` the order of the variants from fastest to slowest is kept.

Load (swap-in) times, accuracies and recalls are unchanged. The transform applies to the
profiled figures, before the emulated device's ``latency_scale`` (a plain factor, so the
order of the two does not matter): :func:`spread_view` on a scheduler's
:class:`~switchyard.selection.snapshot.AppView`, :func:`spread_registry` on the registry
the window simulator builds its views from (what ``switchyard window`` uses, since the
simulator builds the views itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from switchyard.apps.penalty import PENALTY_KINDS
from switchyard.apps.registry import Application, Registry
from switchyard.selection.snapshot import AppView

__all__ = [
    "SWEEPS",
    "Sweep",
    "SweepError",
    "SweepValue",
    "heterogeneity_factors",
    "parse_values",
    "spread_application",
    "spread_registry",
    "spread_view",
    "sweep_named",
]

SweepValue = float | int | str


class SweepError(ValueError):
    """A bad ``--sweep`` or ``--values``; the message names the option."""


def _number(text: str, *, minimum: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SweepError(f"--values: {text!r} is not a number") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise SweepError(f"--values: must be finite numbers {bound}, got {text!r}")
    return value


def _positive(text: str) -> float:
    return _number(text, minimum=0.0, strict=True)


def _integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SweepError(f"--values: {text!r} is not an integer") from None
    if value < 1:
        raise SweepError(f"--values: must be integers >= 1, got {text!r}")
    return value


def _penalty(text: str) -> str:
    if text not in PENALTY_KINDS:
        raise SweepError(f"--values: unknown penalty {text!r}; known: {', '.join(PENALTY_KINDS)}")
    return text


@dataclass(frozen=True, slots=True)
class Sweep:
    """One sweep: its name, the ``switchyard window`` setting it varies (the argparse
    attribute, also the run's configuration key), the axis label, the default values,
    and how a value is parsed and checked."""

    name: str
    field: str
    label: str
    defaults: tuple[str, ...]
    parse: Callable[[str], SweepValue]
    numeric: bool = True


SWEEPS: Mapping[str, Sweep] = {
    sweep.name: sweep
    for sweep in (
        Sweep(
            "deadline",
            "deadline_s",
            "mean deadline (s)",
            ("0.05", "0.1", "0.15", "0.2", "0.3"),
            _positive,
        ),
        Sweep(
            "deadline-std",
            "deadline_std_s",
            "deadline standard deviation (s)",
            ("0", "0.025", "0.05", "0.075"),
            lambda t: _number(t, minimum=0.0, strict=False),
        ),
        Sweep("apps", "apps", "applications", ("1", "2", "3", "4", "6"), _integer),
        Sweep(
            "requests-per-window",
            "requests_per_window",
            "requests per window",
            ("6", "12", "18", "24", "36"),
            _integer,
        ),
        Sweep(
            "penalty",
            "penalty",
            "lateness penalty",
            tuple(PENALTY_KINDS),
            _penalty,
            numeric=False,
        ),
        Sweep(
            "heterogeneity",
            "heterogeneity",
            "model-variant heterogeneity h (latency x h^r, r in [-1, 1])",
            ("0.5", "1", "2", "4"),
            _positive,
        ),
        Sweep(
            "latency-scale",
            "latency_scale",
            "emulated device: profiled batch latency x",
            ("50", "100", "200", "400"),
            _positive,
        ),
        Sweep(
            "load-scale",
            "load_scale",
            "emulated device: profiled load time x",
            ("10", "50", "100", "150", "200"),
            _positive,
        ),
    )
}
"""Every sweep by name."""


def sweep_named(name: str) -> Sweep:
    """The sweep called ``name``.

    Raises:
        SweepError: naming ``--sweep`` and listing the known sweeps.
    """
    if name not in SWEEPS:
        raise SweepError(f"--sweep: unknown sweep {name!r}; known: {', '.join(SWEEPS)}")
    return SWEEPS[name]


def parse_values(sweep: Sweep, text: str | None) -> tuple[SweepValue, ...]:
    """The values of ``--values`` (comma-separated; ``None``: the sweep's defaults).

    Example: ``parse_values(SWEEPS["apps"], "1,3")`` -> ``(1, 3)``.

    Raises:
        SweepError: naming ``--values`` for an empty list, a value that does not parse or
            is out of range, or a value given twice.
    """
    parts = sweep.defaults if text is None else tuple(p.strip() for p in text.split(","))
    if not parts or any(not p for p in parts):
        raise SweepError(f"--values: expected a comma-separated list, got {text!r}")
    values = tuple(sweep.parse(p) for p in parts)
    if len(set(values)) != len(values):
        raise SweepError(f"--values: a value is given twice in {text!r}")
    return values


# ------------------------------------------------------------------ heterogeneity


def _check_h(h: float) -> float:
    if isinstance(h, bool) or not (math.isfinite(h) and h > 0.0):
        raise ValueError(f"heterogeneity: must be a finite number > 0, got {h!r}")
    return float(h)


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def heterogeneity_factors(
    latencies: Mapping[str, Mapping[str, Mapping[int, float]]], h: float
) -> dict[str, float]:
    """Each variant's latency factor ``h ** r`` (see the module docstring).

    Args:
        latencies: variant name -> {worker type: {batch size: seconds}}, every one > 0.
        h: the heterogeneity, finite and > 0.

    Example: three variants, fastest ``a``, then ``b``, slowest ``c``, ``h = 2``:
    ``{"a": 0.5, "b": 1.0, "c": 2.0}``.

    Raises:
        ValueError: naming ``heterogeneity`` when ``h`` is not a finite number > 0.
    """
    h = _check_h(h)
    speed = {
        name: _geometric_mean([s for by_size in by_type.values() for s in by_size.values()])
        for name, by_type in latencies.items()
    }
    ranked = sorted(speed, key=lambda name: (speed[name], name))
    n = len(ranked)
    return {name: h ** (2.0 * i / (n - 1) - 1.0 if n > 1 else 0.0) for i, name in enumerate(ranked)}


def _scaled(
    latency_s: Mapping[str, Mapping[int, float]], factor: float
) -> dict[str, dict[int, float]]:
    return {
        worker_type: {size: s * factor for size, s in by_size.items()}
        for worker_type, by_size in latency_s.items()
    }


def spread_view(view: AppView, h: float) -> AppView:
    """``view`` with its variants' batch latencies x ``h ** r`` (module docstring).

    Raises:
        ValueError: naming ``heterogeneity`` when ``h`` is not a finite number > 0.
    """
    factors = heterogeneity_factors({v.name: v.latency_s for v in view.variants}, h)
    return replace(
        view,
        variants=tuple(
            replace(v, latency_s=_scaled(v.latency_s, factors[v.name])) for v in view.variants
        ),
    )


def spread_application(application: Application, h: float) -> Application:
    """``application`` with its variants' profiled batch latencies x ``h ** r``."""
    factors = heterogeneity_factors(
        {name: p.latency_s for name, p in application.variants.items()}, h
    )
    variants = {
        name: profile.model_copy(update={"latency_s": _scaled(profile.latency_s, factors[name])})
        for name, profile in application.variants.items()
    }
    return application.model_copy(update={"variants": variants})


def spread_registry(registry: Registry, h: float) -> Registry:
    """``registry`` with :func:`spread_application` applied to each application
    (``registry`` itself when ``h == 1``)."""
    if _check_h(h) == 1.0:
        return registry
    return registry.model_copy(
        update={"applications": tuple(spread_application(a, h) for a in registry.applications)}
    )
