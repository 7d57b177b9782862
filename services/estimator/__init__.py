"""The estimator service: data-aware accuracy estimates for classification requests."""

from services.estimator.service import EstimatorService, create

__all__ = ["EstimatorService", "create"]
