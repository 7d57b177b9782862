"""A window simulation's settings, checked when made, and the ``--penalty`` shapes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.apps.penalty import PENALTY_KINDS, Penalty
from switchyard.apps.profiling import WORKER_TYPE
from switchyard.estimation import INDEX_KINDS, PRIOR_KINDS
from switchyard.selection.views import DEFAULT_LATENCY_SCALE, DEFAULT_LOAD_SCALE

__all__ = ["DEFAULT_PENALTIES", "WindowSimConfig"]

DEFAULT_PENALTIES: Mapping[str, Penalty] = {
    "step": Penalty(kind="step"),
    "linear": Penalty(kind="linear", span_s=0.1),
    "sigmoid": Penalty(kind="sigmoid", steepness_per_s=100.0, midpoint_s=0.05),
}
"""``--penalty`` overrides: worthless when late; linearly worthless 100 ms after the
deadline; half the value 50 ms after it (the registry's default sigmoid)."""


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")


def _at_least_one(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSimConfig:
    """A window simulation's settings; ``__post_init__`` raises ``ValueError`` naming
    the field for a bad one.

    Attributes:
        window_s: length of a scheduling window.
        requests_per_window: requests arriving in each window (all applications).
        apps: applications taking part, ``None`` for every one of the registry. More
            than the registry holds runs copies side by side (``digits#2``: the same
            data and models, its own requests and its own resident-model slot).
        windows: windows simulated.
        deadline_s, deadline_std_s: mean and standard deviation of the relative
            deadline (normal, clipped to >= 1 ms; std 0: every deadline is the mean).
        penalty: ``step``, ``linear`` or ``sigmoid`` (:data:`DEFAULT_PENALTIES`) for
            every application, ``None`` for each application's own.
        workers: identical workers (the registry's worker type).
        latency_scale, load_scale: the emulated device's factors on profiled batch
            latencies and load times.
        k: SneakPeek's neighbours per request.
        index: ``flat``, ``ivf`` or ``hnsw``.
        prior: ``jeffreys``, ``weak`` or ``strong`` for every application, ``None`` for
            each application's own (Jeffreys in the bundled registry).
        seed: the workload's seed.
        worker_type: which profile the workers use.
        malformed_fraction: share of requests the workload corrupts on purpose, in
            turn a NaN feature, a feature vector of the wrong length, and an unknown
            application: the shell rejects the first two before scheduling (as ingress
            would), the scheduler rejects the third; the rest of each window is
            scheduled as usual. Fault injection for robustness runs; 0 by default.
    """

    window_s: float = 0.1
    requests_per_window: int = 12
    apps: int | None = None
    windows: int = 50
    deadline_s: float = 0.15
    deadline_std_s: float = 0.0
    penalty: str | None = None
    workers: int = 1
    latency_scale: float = DEFAULT_LATENCY_SCALE
    load_scale: float = DEFAULT_LOAD_SCALE
    k: int = 5
    index: str = "flat"
    prior: str | None = None
    seed: int = 0
    worker_type: str = WORKER_TYPE
    malformed_fraction: float = 0.0

    def __post_init__(self) -> None:
        _positive("window_s", self.window_s)
        _at_least_one("requests_per_window", self.requests_per_window)
        if self.apps is not None:
            _at_least_one("apps", self.apps)
        _at_least_one("windows", self.windows)
        _positive("deadline_s", self.deadline_s)
        if isinstance(self.deadline_std_s, bool) or not (
            math.isfinite(self.deadline_std_s) and self.deadline_std_s >= 0
        ):
            raise ValueError(
                f"deadline_std_s: must be a finite number >= 0, got {self.deadline_std_s!r}"
            )
        if self.penalty is not None and self.penalty not in PENALTY_KINDS:
            raise ValueError(
                f"penalty: unknown kind {self.penalty!r}; known: {', '.join(PENALTY_KINDS)}"
            )
        _at_least_one("workers", self.workers)
        _positive("latency_scale", self.latency_scale)
        _positive("load_scale", self.load_scale)
        _at_least_one("k", self.k)
        if self.index not in INDEX_KINDS:
            raise ValueError(f"index: unknown kind {self.index!r}; known: {', '.join(INDEX_KINDS)}")
        if self.prior is not None and self.prior not in PRIOR_KINDS:
            raise ValueError(f"prior: unknown kind {self.prior!r}; known: {', '.join(PRIOR_KINDS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if not (0.0 <= self.malformed_fraction < 1.0):
            raise ValueError(
                f"malformed_fraction: must be within [0, 1), got {self.malformed_fraction!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings, JSON-ready."""
        return asdict(self)
