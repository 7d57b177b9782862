"""What the simulator predicts about each request, as the live predictor and calibrator
do: the predictor trained offline on a sample of the trace and labelled by the
profiles, each request's view with its raw and calibrated predictions and adaptive
deadline, and the online update of both from every completion."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from switchyard.contracts.messages import WorkloadType
from switchyard.perf import PerformanceModel
from switchyard.policies.registry import PredictionUse
from switchyard.policies.snapshot import RequestView
from switchyard.policies.view_builders import new_request_view
from switchyard.prediction import (
    CalibrationState,
    NoisyPredictor,
    ServiceTimeFeatures,
    ServiceTimePredictor,
    calibrated_s,
    make_predictor,
)

from research.llm.config import SimulationConfig
from research.llm.request import LlmTraceRequest, SimRequest

__all__ = ["RequestPredictions"]


class RequestPredictions:
    """One run's predictor, calibration and the request views made with them."""

    def __init__(
        self,
        use: PredictionUse,
        config: SimulationConfig,
        types: Mapping[str, PerformanceModel],
        reference: PerformanceModel,
    ) -> None:
        self.use = use
        self.config = config
        self.types = types
        """The cluster's worker types, each predicted for."""
        self.reference = reference
        """The type whose prediction sets the adaptive deadline (the first profile)."""
        self.model_name = reference.model
        self.predictor: ServiceTimePredictor | None = None
        self._calibration = {name: CalibrationState() for name in types}
        self._constant_s: dict[str, float] = {}

    def train(self, trace: Sequence[LlmTraceRequest]) -> None:
        """Offline training on a random sample of the trace, labelled by the profiles."""
        use = self.use
        if use in (PredictionUse.NONE, PredictionUse.EXACT):
            return
        rng = random.Random(self.config.seed * 31 + 7)
        sample = (
            rng.sample(list(trace), self.config.train_requests)
            if len(trace) > self.config.train_requests
            else list(trace)
        )
        if use is PredictionUse.CONSTANT:
            for name, perf in self.types.items():
                times = [perf.idle_service_s(r.prompt_tokens, r.output_tokens) for r in sample]
                self._constant_s[name] = sum(times) / len(times)
            return
        predictor = make_predictor(self.config.predictor, seed=self.config.seed)
        features: list[ServiceTimeFeatures] = []
        labels: list[float] = []
        for row in sample:
            for name, perf in self.types.items():
                features.append(self._features(row.prompt_tokens, row.workload, name))
                labels.append(perf.idle_service_s(row.prompt_tokens, row.output_tokens))
        predictor.fit(features, labels)
        if self.config.predictor_error > 0:
            predictor = NoisyPredictor(
                predictor, error=self.config.predictor_error, seed=self.config.seed
            )
        self.predictor = predictor

    def view(
        self, index: int, row: LlmTraceRequest, cached_tokens: dict[str, int]
    ) -> tuple[RequestView, dict[str, float], dict[str, ServiceTimeFeatures] | None]:
        """The request as policies see it, its raw predictions, and the predictor's
        features per worker type (kept for its update on completion)."""
        use = self.use
        raw: dict[str, float] = {}
        cal: dict[str, float] = {}
        true_s: dict[str, float] | None = None
        deadline_s: float | None = None
        features: dict[str, ServiceTimeFeatures] | None = None
        predictor = self.predictor
        if use is PredictionUse.CALIBRATED and predictor is not None:
            config = self.config.calibration
            calibration = self._calibration
            features = {}
            for name in self.types:
                features[name] = row_features = self._features(
                    row.prompt_tokens, row.workload, name
                )
                predicted = predictor.predict_s(row_features)
                raw[name] = predicted
                cal[name] = calibrated_s(predicted, calibration[name], config)
            # adaptive_deadline_s of the reference type, from the s~ just computed.
            deadline_s = row.arrival_s + (1.0 + config.eps) * cal[self.reference.name]
        elif use is PredictionUse.CONSTANT:
            raw = dict(self._constant_s)
            cal = raw
            deadline_s = (
                row.arrival_s + (1 + self.config.calibration.eps) * raw[self.reference.name]
            )
        elif use is PredictionUse.EXACT:
            true_s = {
                name: perf.idle_service_s(row.prompt_tokens, row.output_tokens)
                for name, perf in self.types.items()
            }
            raw = cal = true_s
            deadline_s = row.arrival_s + true_s[self.reference.name]
        # RequestView's fields in order (see view_builders: the same object, built faster).
        view = new_request_view(
            f"r{index}",
            row.arrival_s,
            row.prompt_tokens,
            row.workload,
            self.model_name,
            None,  # output_tokens_hint: the trace's output length is not told
            raw,  # predicted_s
            cal,  # calibrated_s
            deadline_s,
            true_s,  # true_service_s
            cached_tokens,
            self.config.token_slos[row.workload].ttft_s,
        )
        return view, raw, features

    def learn(self, request: SimRequest) -> None:
        """Update the calibration and the predictor from a finished request (with
        ``SimulationConfig.online_updates``)."""
        if not self.config.online_updates or self.predictor is None:
            return
        inst_type = request.served_by
        observed_s = request.finished_s - request.started_s
        predicted = request.predicted_s.get(inst_type)
        if predicted is not None:
            self._calibration[inst_type] = self._calibration[inst_type].observe(
                predicted, observed_s, self.config.calibration
            )
        known = request.features
        features = known.get(inst_type) if known is not None else None
        if features is None:
            features = self._features(request.prompt_tokens, request.workload, inst_type)
        self.predictor.update(features, observed_s)

    def _features(
        self, prompt_tokens: int, workload: WorkloadType, worker_type: str
    ) -> ServiceTimeFeatures:
        """What the predictor knows of a request on ``worker_type``: its prompt and
        class, never its output length (the trace's is not told)."""
        return ServiceTimeFeatures(prompt_tokens, workload, self.model_name, worker_type)
