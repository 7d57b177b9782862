"""Service-time prediction: features, predictors, error injection and calibration.

A predictor estimates how many seconds a request will take on a worker type
(:class:`ServiceTimeFeatures` in, seconds out), learnt offline from a trace and refined
online from completions: :class:`LinearServiceTimePredictor` (one ridge/RLS model per
model and worker type) and :class:`MlpServiceTimePredictor` (a small torch network,
loaded only when used), both by name through :func:`make_predictor`.
:class:`NoisyPredictor` injects a chosen relative error for experiments and
:class:`ExactServiceTime` is the clairvoyant reference. Calibration pads predictions
by the errors the predictor has been making (``s~ = s^ + beta*MAE + gamma*s^*MAPE``)
and derives the adaptive deadline ``d = (1 + eps)*s~``. :class:`FittedPredictor`
applies a published fitted model (linear weights and calibration) in-process.

Importing this package does not import torch.
"""

from switchyard.prediction.base import (
    MIN_SERVICE_S,
    PredictorNotTrainedError,
    ServiceTimePredictor,
)
from switchyard.prediction.calibration import (
    CalibrationConfig,
    CalibrationState,
    adaptive_deadline_s,
    calibrated_s,
)
from switchyard.prediction.features import WORKLOADS, ServiceTimeFeatures
from switchyard.prediction.linear import LinearServiceTimePredictor
from switchyard.prediction.mlp import MlpServiceTimePredictor
from switchyard.prediction.noise import ExactServiceTime, NoisyPredictor
from switchyard.prediction.registry import (
    UnknownPredictorError,
    make_predictor,
    predictor_names,
)
from switchyard.prediction.snapshot import FittedPredictor, Prediction

__all__ = [
    "MIN_SERVICE_S",
    "WORKLOADS",
    "CalibrationConfig",
    "CalibrationState",
    "ExactServiceTime",
    "FittedPredictor",
    "LinearServiceTimePredictor",
    "MlpServiceTimePredictor",
    "NoisyPredictor",
    "Prediction",
    "PredictorNotTrainedError",
    "ServiceTimeFeatures",
    "ServiceTimePredictor",
    "UnknownPredictorError",
    "adaptive_deadline_s",
    "calibrated_s",
    "make_predictor",
    "predictor_names",
]
