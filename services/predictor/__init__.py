"""The predictor service: learns service times from what ran, publishes its fitted model."""

from services.predictor.service import PredictorService, create

__all__ = ["PredictorService", "create"]
