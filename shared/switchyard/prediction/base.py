"""The contract every service-time predictor keeps.

A predictor is trained offline from a trace (:meth:`ServiceTimePredictor.fit`: features
and the observed service seconds), then refined online from each completion
(:meth:`ServiceTimePredictor.update`). :meth:`ServiceTimePredictor.predict_s` is called
once per request per worker type in the simulator's event loop, so implementations keep
it cheap: plain Python floats, no tensor library on the way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from switchyard.prediction.features import ServiceTimeFeatures

__all__ = [
    "MIN_SERVICE_S",
    "PredictorNotTrainedError",
    "ServiceTimePredictor",
    "check_observation",
    "check_training_set",
]

MIN_SERVICE_S = 1e-3
"""The floor of every learnt prediction, in seconds. A regression can extrapolate below
zero for tiny prompts; a scheduler that sums predicted work needs positive durations."""


class PredictorNotTrainedError(RuntimeError):
    """A prediction was asked of a predictor that has learnt nothing yet."""


@runtime_checkable
class ServiceTimePredictor(Protocol):
    """Predicts a request's service time in seconds on one worker type."""

    name: str
    """Short name used in registries, reports and experiment labels (``"linear"``)."""

    def predict_s(self, features: ServiceTimeFeatures) -> float:
        """Expected service time in seconds (>= 0) of the request on ``features.gpu``.

        Raises :class:`PredictorNotTrainedError` when nothing at all has been learnt.
        """
        ...

    def fit(self, samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
        """Offline training on ``samples`` labelled with observed ``service_s`` (seconds).

        Replaces whatever was learnt before. A :class:`ValueError` names a length mismatch
        or a label that is negative or not finite.
        """
        ...

    def update(self, features: ServiceTimeFeatures, observed_s: float) -> None:
        """One online learning step from a completion that took ``observed_s`` seconds."""
        ...


def check_training_set(samples: Sequence[ServiceTimeFeatures], service_s: Sequence[float]) -> None:
    """Raise :class:`ValueError` unless the labels match the samples and are valid seconds."""
    if len(samples) != len(service_s):
        raise ValueError(
            f"fit needs one service time per sample, got {len(samples)} samples "
            f"and {len(service_s)} service times"
        )
    for index, seconds in enumerate(service_s):
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"service_s[{index}] must be finite and >= 0, got {seconds}")


def check_observation(observed_s: float) -> None:
    """Raise :class:`ValueError` unless ``observed_s`` is a valid duration in seconds."""
    if not (math.isfinite(observed_s) and observed_s >= 0):
        raise ValueError(f"observed_s must be finite and >= 0, got {observed_s}")
