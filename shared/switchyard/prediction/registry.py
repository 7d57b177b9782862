"""Service-time predictors by name, as experiment configurations and services name them."""

from __future__ import annotations

from collections.abc import Callable

from switchyard.prediction.base import ServiceTimePredictor
from switchyard.prediction.linear import LinearServiceTimePredictor
from switchyard.prediction.mlp import MlpServiceTimePredictor

__all__ = ["UnknownPredictorError", "make_predictor", "predictor_names"]


class UnknownPredictorError(ValueError):
    """A predictor name that is not registered; the message lists the known ones."""


_FACTORIES: dict[str, Callable[[int], ServiceTimePredictor]] = {
    "linear": lambda seed: LinearServiceTimePredictor(),
    "mlp": lambda seed: MlpServiceTimePredictor(seed=seed),
}


def predictor_names() -> list[str]:
    """Every registered predictor name, sorted."""
    return sorted(_FACTORIES)


def make_predictor(name: str, *, seed: int = 0) -> ServiceTimePredictor:
    """A fresh, untrained predictor of that name; ``seed`` fixes any randomness it has."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise UnknownPredictorError(
            f"unknown predictor {name!r}; known: {', '.join(predictor_names())}"
        )
    return factory(seed)
