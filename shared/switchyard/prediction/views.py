"""The policies' view of an LLM request with its prediction: built here, once.

The live scheduler (a request it places) and the rebalancer (a request a worker lists)
describe a request by the same fields and predict it with the same fitted model
(:class:`~switchyard.prediction.snapshot.FittedPredictor`); this builds the
:class:`~switchyard.policies.snapshot.RequestView` a policy sees, so both see a request
the same way. Pure.

Without a prediction (the policy reads none, or no model was published yet) the maps are
empty, which every predictive policy treats as "decide without", and the deadline is the
request's own (the client's, or its application's SLO); with one, the deadline is the
prediction's adaptive deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.contracts.messages import WorkloadType
from switchyard.policies.registry import PredictionUse
from switchyard.policies.snapshot import RequestView
from switchyard.prediction.snapshot import FittedPredictor, Prediction


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmRequestFacts:
    """What is known of an LLM request before it runs, wherever it is seen."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    workload: WorkloadType
    model: str
    output_tokens_hint: int | None = None
    deadline_s: float | None = None
    """The request's own deadline (absolute), used when there is no prediction."""
    ttft_slo_s: float | None = None
    """Its time-to-first-token objective, seconds from arrival (None: none)."""


def predict(
    facts: LlmRequestFacts, predictor: FittedPredictor | None, use: PredictionUse
) -> Prediction | None:
    """The prediction a policy with ``use`` reads for the request (None: none)."""
    if predictor is None or use is PredictionUse.NONE:
        return None
    return predictor.predict(
        prompt_tokens=facts.prompt_tokens,
        workload=facts.workload,
        model=facts.model,
        output_tokens_hint=facts.output_tokens_hint,
        arrival_s=facts.arrival_s,
    )


def request_view(facts: LlmRequestFacts, prediction: Prediction | None) -> RequestView:
    """The policy's view of the request with ``prediction`` (see the module docstring)."""
    if prediction is None or prediction.reference_worker_type is None:
        return RequestView(
            request_id=facts.request_id,
            arrival_s=facts.arrival_s,
            prompt_tokens=facts.prompt_tokens,
            workload=facts.workload,
            model=facts.model,
            output_tokens_hint=facts.output_tokens_hint,
            deadline_s=facts.deadline_s,
            ttft_slo_s=facts.ttft_slo_s,
        )
    return RequestView(
        request_id=facts.request_id,
        arrival_s=facts.arrival_s,
        prompt_tokens=facts.prompt_tokens,
        workload=facts.workload,
        model=facts.model,
        output_tokens_hint=facts.output_tokens_hint,
        predicted_s=prediction.raw_by_worker_type_s,
        calibrated_s=prediction.calibrated_by_worker_type_s,
        deadline_s=prediction.deadline_s if prediction.deadline_s is not None else facts.deadline_s,
        ttft_slo_s=facts.ttft_slo_s,
    )
