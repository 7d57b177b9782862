"""How much a late answer is still worth: the utility penalty of lateness.

A classification answer earns its accuracy times a factor in ``[0, 1]`` that falls as
the answer comes later than its deadline (``lateness_ms = finish_ms - deadline_ms``;
zero or negative means on time). Each application picks one shape:

``step``
    ``1`` when on time, ``0`` when late at all. No parameters.
``linear``
    ``max(0, 1 - lateness_ms / span_ms)`` when late: worthless ``span_ms`` after the
    deadline. Example: ``span_ms = 100``, 25 ms late -> factor ``0.75``.
``sigmoid``
    a logistic fall centred ``midpoint_ms`` after the deadline, rescaled so that it is
    exactly ``1`` at the deadline::

        raw(l)    = 1 / (1 + exp(steepness_per_ms * (l - midpoint_ms)))
        factor(l) = 1                    if l <= 0
                  = raw(l) / raw(0)      if l > 0
                  = (1 + exp(-steepness_per_ms * midpoint_ms))
                    / (1 + exp(steepness_per_ms * (l - midpoint_ms)))

    Example: ``steepness_per_ms = 0.1``, ``midpoint_ms = 50``: ``raw(0) = 0.9933``, so
    50 ms late gives ``0.5 / 0.9933 = 0.503`` and 100 ms late ``0.00669 / 0.9933 =
    0.0067``.

Every factor is ``1`` for ``lateness_ms <= 0``, never increases with lateness and stays
in ``[0, 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["PENALTY_KINDS", "Penalty", "PenaltyKind"]

PenaltyKind = Literal["step", "linear", "sigmoid"]
PENALTY_KINDS: tuple[str, ...] = get_args(PenaltyKind)

_PARAMS: dict[str, tuple[str, ...]] = {
    "step": (),
    "linear": ("span_ms",),
    "sigmoid": ("steepness_per_ms", "midpoint_ms"),
}


def _logistic_tail(z: float) -> float:
    """``1 / (1 + exp(z))`` without overflow for large ``|z|``."""
    if z >= 0.0:
        e = math.exp(-z) if z < 745.0 else 0.0
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(z))


@dataclass(frozen=True, kw_only=True)
class Penalty:
    """A lateness penalty: its kind and that kind's parameters (others stay ``None``).

    Args:
        kind: ``"step"``, ``"linear"`` or ``"sigmoid"``.
        span_ms: linear only; lateness at which the factor reaches 0 (> 0).
        steepness_per_ms: sigmoid only; slope of the logistic fall (> 0).
        midpoint_ms: sigmoid only; lateness at the logistic's centre (>= 0).

    Raises:
        ValueError: naming the field, for an unknown kind, a missing, out-of-range or
            non-finite parameter, or a parameter the kind does not use.

    Example:
        >>> Penalty(kind="linear", span_ms=100.0).utility(0.9, lateness_ms=25.0)
        0.675
    """

    kind: PenaltyKind
    span_ms: float | None = None
    steepness_per_ms: float | None = None
    midpoint_ms: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in _PARAMS:
            raise ValueError(
                f"kind: unknown penalty kind {self.kind!r}; known: {', '.join(_PARAMS)}"
            )
        used = _PARAMS[self.kind]
        for field in ("span_ms", "steepness_per_ms", "midpoint_ms"):
            value = getattr(self, field)
            if field not in used:
                if value is not None:
                    raise ValueError(f"{field}: not a parameter of a {self.kind} penalty")
                continue
            if value is None:
                raise ValueError(f"{field}: a {self.kind} penalty needs {field}")
            if not math.isfinite(value):
                raise ValueError(f"{field}: must be finite, got {value!r}")
        if self.span_ms is not None and self.span_ms <= 0.0:
            raise ValueError(f"span_ms: must be > 0, got {self.span_ms!r}")
        if self.steepness_per_ms is not None and self.steepness_per_ms <= 0.0:
            raise ValueError(f"steepness_per_ms: must be > 0, got {self.steepness_per_ms!r}")
        if self.midpoint_ms is not None and self.midpoint_ms < 0.0:
            raise ValueError(f"midpoint_ms: must be >= 0, got {self.midpoint_ms!r}")

    def factor(self, lateness_ms: float) -> float:
        """The share of the accuracy a request ``lateness_ms`` late keeps, in ``[0, 1]``."""
        if math.isnan(lateness_ms):
            raise ValueError("lateness_ms: must be a number, got nan")
        if lateness_ms <= 0.0:
            return 1.0
        return self.late_factor()(lateness_ms)

    def late_factor(self) -> Callable[[float], float]:
        """:meth:`factor` for ``lateness_ms > 0`` as a function with its constants worked
        out once and no validation: for search loops that evaluate it thousands of times
        a window."""
        if self.kind == "step":
            return lambda lateness_ms: 0.0
        if self.kind == "linear":
            assert self.span_ms is not None  # checked in __post_init__
            span_ms = self.span_ms
            return lambda lateness_ms: max(0.0, 1.0 - lateness_ms / span_ms)
        assert self.steepness_per_ms is not None
        assert self.midpoint_ms is not None
        steepness, midpoint = self.steepness_per_ms, self.midpoint_ms
        at_deadline = _logistic_tail(-steepness * midpoint)
        exp = math.exp

        def sigmoid(lateness_ms: float) -> float:
            # _logistic_tail, inlined: this is the innermost call of the grouped search.
            z = steepness * (lateness_ms - midpoint)
            if z >= 0.0:
                e = exp(-z) if z < 745.0 else 0.0
                late = e / (1.0 + e)
            else:
                late = 1.0 / (1.0 + exp(z))
            return min(1.0, late / at_deadline)

        return sigmoid

    def utility(self, accuracy: float, lateness_ms: float) -> float:
        """``accuracy * factor(lateness_ms)``: what an answer this late is worth.

        Args:
            accuracy: the probability the answer is right, in ``[0, 1]``.
            lateness_ms: finish time minus deadline; ``<= 0`` is on time.

        Raises:
            ValueError: naming ``accuracy`` or ``lateness_ms`` when out of range or NaN.
        """
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy: must be in [0, 1], got {accuracy!r}")
        return accuracy * self.factor(lateness_ms)
