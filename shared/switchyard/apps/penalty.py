"""How much a late answer is still worth: the utility penalty of lateness.

A classification answer earns its accuracy times a factor in ``[0, 1]`` that falls as
the answer comes later than its deadline (``lateness_s = finish_s - deadline_s``;
zero or negative means on time). Each application picks one shape:

``step``
    ``1`` when on time, ``0`` when late at all. No parameters.
``linear``
    ``max(0, 1 - lateness_s / span_s)`` when late: worthless ``span_s`` after the
    deadline. Example: ``span_s = 0.1``, 25 ms late -> factor ``0.75``.
``sigmoid``
    a logistic fall centred ``midpoint_s`` after the deadline, rescaled so that it is
    exactly ``1`` at the deadline::

        raw(l)    = 1 / (1 + exp(steepness_per_s * (l - midpoint_s)))
        factor(l) = 1                    if l <= 0
                  = raw(l) / raw(0)      if l > 0
                  = (1 + exp(-steepness_per_s * midpoint_s))
                    / (1 + exp(steepness_per_s * (l - midpoint_s)))

    Example: ``steepness_per_s = 100``, ``midpoint_s = 0.05``: ``raw(0) = 0.9933``, so
    50 ms late gives ``0.5 / 0.9933 = 0.503`` and 100 ms late ``0.00669 / 0.9933 =
    0.0067``.

Every factor is ``1`` for ``lateness_s <= 0``, never increases with lateness and stays
in ``[0, 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["PENALTY_KINDS", "Penalty", "PenaltyKind"]

PenaltyKind = Literal["step", "linear", "sigmoid"]
PENALTY_KINDS: tuple[str, ...] = get_args(PenaltyKind)

_PARAMS: dict[str, tuple[str, ...]] = {
    "step": (),
    "linear": ("span_s",),
    "sigmoid": ("steepness_per_s", "midpoint_s"),
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
        span_s: linear only; lateness at which the factor reaches 0 (> 0).
        steepness_per_s: sigmoid only; slope of the logistic fall (> 0).
        midpoint_s: sigmoid only; lateness at the logistic's centre (>= 0).

    Raises:
        ValueError: naming the field, for an unknown kind, a missing, out-of-range or
            non-finite parameter, or a parameter the kind does not use.

    Example:
        >>> Penalty(kind="linear", span_s=0.1).utility(0.9, lateness_s=0.025)
        0.675
    """

    kind: PenaltyKind
    span_s: float | None = None
    steepness_per_s: float | None = None
    midpoint_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in _PARAMS:
            raise ValueError(
                f"kind: unknown penalty kind {self.kind!r}; known: {', '.join(_PARAMS)}"
            )
        used = _PARAMS[self.kind]
        for field in ("span_s", "steepness_per_s", "midpoint_s"):
            value = getattr(self, field)
            if field not in used:
                if value is not None:
                    raise ValueError(f"{field}: not a parameter of a {self.kind} penalty")
                continue
            if value is None:
                raise ValueError(f"{field}: a {self.kind} penalty needs {field}")
            if not math.isfinite(value):
                raise ValueError(f"{field}: must be finite, got {value!r}")
        if self.span_s is not None and self.span_s <= 0.0:
            raise ValueError(f"span_s: must be > 0, got {self.span_s!r}")
        if self.steepness_per_s is not None and self.steepness_per_s <= 0.0:
            raise ValueError(f"steepness_per_s: must be > 0, got {self.steepness_per_s!r}")
        if self.midpoint_s is not None and self.midpoint_s < 0.0:
            raise ValueError(f"midpoint_s: must be >= 0, got {self.midpoint_s!r}")

    def factor(self, lateness_s: float) -> float:
        """The share of the accuracy a request ``lateness_s`` late keeps, in ``[0, 1]``."""
        if math.isnan(lateness_s):
            raise ValueError("lateness_s: must be a number, got nan")
        if lateness_s <= 0.0:
            return 1.0
        return self.late_factor()(lateness_s)

    def late_factor(self) -> Callable[[float], float]:
        """:meth:`factor` for ``lateness_s > 0`` as a function with its constants worked
        out once and no validation: for search loops that evaluate it thousands of times
        a window."""
        if self.kind == "step":
            return lambda lateness_s: 0.0
        if self.kind == "linear":
            assert self.span_s is not None  # checked in __post_init__
            span_s = self.span_s
            return lambda lateness_s: max(0.0, 1.0 - lateness_s / span_s)
        assert self.steepness_per_s is not None
        assert self.midpoint_s is not None
        steepness, midpoint = self.steepness_per_s, self.midpoint_s
        at_deadline = _logistic_tail(-steepness * midpoint)
        exp = math.exp

        def sigmoid(lateness_s: float) -> float:
            # _logistic_tail, inlined: this is the innermost call of the grouped search.
            z = steepness * (lateness_s - midpoint)
            if z >= 0.0:
                e = exp(-z) if z < 745.0 else 0.0
                late = e / (1.0 + e)
            else:
                late = 1.0 / (1.0 + exp(z))
            return min(1.0, late / at_deadline)

        return sigmoid

    def late_total(
        self,
    ) -> Callable[[Sequence[float], Sequence[float], Sequence[float], int, float], float]:
        """``sum(max(accs[i] * factor(end_s - deadlines[i]), floors[i]) for i in
        range(late))`` for deadlines before ``end_s``, each request worth at least its
        floor (what another way of answering it earns; zeros for none), as a function
        with the constants worked out once and the sigmoid inlined: the grouped search's
        innermost loop, where a call per request was most of its time."""
        if self.kind == "step":
            return lambda accs, floors, deadlines, late, end_s: sum(floors[:late])
        if self.kind == "linear":  # not the registry's default: the plain form will do
            factor = self.late_factor()
            return lambda accs, floors, deadlines, late, end_s: sum(
                max(accs[i] * factor(end_s - deadlines[i]), floors[i]) for i in range(late)
            )
        assert self.steepness_per_s is not None
        assert self.midpoint_s is not None
        steepness, midpoint = self.steepness_per_s, self.midpoint_s
        scale = 1.0 / _logistic_tail(-steepness * midpoint)
        exp = math.exp

        def sigmoid(
            accs: Sequence[float],
            floors: Sequence[float],
            deadlines: Sequence[float],
            late: int,
            end_s: float,
        ) -> float:
            value = 0.0
            for i in range(late):
                z = steepness * (end_s - deadlines[i] - midpoint)
                if z >= 0.0:
                    e = exp(-z) if z < 745.0 else 0.0
                    kept = e / (1.0 + e) * scale
                else:
                    kept = scale / (1.0 + exp(z))
                answered = accs[i] * (kept if kept < 1.0 else 1.0)
                value += answered if answered > floors[i] else floors[i]
            return value

        return sigmoid

    def utility(self, accuracy: float, lateness_s: float) -> float:
        """``accuracy * factor(lateness_s)``: what an answer this late is worth.

        Args:
            accuracy: the probability the answer is right, in ``[0, 1]``.
            lateness_s: finish time minus deadline; ``<= 0`` is on time.

        Raises:
            ValueError: naming ``accuracy`` or ``lateness_s`` when out of range or NaN.
        """
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy: must be in [0, 1], got {accuracy!r}")
        return accuracy * self.factor(lateness_s)
