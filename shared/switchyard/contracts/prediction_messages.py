"""The predictor's messages: service-time predictions, the observations it learns from,
and the fitted model it publishes (re-exported by :mod:`switchyard.contracts.messages`)."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, field_validator, model_validator

from switchyard.contracts.base import Message
from switchyard.contracts.fields import (
    LINEAR_TERMS,
    FiniteFloat,
    Identifier,
    NonNegativeFiniteFloat,
    Part,
    WorkerTypeName,
    WorkloadType,
)


class ServiceTimePrediction(Message):
    """The predictor's estimate of a request's service time, with its calibration.

    ``calibrated_s = predicted_s + beta*mae_s + gamma*predicted_s*mape`` and the adaptive
    deadline is ``(1 + eps) * calibrated_s`` after arrival.
    """

    MESSAGE_TYPE = "service-time-prediction"

    request_id: Identifier
    predicted_s: NonNegativeFloat
    calibrated_s: NonNegativeFloat
    deadline_s: float | None = None
    by_worker_type_s: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="Calibrated service time per worker type."
    )
    raw_by_worker_type_s: dict[str, NonNegativeFloat] = Field(
        default_factory=dict, description="Uncalibrated prediction per worker type."
    )
    mae_s: NonNegativeFloat = 0.0
    mape: NonNegativeFloat = 0.0
    predictor: Identifier
    predicted_at_s: float


class ServiceObservation(Part):
    """One LLM request that ran: what it was, where, what was predicted, what it took.

    The predictor learns from it: ``execution_s`` trains the linear model of the GPU of
    ``worker_type`` serving ``model``, and ``raw_predicted_s`` (the uncalibrated
    prediction the scheduler used for that worker type, when it had one) feeds that
    worker type's calibration errors.
    """

    worker_type: WorkerTypeName
    model: Identifier = Field(description="The model variant that served the request.")
    prompt_tokens: Annotated[int, Field(ge=1, le=10_000_000)]
    workload: WorkloadType
    output_tokens_hint: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    raw_predicted_s: NonNegativeFiniteFloat | None = None
    execution_s: NonNegativeFiniteFloat = Field(description="Start to finish on the worker.")


class ServiceObservations(Message):
    """A batch of :class:`ServiceObservation` of requests that finished, for the predictor."""

    MESSAGE_TYPE = "service-observations"
    MAX_OBSERVATIONS: ClassVar[int] = 10_000

    worker_id: Identifier
    observations: Annotated[
        list[ServiceObservation], Field(min_length=1, max_length=MAX_OBSERVATIONS)
    ]
    sent_at_s: FiniteFloat


class CalibrationSettings(Part):
    """The calibration weights (``switchyard.prediction.CalibrationConfig``)."""

    beta: NonNegativeFiniteFloat
    gamma: NonNegativeFiniteFloat
    eps: NonNegativeFiniteFloat
    ema_alpha: Annotated[float, Field(gt=0, le=1)]


class WorkerTypeCalibration(Part):
    """The running errors on one worker type (``switchyard.prediction.CalibrationState``)."""

    mae_s: NonNegativeFiniteFloat
    mape: NonNegativeFiniteFloat
    observations: NonNegativeInt
    mape_observations: NonNegativeInt

    @model_validator(mode="after")
    def _mape_counts_a_subset(self) -> WorkerTypeCalibration:
        if self.mape_observations > self.observations:
            raise ValueError(
                f"mape_observations ({self.mape_observations}) exceeds observations "
                f"({self.observations}): every observation that feeds the MAPE feeds the MAE"
            )
        return self


_Coefficients = Annotated[
    tuple[FiniteFloat, ...], Field(min_length=LINEAR_TERMS, max_length=LINEAR_TERMS)
]
_Gram = Annotated[
    tuple[FiniteFloat, ...],
    Field(min_length=LINEAR_TERMS * LINEAR_TERMS, max_length=LINEAR_TERMS * LINEAR_TERMS),
]


class LinearWeights(Part):
    """One linear model: its solution and the normal equations it solves, ``gram w = moment``.

    ``coef`` is what predictions use; ``gram`` (row-major, ``LINEAR_TERMS`` squared) and
    ``moment`` are what online learning goes on from; ``weight`` is the effective
    (discounted) number of samples behind them.
    """

    coef: _Coefficients
    weight: NonNegativeFiniteFloat
    gram: _Gram
    moment: _Coefficients


class LinearKeyWeights(LinearWeights):
    """The linear model of one (model, GPU) key."""

    model: Identifier
    gpu: Identifier


class LinearModelPart(Part):
    """Everything a linear predictor learnt, with the settings it learns by."""

    MAX_KEYS: ClassVar[int] = 10_000

    ridge: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    forgetting: Annotated[float, Field(gt=0, le=1)]
    solve_every: Annotated[int, Field(ge=1)]
    global_weights: LinearWeights | None = Field(
        default=None, description="The model learnt from every sample; None before any."
    )
    keys: Annotated[tuple[LinearKeyWeights, ...], Field(max_length=MAX_KEYS)] = ()

    @field_validator("keys")
    @classmethod
    def _one_model_per_key(cls, keys: tuple[LinearKeyWeights, ...]) -> tuple[LinearKeyWeights, ...]:
        seen: set[tuple[str, str]] = set()
        for key in keys:
            pair = (key.model, key.gpu)
            if pair in seen:
                raise ValueError(f"two models for key (model={key.model!r}, gpu={key.gpu!r})")
            seen.add(pair)
        return keys


class PredictorModel(Message):
    """The predictor's fitted model: what the scheduler and the rebalancer predict with.

    Published periodically by the predictor service, which keeps learning and
    calibrating; applied in-process by ``switchyard.prediction.snapshot.FittedPredictor``.
    It is also a complete checkpoint: a predictor restored from it (normal equations,
    calibration counts and all) learns on exactly as the one that published it.
    ``version`` grows with every publication, so a reader keeps the newest it has seen.
    """

    MESSAGE_TYPE = "predictor-model"
    MAX_WORKER_TYPES: ClassVar[int] = 10_000

    predictor: Literal["linear"] = "linear"
    version: NonNegativeInt
    time_scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        description="Emulated workers run this many times faster than the performance "
        "model; the model was trained for that (SWITCHYARD_WORKER_TIME_SCALE)."
    )
    published_at_s: FiniteFloat
    observed: NonNegativeInt = Field(default=0, description="Completions learnt from online.")
    calibration: CalibrationSettings
    worker_types: Annotated[tuple[WorkerTypeName, ...], Field(max_length=MAX_WORKER_TYPES)] = Field(
        description="Every worker type predicted for, sorted."
    )
    calibration_states: Annotated[
        dict[WorkerTypeName, WorkerTypeCalibration], Field(max_length=MAX_WORKER_TYPES)
    ] = Field(default_factory=dict, description="Running errors by worker type; absent: none yet.")
    linear: LinearModelPart

    @field_validator("worker_types")
    @classmethod
    def _sorted_and_unique(cls, worker_types: tuple[str, ...]) -> tuple[str, ...]:
        ordered = tuple(sorted(worker_types))
        twice = sorted({a for a, b in pairwise(ordered) if a == b})
        if twice:
            raise ValueError(f"worker types listed more than once: {', '.join(twice)}")
        return ordered
