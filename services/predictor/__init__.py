"""The predictor service: service-time predictions and their calibration, learning online."""

from services.predictor.service import PredictorService, create, prediction_key

__all__ = ["PredictorService", "create", "prediction_key"]
