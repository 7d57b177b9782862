"""Registry applications as the frozen views a window scheduler reads.

:func:`app_view` turns an :class:`~switchyard.apps.registry.Application` (the profiled
registry entry) into an :class:`~switchyard.selection.snapshot.AppView`.

Emulated edge device: the bundled variants are profiled on this machine's CPU at about
0.01 to 0.25 ms a batch, two to three orders of magnitude below the 150 ms deadlines of
the SneakPeek paper's edge setting, where scheduling would then never matter. The
simulator therefore *emulates* a slower edge device by multiplying every profiled batch
latency and load time by ``latency_scale`` (:data:`DEFAULT_LATENCY_SCALE` = 100: the
largest variant's batch of 32 then takes tens of milliseconds). The relative costs of the
variants and batch sizes stay as measured; only the unit changes. Every report that uses
a scale other than 1 says so (``latency_scale`` in its configuration).

Load (swap-in) times get their own factor, ``load_scale`` (default: ``latency_scale``).
The profiled ``load_s`` is a warm-cache deserialisation of 0.05 to 2.7 ms, mostly
Python and torch start-up per call rather than bytes moved; x100 it would be 160 to
270 ms, longer than a deadline, and every swap between applications would miss it. The
simulator uses :data:`DEFAULT_LOAD_SCALE` (10: the largest variant swaps in 15 to 30 ms,
a few of its batches) unless told otherwise.
"""

from __future__ import annotations

import math

from switchyard.apps.penalty import Penalty
from switchyard.apps.registry import Application
from switchyard.selection.snapshot import AppView, VariantView

__all__ = ["DEFAULT_LATENCY_SCALE", "DEFAULT_LOAD_SCALE", "app_view"]

DEFAULT_LATENCY_SCALE = 100.0
"""Emulated edge device: profiled CPU time x 100 (see the module docstring)."""
DEFAULT_LOAD_SCALE = 10.0
"""Emulated edge device: profiled load (swap-in) time x 10."""


def _check_scale(name: str, value: float) -> float:
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


def app_view(
    application: Application,
    *,
    latency_scale: float = 1.0,
    load_scale: float | None = None,
    penalty: Penalty | None = None,
    name: str | None = None,
) -> AppView:
    """The scheduler's view of ``application``, latencies and load times x ``latency_scale``.

    Args:
        application: the registry entry.
        latency_scale: factor on every profiled batch latency and load time (> 0, finite);
            1 keeps the measured CPU figures.
        load_scale: factor on every profiled load time (> 0, finite); ``None`` uses
            ``latency_scale``.
        penalty: replaces the application's own lateness penalty when given.
        name: the view's application name (default the application's); the simulator
            names the copies of an application it runs side by side this way.

    Raises:
        ValueError: naming ``latency_scale`` or ``load_scale`` when not a finite number > 0.

    Example: a variant profiled at ``{"cpu": {1: 2e-05, 32: 2e-04}}`` with ``load_s``
    0.0015 and ``latency_scale=100`` is viewed at ``{"cpu": {1: 0.002, 32: 0.02}}``, load
    0.15 s.
    """
    _check_scale("latency_scale", latency_scale)
    load_factor = latency_scale if load_scale is None else _check_scale("load_scale", load_scale)
    variants = tuple(
        VariantView(
            name=variant_name,
            latency_s={
                worker_type: {size: s * latency_scale for size, s in sorted(by_size.items())}
                for worker_type, by_size in profile.latency_s.items()
            },
            load_s=profile.load_s * load_factor,
            accuracy=profile.accuracy,
            recall=tuple(profile.recall),
        )
        for variant_name, profile in application.variants.items()
    )
    return AppView(
        name=application.name if name is None else name,
        num_classes=len(application.classes),
        penalty=application.penalty_function() if penalty is None else penalty,
        variants=variants,
    )
