"""The predictor's fitted model, applied in-process: predictions without a round trip.

The predictor service owns learning and calibration and publishes what it has fitted as
a :class:`~switchyard.contracts.messages.PredictorModel` (a few numbers per worker type).
The scheduler and the rebalancer turn it into a :class:`FittedPredictor` and predict
with it synchronously, per request:

    s^ = max(w . x, MIN_SERVICE_S)       per worker type of the request's model
    s~ = s^ + beta*MAE + gamma*s^*MAPE   calibrated
    d  = arrival + (1 + eps)*s~          of the slowest type (the reference)

the very numbers the predictor's own ``predict`` gives for the same state, to the bit
(``w`` and ``x`` as in :mod:`switchyard.prediction.linear`, ``s~`` and ``d`` as in
:mod:`switchyard.prediction.calibration`). Everything the formulas need per worker
type is resolved once in :meth:`FittedPredictor.from_model`, so a prediction is a few
float operations per worker type: no numpy, no I/O, no clock, no randomness.

The helpers at the bottom convert between the message and the library's own states
(:class:`~switchyard.prediction.linear.LinearPredictorState`,
:class:`~switchyard.prediction.calibration.CalibrationState`), in both directions, for
the predictor that publishes the model and restores itself from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from switchyard.contracts.messages import (
    CalibrationSettings,
    LinearKeyWeights,
    LinearModelPart,
    LinearWeights,
    PredictorModel,
    WorkerTypeCalibration,
    WorkloadType,
)
from switchyard.prediction.base import MIN_SERVICE_S
from switchyard.prediction.calibration import CalibrationConfig, CalibrationState
from switchyard.prediction.features import WORKLOADS
from switchyard.prediction.linear import TERM_NAMES, LinearModelState, LinearPredictorState

__all__ = [
    "FittedPredictor",
    "Prediction",
    "calibration_config_of",
    "calibration_states_of",
    "linear_state_of",
    "predictor_model",
]

_COLUMN = {name: index for index, name in enumerate(TERM_NAMES)}
_NO_CALIBRATION = CalibrationState()

_Entry = tuple[str, float, float, float, float, float, dict[WorkloadType, float], float, float]
"""What one worker type's prediction needs, resolved in advance: worker type, the
intercept, prompt, prompt squared, hint and has-hint weights, the weight of each
workload, ``beta*MAE`` and ``MAPE``. A flat tuple: unpacking it is the cheapest read."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """A request's predicted service time on every worker type of its model, seconds.

    ``reference_worker_type`` is the slowest type (None when no worker type of the model
    is known: then the maps are empty); ``deadline_s`` is absolute, the arrival plus the
    adaptive deadline on the reference type; ``mae_s`` and ``mape`` are the reference
    type's running errors.
    """

    raw_by_worker_type_s: Mapping[str, float]
    calibrated_by_worker_type_s: Mapping[str, float]
    reference_worker_type: str | None
    deadline_s: float | None
    mae_s: float
    mape: float

    @property
    def predicted_s(self) -> float:
        """The raw prediction on the reference type (0.0 without one)."""
        reference = self.reference_worker_type
        return 0.0 if reference is None else self.raw_by_worker_type_s[reference]

    @property
    def calibrated_s(self) -> float:
        """The calibrated prediction on the reference type (0.0 without one)."""
        reference = self.reference_worker_type
        return 0.0 if reference is None else self.calibrated_by_worker_type_s[reference]


@dataclass(frozen=True, slots=True)
class FittedPredictor:
    """A published :class:`PredictorModel`, ready to predict with; build it with
    :meth:`from_model`. Immutable: a newer model is a new object."""

    version: int
    time_scale: float
    published_at_s: float
    calibration: CalibrationConfig
    worker_types: frozenset[str]
    _types_by_model: Mapping[str, tuple[str, ...]] = field(repr=False)
    _entries_by_model: Mapping[str, tuple[_Entry, ...]] = field(repr=False)
    _states: Mapping[str, CalibrationState] = field(repr=False)
    _one_plus_eps: float = field(repr=False)

    @classmethod
    def from_model(cls, model: PredictorModel) -> FittedPredictor:
        """Resolve, per worker type, the weights and calibration terms a prediction uses."""
        config = calibration_config_of(model)
        states = calibration_states_of(model)
        linear = linear_state_of(model)
        types_by_model: dict[str, list[str]] = {}
        entries_by_model: dict[str, list[_Entry]] = {}
        for worker_type in model.worker_types:  # sorted, so every tuple below is too
            gpu, _, served = worker_type.partition("/")
            types_by_model.setdefault(served, []).append(worker_type)
            w = linear.coefficients_for(served, gpu)
            if w is None:
                # Nothing learnt at all: the live predictor skips such a type too.
                continue
            state = states.get(worker_type, _NO_CALIBRATION)
            entries_by_model.setdefault(served, []).append(
                (
                    worker_type,
                    w[_COLUMN["intercept"]],
                    w[_COLUMN["prompt_ktok"]],
                    w[_COLUMN["prompt_ktok_sq"]],
                    w[_COLUMN["hint_ktok"]],
                    w[_COLUMN["has_hint"]],
                    {load: w[_COLUMN[f"workload_{load.value}"]] for load in WORKLOADS},
                    config.beta * state.mae_s,
                    state.mape,
                )
            )
        return cls(
            version=model.version,
            time_scale=model.time_scale,
            published_at_s=model.published_at_s,
            calibration=config,
            worker_types=frozenset(model.worker_types),
            _types_by_model={name: tuple(types) for name, types in types_by_model.items()},
            _entries_by_model={name: tuple(entries) for name, entries in entries_by_model.items()},
            _states=states,
            _one_plus_eps=1.0 + config.eps,
        )

    def worker_types_for(self, model_name: str) -> tuple[str, ...]:
        """The worker types that serve ``model_name``, sorted."""
        return self._types_by_model.get(model_name, ())

    def calibration_state(self, worker_type: str) -> CalibrationState:
        """The running errors on ``worker_type`` (a fresh state when it has none)."""
        return self._states.get(worker_type, _NO_CALIBRATION)

    def predict(
        self,
        *,
        prompt_tokens: int,
        workload: WorkloadType,
        model: str,
        output_tokens_hint: int | None,
        arrival_s: float,
    ) -> Prediction:
        """The raw and calibrated service time of a request on each worker type of
        ``model``, and its adaptive deadline; see the module docstring. A
        :class:`ValueError` names a negative token count."""
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
        if output_tokens_hint is not None and output_tokens_hint < 0:
            raise ValueError(f"output_tokens_hint must be >= 0, got {output_tokens_hint}")
        raw: dict[str, float] = {}
        calibrated: dict[str, float] = {}
        entries = self._entries_by_model.get(model)
        if not entries:
            return Prediction(raw, calibrated, None, None, 0.0, 0.0)
        gamma = self.calibration.gamma
        prompt_ktok = prompt_tokens * 1e-3
        reference = entries[0][0]
        slowest_s = -1.0
        # Each expression keeps the operand order of LinearServiceTimePredictor.predict_s
        # and calibrated_s: floating point is not associative, and the scheduler's numbers
        # must be the predictor's to the bit.
        for worker_type, w0, w1, w2, w3, w4, by_workload, beta_mae_s, mape in entries:
            seconds = w0 + prompt_ktok * (w1 + prompt_ktok * w2) + by_workload[workload]
            if output_tokens_hint is not None:
                seconds += w3 * output_tokens_hint * 1e-3 + w4
            if not seconds > MIN_SERVICE_S:
                seconds = MIN_SERVICE_S
            raw[worker_type] = seconds
            calibrated[worker_type] = seconds + beta_mae_s + gamma * seconds * mape
            # Strictly greater: on a tie the first in sorted order stays, as max() does.
            if seconds > slowest_s:
                reference = worker_type
                slowest_s = seconds
        state = self._states.get(reference, _NO_CALIBRATION)
        return Prediction(
            raw,
            calibrated,
            reference,
            arrival_s + self._one_plus_eps * calibrated[reference],
            state.mae_s,
            state.mape,
        )


# -- conversions between the message and the library's states -------------------------


def predictor_model(
    *,
    version: int,
    published_at_s: float,
    time_scale: float,
    calibration: CalibrationConfig,
    states: Mapping[str, CalibrationState],
    worker_types: Iterable[str],
    linear: LinearPredictorState,
    observed: int = 0,
) -> PredictorModel:
    """The message holding a fitted linear predictor and its calibration.

    A :class:`pydantic.ValidationError` names any field the message refuses (a number
    that is not finite, a worker type not named ``GPU/model``).
    """
    return PredictorModel(
        version=version,
        published_at_s=published_at_s,
        time_scale=time_scale,
        observed=observed,
        calibration=CalibrationSettings(
            beta=calibration.beta,
            gamma=calibration.gamma,
            eps=calibration.eps,
            ema_alpha=calibration.ema_alpha,
        ),
        worker_types=tuple(sorted(worker_types)),
        calibration_states={
            worker_type: WorkerTypeCalibration(
                mae_s=state.mae_s,
                mape=state.mape,
                observations=state.observations,
                mape_observations=state.mape_observations,
            )
            for worker_type, state in sorted(states.items())
        },
        linear=LinearModelPart(
            ridge=linear.ridge,
            forgetting=linear.forgetting,
            solve_every=linear.solve_every,
            global_weights=None
            if linear.global_model is None
            else LinearWeights(
                coef=linear.global_model.coef,
                weight=linear.global_model.weight,
                gram=linear.global_model.gram,
                moment=linear.global_model.moment,
            ),
            keys=tuple(
                LinearKeyWeights(
                    model=model,
                    gpu=gpu,
                    coef=state.coef,
                    weight=state.weight,
                    gram=state.gram,
                    moment=state.moment,
                )
                for (model, gpu), state in sorted(linear.keys.items())
            ),
        ),
    )


def calibration_config_of(model: PredictorModel) -> CalibrationConfig:
    """The calibration weights the model was published with."""
    settings = model.calibration
    return CalibrationConfig(
        beta=settings.beta, gamma=settings.gamma, eps=settings.eps, ema_alpha=settings.ema_alpha
    )


def calibration_states_of(model: PredictorModel) -> dict[str, CalibrationState]:
    """The running errors by worker type, exactly as published (counts included)."""
    return {
        worker_type: CalibrationState(
            mae_s=state.mae_s,
            mape=state.mape,
            observations=state.observations,
            mape_observations=state.mape_observations,
        )
        for worker_type, state in model.calibration_states.items()
    }


def linear_state_of(model: PredictorModel) -> LinearPredictorState:
    """The linear predictor's state, for :meth:`LinearServiceTimePredictor.from_state`."""
    part = model.linear
    weights = part.global_weights
    return LinearPredictorState(
        ridge=part.ridge,
        forgetting=part.forgetting,
        solve_every=part.solve_every,
        global_model=None if weights is None else _model_state(weights),
        keys={(key.model, key.gpu): _model_state(key) for key in part.keys},
    )


def _model_state(weights: LinearWeights) -> LinearModelState:
    return LinearModelState(
        coef=weights.coef, weight=weights.weight, gram=weights.gram, moment=weights.moment
    )
