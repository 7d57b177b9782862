"""The live predictor: service-time predictions per worker type, calibrated, learning online.

The same predictor and calibration the simulator uses (:mod:`switchyard.prediction`):
a linear model per (model, GPU) pre-trained on the bundled Azure samples labelled by the
performance profiles, then updated from every completion. Worker types are named
``GPU/model`` (``a100-80gb/llama-2-7b``, ``cpu/tiny-lm``): the names the scheduler's
worker views carry.

Time is wall-clock time on the live stack. Emulated workers run ``time_scale`` times
faster than the performance model, so the pre-training labels are divided by it
(``SWITCHYARD_WORKER_TIME_SCALE`` is one setting for the whole stack).

:meth:`LivePredictor.snapshot` gives the fitted model as a :class:`PredictorModel`: what
the scheduler predicts with in-process
(:class:`~switchyard.prediction.snapshot.FittedPredictor`, the same numbers as
:meth:`LivePredictor.predict`), and a checkpoint :meth:`LivePredictor.from_model` resumes
from. :meth:`LivePredictor.observe` learns from a :class:`ServiceObservation`, which
carries the raw prediction the scheduler used, so nothing per request is remembered here.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    PredictorModel,
    ServiceObservation,
    ServiceTimePrediction,
    WorkloadType,
)
from switchyard.perf.profiles import model_profiles, performance_model, profile_names
from switchyard.prediction.base import PredictorNotTrainedError, ServiceTimePredictor
from switchyard.prediction.calibration import (
    CalibrationConfig,
    CalibrationState,
    adaptive_deadline_s,
    calibrated_s,
)
from switchyard.prediction.features import ServiceTimeFeatures
from switchyard.prediction.linear import LinearServiceTimePredictor
from switchyard.prediction.registry import make_predictor
from switchyard.prediction.snapshot import (
    calibration_config_of,
    calibration_states_of,
    linear_state_of,
    predictor_model,
)

PREDICTOR_NAME = "linear"
_REMEMBERED_PREDICTIONS = 100_000  # raw predictions kept to calibrate on completion


def worker_type_name(gpu: str, model: str) -> str:
    """The worker type of a model served on a device: ``GPU/model``."""
    return f"{gpu}/{model}"


def split_worker_type(worker_type: str) -> tuple[str, str]:
    """``(gpu, model)`` of a ``GPU/model`` worker type."""
    gpu, _, model = worker_type.partition("/")
    return gpu, model


@dataclass(frozen=True, slots=True)
class _Made:
    """What a replica remembers of a prediction it made, to learn from the completion."""

    prompt_tokens: int
    workload: WorkloadType
    raw_s: dict[str, float]


@dataclass
class LivePredictor:
    """Predicts, calibrates and learns; one per predictor replica. Not thread-safe.

    Args:
        predictor: the service-time predictor (trained by :meth:`pretrain` or online).
        calibration: the calibration weights.
        known_types: worker types predicted for every request of their model, besides
            those learnt online.
        time_scale: how many times faster than the performance model the workers run
            (what :meth:`pretrained` divided its labels by); carried by :meth:`snapshot`.
    """

    predictor: ServiceTimePredictor
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    known_types: set[str] = field(default_factory=set)
    time_scale: float = 1.0
    _states: dict[str, CalibrationState] = field(default_factory=dict)
    _recent: OrderedDict[str, _Made] = field(default_factory=OrderedDict)
    observed: int = 0
    last_error: tuple[str, float] | None = None
    """``(worker type, |actual - raw prediction| seconds)`` of the last completion that
    fed a calibration state (None until one did); the service's error histogram."""

    @classmethod
    def pretrained(
        cls, time_scale: float, rows: Iterable[tuple[int, int, WorkloadType]] | None = None
    ) -> LivePredictor:
        """A predictor pre-trained on every performance profile.

        ``rows`` are (prompt tokens, output tokens, workload) triples; by default the
        bundled Azure code and conversation samples. Labels are each profile's idle
        service time divided by ``time_scale``.
        """
        if rows is None:
            from switchyard.traces.azure import bundled_mix

            rows = [(r.prompt_tokens, r.output_tokens, r.workload) for r in bundled_mix()]
        rows = list(rows)
        features: list[ServiceTimeFeatures] = []
        labels: list[float] = []
        types: set[str] = set()
        for name in profile_names():
            perf = performance_model(name)
            types.add(worker_type_name(perf.gpu, perf.model))
            for prompt_tokens, output_tokens, workload in rows:
                features.append(
                    ServiceTimeFeatures(
                        prompt_tokens=prompt_tokens,
                        workload=workload,
                        model=perf.model,
                        gpu=perf.gpu,
                    )
                )
                labels.append(perf.idle_service_s(prompt_tokens, output_tokens) / time_scale)
        predictor = make_predictor(PREDICTOR_NAME)
        predictor.fit(features, labels)
        return cls(predictor=predictor, known_types=types, time_scale=time_scale)

    @classmethod
    def from_model(cls, model: PredictorModel) -> LivePredictor:
        """The predictor that published ``model``, restored: it predicts, calibrates and
        learns on exactly as that one would have (see :meth:`snapshot`)."""
        return cls(
            predictor=LinearServiceTimePredictor.from_state(linear_state_of(model)),
            calibration=calibration_config_of(model),
            known_types=set(model.worker_types),
            time_scale=model.time_scale,
            _states=calibration_states_of(model),
            observed=model.observed,
        )

    def snapshot(self, version: int, now_s: float) -> PredictorModel:
        """The fitted model as published at ``now_s`` (epoch seconds) under ``version``.

        Everything learnt goes in: linear updates not yet solved for are folded in first
        (this predictor goes on from the folded model too), so a predictor restored by
        :meth:`from_model` continues exactly as this one. Raw predictions remembered for
        :meth:`learn` are not part of it. A :class:`TypeError` says when the predictor is
        not the linear one, the only one a model can be published for.
        """
        predictor = self.predictor
        if not isinstance(predictor, LinearServiceTimePredictor):
            raise TypeError(
                f"only a linear predictor can be published, this one is {predictor.name!r}"
            )
        return predictor_model(
            version=version,
            published_at_s=now_s,
            time_scale=self.time_scale,
            calibration=self.calibration,
            states=self._states,
            worker_types=self.known_types,
            linear=predictor.export_state(),
            observed=self.observed,
        )

    def types_for(self, model: str) -> list[str]:
        """The worker types that serve ``model``, in a stable order."""
        return sorted(t for t in self.known_types if split_worker_type(t)[1] == model)

    def predict(self, request: InferenceRequest, now_s: float) -> ServiceTimePrediction | None:
        """The prediction for an LLM request (None for other requests). When no worker type
        of its model is known yet, the prediction has empty per-type maps: "none"."""
        payload = request.payload
        if not isinstance(payload, LLMPayload):
            return None
        raw: dict[str, float] = {}
        calibrated: dict[str, float] = {}
        for worker_type in self.types_for(payload.model):
            gpu, model = split_worker_type(worker_type)
            try:
                predicted = self.predictor.predict_s(
                    ServiceTimeFeatures(
                        prompt_tokens=payload.prompt_tokens,
                        workload=payload.workload,
                        model=model,
                        gpu=gpu,
                        output_tokens_hint=payload.output_tokens_hint,
                    )
                )
            except PredictorNotTrainedError:
                continue
            state = self._states.get(worker_type, CalibrationState())
            raw[worker_type] = predicted
            calibrated[worker_type] = calibrated_s(predicted, state, self.calibration)
        self._remember(request.request_id, _Made(payload.prompt_tokens, payload.workload, raw))
        if not raw:
            # Nothing known of this model yet: say so at once, so the scheduler decides
            # without a prediction instead of waiting out its bound for one.
            return ServiceTimePrediction(
                request_id=request.request_id,
                predicted_s=0.0,
                calibrated_s=0.0,
                predictor=PREDICTOR_NAME,
                predicted_at_s=now_s,
            )
        # The reference type (for the single figures and the adaptive deadline) is the
        # slowest one: a deadline every worker type can meet.
        reference = max(raw, key=raw.__getitem__)
        state = self._states.get(reference, CalibrationState())
        return ServiceTimePrediction(
            request_id=request.request_id,
            predicted_s=raw[reference],
            calibrated_s=calibrated[reference],
            deadline_s=request.arrival_s
            + adaptive_deadline_s(raw[reference], state, self.calibration),
            by_worker_type_s=calibrated,
            raw_by_worker_type_s=raw,
            mae_s=state.mae_s,
            mape=state.mape,
            predictor=PREDICTOR_NAME,
            predicted_at_s=now_s,
        )

    def learn(self, completion: Completion) -> bool:
        """Fold one finished LLM request in; returns whether it taught anything.

        Only requests this replica predicted are learnt from (it remembers their
        lengths and raw predictions; with several replicas each learns from its share).
        A failed request, or one without start and finish times, teaches nothing.
        """
        made = self._recent.pop(completion.request_id, None)
        if made is None or completion.status is not CompletionStatus.OK:
            return False
        execution_s = completion.timeline.execution_s()
        if execution_s is None:
            return False
        gpu = completion.worker_type.partition("/")[0]
        model = completion.variant
        return self._learn_from(
            gpu=gpu,
            model=model,
            prompt_tokens=made.prompt_tokens,
            workload=made.workload,
            # What learn() has always done: the hint is not remembered with a prediction.
            output_tokens_hint=None,
            raw_predicted_s=made.raw_s.get(worker_type_name(gpu, model)),
            execution_s=execution_s,
        )

    def observe(self, observation: ServiceObservation) -> bool:
        """Fold one finished LLM request in, as the scheduler reports it; returns whether
        it taught anything.

        The linear model of the observation's GPU (the part of ``worker_type`` before
        the ``/``) serving ``model`` learns ``execution_s``; when ``raw_predicted_s`` is
        given, the calibration of that worker type learns its error and
        :attr:`last_error` is set.
        """
        return self._learn_from(
            gpu=observation.worker_type.partition("/")[0],
            model=observation.model,
            prompt_tokens=observation.prompt_tokens,
            workload=observation.workload,
            output_tokens_hint=observation.output_tokens_hint,
            raw_predicted_s=observation.raw_predicted_s,
            execution_s=observation.execution_s,
        )

    def calibration_state(self, worker_type: str) -> CalibrationState:
        """The running error averages on ``worker_type``."""
        return self._states.get(worker_type, CalibrationState())

    def calibration_states(self) -> dict[str, CalibrationState]:
        """The running error averages of every worker type learnt from so far."""
        return dict(self._states)

    def _learn_from(
        self,
        *,
        gpu: str,
        model: str,
        prompt_tokens: int,
        workload: WorkloadType,
        output_tokens_hint: int | None,
        raw_predicted_s: float | None,
        execution_s: float,
    ) -> bool:
        """The one place where a finished request teaches the model and the calibration."""
        if not (math.isfinite(execution_s) and execution_s >= 0):
            return False
        worker_type = worker_type_name(gpu, model)
        self.known_types.add(worker_type)
        if raw_predicted_s is not None:
            state = self._states.get(worker_type, CalibrationState())
            self._states[worker_type] = state.observe(
                raw_predicted_s, execution_s, self.calibration
            )
            self.last_error = (worker_type, abs(execution_s - raw_predicted_s))
        self.predictor.update(
            ServiceTimeFeatures(
                prompt_tokens=prompt_tokens,
                workload=workload,
                model=model,
                gpu=gpu,
                output_tokens_hint=output_tokens_hint,
            ),
            execution_s,
        )
        self.observed += 1
        return True

    def _remember(self, request_id: str, made: _Made) -> None:
        self._recent[request_id] = made
        if len(self._recent) > _REMEMBERED_PREDICTIONS:
            self._recent.popitem(last=False)


def known_models() -> frozenset[str]:
    """Models with a performance profile (predictable before any completion)."""
    return frozenset(model_profiles())
