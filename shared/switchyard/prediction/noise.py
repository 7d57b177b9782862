"""Predictors for experiments: injected error and the clairvoyant reference.

:class:`NoisyPredictor` multiplies every prediction of another predictor by ``1 + e``
with ``e ~ Normal(0, error)`` clipped to ``[-0.9, +3.0]``: ``error=0.4`` is "40 %
prediction error". A 2.0 s prediction with a draw of ``e = -0.25`` becomes 1.5 s; the
clip keeps every prediction positive (at least a tenth of the original) and bounds the
rare huge overestimate. Up to ``error=0.4`` the clip (2.25 standard deviations below
zero at 40 %) barely shows: the spread of the relative error is within about 1 % of
``error`` and its mean stays near zero. Larger errors are trimmed more: at
``error=1.0`` the spread is about 0.85 and the mean about +0.1.

:class:`ExactServiceTime` is the oracle of the experiments: the caller, who knows the
true service time of each request, hands it a function that returns it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from switchyard.prediction.base import ServiceTimePredictor
from switchyard.prediction.features import ServiceTimeFeatures

__all__ = ["MAX_RELATIVE_ERROR", "MIN_RELATIVE_ERROR", "ExactServiceTime", "NoisyPredictor"]

MIN_RELATIVE_ERROR = -0.9
"""The lowest relative error drawn: a prediction never drops below 10 % of the truth."""
MAX_RELATIVE_ERROR = 3.0
"""The highest relative error drawn: a prediction never exceeds four times the truth."""


class NoisyPredictor:
    """Wraps a predictor and injects multiplicative Gaussian error into its predictions.

    ``error`` is the standard deviation of the relative error, within [0, 1]; a
    :class:`ValueError` names any other value. Draws come from a private
    ``random.Random(seed)``, so one seed gives one sequence of errors and no other code's
    randomness is disturbed. ``fit`` and ``update`` train the wrapped predictor.
    """

    def __init__(self, inner: ServiceTimePredictor, *, error: float, seed: int) -> None:
        if not (0.0 <= error <= 1.0):  # also rejects NaN
            raise ValueError(f"error must be within [0, 1] (0.4 = 40 %), got {error}")
        self.inner = inner
        self.error = error
        self.name = f"{inner.name}+noise{error:g}"
        self._rng = random.Random(seed)

    def predict_s(self, features: ServiceTimeFeatures) -> float:
        """The wrapped prediction times ``1 + e``; exactly the wrapped one when error is 0."""
        predicted = self.inner.predict_s(features)
        if self.error == 0.0:
            return predicted
        relative = self._rng.gauss(0.0, self.error)
        relative = min(max(relative, MIN_RELATIVE_ERROR), MAX_RELATIVE_ERROR)
        return predicted * (1.0 + relative)

    def fit(self, samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
        """Train the wrapped predictor offline."""
        self.inner.fit(samples, service_s)

    def update(self, features: ServiceTimeFeatures, observed_s: float) -> None:
        """One online step of the wrapped predictor."""
        self.inner.update(features, observed_s)


class ExactServiceTime:
    """The clairvoyant predictor: returns the true service time the caller supplies.

    ``service_time_s`` maps a request (on one worker type) to its true service time in
    seconds; negative answers are clipped to 0. Nothing is learnt: ``fit`` and
    ``update`` do nothing.
    """

    name: str = "exact"

    def __init__(self, service_time_s: Callable[[ServiceTimeFeatures], float]) -> None:
        self._service_time_s = service_time_s

    def predict_s(self, features: ServiceTimeFeatures) -> float:
        """The true service time of the request, in seconds."""
        seconds = self._service_time_s(features)
        if not math.isfinite(seconds):
            raise ValueError(f"the true service time must be finite, got {seconds}")
        return seconds if seconds > 0.0 else 0.0

    def fit(self, samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
        """Nothing to learn."""

    def update(self, features: ServiceTimeFeatures, observed_s: float) -> None:
        """Nothing to learn."""
