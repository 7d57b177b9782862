"""How wrong the admission gates' recent estimates were: the errors they learn from.

Both gates (:mod:`services.ingress.load_shedding` for requests,
:mod:`services.ingress.pipeline_admission` for pipeline calls) estimate with a queue
model, and past capacity admit work right up to its deadline, so any error that makes an
estimate short turns admitted work into a miss. As GAPS calibrates its service-time
predictions, each gate keeps the errors of the work it admitted once that work is
answered (:class:`EstimateErrors`) and corrects every later estimate by their
:data:`CALIBRATION_QUANTILE`.

An error counts for :data:`CALIBRATION_HORIZON` times its work's relative deadline after
its answer, and only the latest :data:`CALIBRATION_WINDOW` count: late finishes widen the
correction, it shrinks again as admitted work finishes on time, and it lapses when
nothing has been admitted for a while (a correction that refused everything would
otherwise never be undone). With fewer than :data:`CALIBRATION_MIN_CALLS` errors counting
there is no correction: a quantile of a handful is their worst.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = [
    "CALIBRATION_HORIZON",
    "CALIBRATION_MIN_CALLS",
    "CALIBRATION_QUANTILE",
    "CALIBRATION_WINDOW",
    "EstimateErrors",
]

CALIBRATION_WINDOW = 200
"""Admitted calls or requests whose estimate errors calibrate a gate (the latest
answered)."""
CALIBRATION_QUANTILE = 0.9
"""The quantile of those errors a gate corrects by: about this share of the work
admitted at the edge of its deadline should meet it."""
CALIBRATION_MIN_CALLS = 20
"""Errors that must count before a gate corrects anything."""
CALIBRATION_HORIZON = 4.0
"""How long an error counts after its work was answered, in that work's relative
deadlines (``deadline - arrival``)."""


class EstimateErrors:
    """The latest :data:`CALIBRATION_WINDOW` errors, each counting until a time, and
    their :data:`CALIBRATION_QUANTILE` (module documentation). What an error is (seconds
    late, a ratio) is the gate's."""

    __slots__ = ("_cached", "_errors")

    def __init__(self) -> None:
        self._errors: deque[tuple[float, float]] = deque(maxlen=CALIBRATION_WINDOW)
        """``(counts until, error)`` of each."""
        self._cached: tuple[float, float, float | None] | None = None
        """``(computed at, valid until, quantile)``: a gate asks once per decision, and
        the answer changes only when an error is added or stops counting."""

    def add(self, error: float, until_s: float) -> None:
        """Learn ``error``, counting until ``until_s``."""
        self._errors.append((until_s, error))
        self._cached = None

    def quantile(self, now_s: float) -> float | None:
        """The calibration quantile of the errors counting at ``now_s``; None with fewer
        than :data:`CALIBRATION_MIN_CALLS` of them."""
        cached = self._cached
        if cached is not None and cached[0] <= now_s < cached[1]:
            return cached[2]
        counting = [(until_s, error) for until_s, error in self._errors if until_s >= now_s]
        valid_until_s = min((until_s for until_s, _ in counting), default=math.inf)
        value: float | None = None
        if len(counting) >= CALIBRATION_MIN_CALLS:
            errors = sorted(error for _, error in counting)
            value = errors[min(len(errors) - 1, int(CALIBRATION_QUANTILE * len(errors)))]
        # Valid until the first counting error lapses (strictly after it: ``>=`` above).
        self._cached = (now_s, math.nextafter(valid_until_s, math.inf), value)
        return value

    def __len__(self) -> int:
        """How many errors are kept (counting or not)."""
        return len(self._errors)
