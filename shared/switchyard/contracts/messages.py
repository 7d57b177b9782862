"""Every message that crosses the bus, as pydantic models.

Times are wall-clock epoch seconds (``_s``) stamped by the service that observed the
event, so a completion carries the whole timeline of its request and a latency
breakdown (scheduling, queueing, execution) needs no join. Durations are ``_s`` too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from switchyard.contracts.base import Message
from switchyard.contracts.fields import FLOAT32_MAX as FLOAT32_MAX
from switchyard.contracts.fields import LINEAR_TERMS as LINEAR_TERMS
from switchyard.contracts.fields import FiniteFloat as FiniteFloat
from switchyard.contracts.fields import Float32 as Float32
from switchyard.contracts.fields import Identifier as Identifier
from switchyard.contracts.fields import NonNegativeFiniteFloat as NonNegativeFiniteFloat
from switchyard.contracts.fields import Part as Part
from switchyard.contracts.fields import WorkerTypeName as WorkerTypeName
from switchyard.contracts.fields import WorkloadType as WorkloadType
from switchyard.contracts.placement_messages import PlacedModel as PlacedModel
from switchyard.contracts.placement_messages import PlacedState as PlacedState
from switchyard.contracts.placement_messages import PlacementOrder as PlacementOrder
from switchyard.contracts.prediction_messages import CalibrationSettings as CalibrationSettings
from switchyard.contracts.prediction_messages import LinearKeyWeights as LinearKeyWeights
from switchyard.contracts.prediction_messages import LinearModelPart as LinearModelPart
from switchyard.contracts.prediction_messages import LinearWeights as LinearWeights
from switchyard.contracts.prediction_messages import PredictorModel as PredictorModel
from switchyard.contracts.prediction_messages import ServiceObservation as ServiceObservation
from switchyard.contracts.prediction_messages import ServiceObservations as ServiceObservations
from switchyard.contracts.prediction_messages import (
    ServiceTimePrediction as ServiceTimePrediction,
)
from switchyard.contracts.prediction_messages import (
    WorkerTypeCalibration as WorkerTypeCalibration,
)


class RequestKind(StrEnum):
    LLM = "llm"
    CLASSIFICATION = "classification"
    STAGE = "stage"


class LLMPayload(Part):
    """What an LLM completion request asks for."""

    kind: Literal[RequestKind.LLM] = RequestKind.LLM
    model: Identifier
    prompt_tokens: Annotated[int, Field(ge=1, le=10_000_000)]
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)]
    output_tokens_hint: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="Expected output length when the client knows it."
    )
    workload: WorkloadType = WorkloadType.OTHER
    prompt: str | None = Field(default=None, description="Prompt text, when the client sent text.")
    stream: bool = False
    prefix_blocks: Annotated[
        list[Annotated[int, Field(ge=0, lt=2**63)]], Field(max_length=20_000)
    ] = Field(
        default_factory=list,
        description="Content ids of the prompt's KV blocks of 512 tokens (a leading run "
        "shared with another prompt is a shared prefix; switchyard.perf.prefix_cache).",
    )
    ttft_slo_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="The application's time-to-first-token objective, in the workers' "
        "seconds (divided by an emulation's time scale); what an admission policy judges.",
    )
    choices: Annotated[
        dict[Identifier, Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]],
        Field(max_length=64),
    ] = Field(
        default_factory=dict,
        description="Answer one of these labels instead of free text (a pipeline's judge "
        "stage): a real model answers the label it scores most likely after the prompt, "
        "an emulated worker draws one by these shares of answers (summing to 1).",
    )


class ClassificationPayload(Part):
    """What a classification request asks for: one feature vector for an application."""

    kind: Literal[RequestKind.CLASSIFICATION] = RequestKind.CLASSIFICATION
    features: Annotated[list[Float32], Field(min_length=1, max_length=1_000_000)]


class StagePayload(Part):
    """One stage of a pipeline request: run ``model`` once on the outputs of the stages
    it runs after (``inputs``, by stage name; the intermediate results travel here)."""

    kind: Literal[RequestKind.STAGE] = RequestKind.STAGE
    pipeline: Identifier
    stage: Identifier
    model: Identifier
    exec_scale: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=1.0,
        description="This request's service time relative to the model's mean (a trace "
        "row's execution time over its model's mean).",
    )
    inputs: Annotated[
        dict[Identifier, Annotated[str, Field(max_length=4096)]], Field(max_length=64)
    ] = Field(default_factory=dict)


Payload = Annotated[LLMPayload | ClassificationPayload | StagePayload, Field(discriminator="kind")]


class InferenceRequest(Message):
    """A client's request, accepted by an ingress replica.

    ``deadline_s`` is absolute (epoch seconds); ``reply_to`` names the ingress replica
    waiting for the answer and ``reply_partition`` the partition of the answers topic it
    reads, so the answer (and streamed chunks) go to that replica alone.
    """

    MESSAGE_TYPE = "inference-request"

    request_id: Identifier
    app: Identifier
    payload: Payload
    arrival_s: float = Field(description="When the ingress accepted the request.")
    deadline_s: float | None = None
    priority: Annotated[int, Field(ge=0, le=1000)] = 0
    tenant: Identifier | None = None
    reply_to: Identifier | None = None
    reply_partition: NonNegativeInt | None = Field(
        default=None,
        description="The partition of switchyard.answers the reply_to replica reads.",
    )

    @model_validator(mode="after")
    def _deadline_after_arrival(self) -> InferenceRequest:
        if self.deadline_s is not None and self.deadline_s < self.arrival_s:
            raise ValueError("deadline_s is before arrival_s")
        return self


class AccuracyEstimate(Message):
    """SneakPeek's data-aware estimate for a classification request.

    ``theta`` holds the posterior class frequencies; ``expected_accuracy`` maps each
    model variant to sum_c theta_c * recall_c.
    """

    MESSAGE_TYPE = "accuracy-estimate"

    request_id: Identifier
    app: Identifier
    theta: Annotated[list[NonNegativeFloat], Field(min_length=1)]
    expected_accuracy: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]]
    predicted_label: NonNegativeInt | None = None
    neighbours: NonNegativeInt = 0
    estimated_at_s: float


class DecodeTarget(Part):
    """Where a request's decode phase runs after its prefill (prefill/decode
    disaggregation), and what was predicted of the request there: the hand-off carries
    these predictions, so the decode worker reports its work, and the predictor's
    calibration learns, for its own worker type."""

    worker_id: Identifier
    inbox_partition: NonNegativeInt = Field(
        description="The decode worker's partition of switchyard.worker-inbox (from its "
        "heartbeat), where the hand-off goes."
    )
    predicted_s: NonNegativeFloat | None = None
    predicted_raw_s: NonNegativeFloat | None = None


class Assignment(Message):
    """The scheduler's decision: which worker and model variant serve a request, in what order.

    ``epoch`` grows each time a request is (re)assigned, so a worker and the completion
    handler can drop a stale copy of an older decision.
    """

    MESSAGE_TYPE = "assignment"

    request: InferenceRequest
    worker_id: Identifier
    variant: Identifier
    order: float = Field(description="Position in the worker's queue: lower runs first.")
    policy: Identifier
    epoch: NonNegativeInt = 0
    predicted_s: NonNegativeFloat | None = None
    predicted_raw_s: NonNegativeFloat | None = Field(
        default=None,
        description="The uncalibrated prediction for the chosen worker's type: the worker "
        "reports it with the execution time it measured, and the predictor's calibration "
        "learns from the pair.",
    )
    deadline_s: float | None = None
    assigned_at_s: float
    generated_tokens: NonNegativeInt = Field(
        default=0,
        description="Output tokens already generated elsewhere (a migrated running request, "
        "or one handed on after its prefill): its KV cache comes with it, so the worker "
        "decodes on without prefilling it again.",
    )
    not_before_s: float | None = Field(
        default=None,
        description="The request may not start before this (its KV cache is still in transfer).",
    )
    decode: DecodeTarget | None = Field(
        default=None,
        description="Disaggregated serving: where its decode runs. The worker that "
        "prefills it hands it there, with its KV cache, after the first token. None: it is "
        "decoded where it is prefilled.",
    )
    first_assigned_s: float | None = Field(
        default=None,
        description="When it was first assigned (epoch seconds), for a request moved or "
        "handed on since: its answer's timeline counts its decision from there. None: "
        "assigned_at_s is its first assignment.",
    )
    started_s: float | None = Field(
        default=None,
        description="When its execution began on an earlier worker (epoch seconds): a "
        "running request moved or handed off keeps its start and first token.",
    )
    first_token_s: float | None = Field(
        default=None, description="When its first token came, on an earlier worker."
    )

    @property
    def decided_at_s(self) -> float:
        """When the request was first assigned: its timeline's ``assigned_s``."""
        return self.assigned_at_s if self.first_assigned_s is None else self.first_assigned_s


class Migration(Message):
    """The rebalancer's decision to move a queued or running request to another worker."""

    MESSAGE_TYPE = "migration"

    request_id: Identifier
    from_worker_id: Identifier
    to_worker_id: Identifier
    to_inbox_partition: NonNegativeInt | None = Field(
        default=None,
        description="The target's partition of switchyard.worker-inbox (from its heartbeat), "
        "where the source sends the moved assignment.",
    )
    epoch: NonNegativeInt
    reason: str = Field(max_length=500)
    expected_gain_s: float
    cost_s: NonNegativeFloat
    kv_cache_bytes: NonNegativeInt = 0
    predicted_s: NonNegativeFloat | None = Field(
        default=None,
        description="The request's calibrated prediction on the target's worker type: the "
        "moved assignment carries it, so the target reports its work, and the predictor's "
        "calibration learns, for its own type. None: the source's prediction is kept.",
    )
    predicted_raw_s: NonNegativeFloat | None = Field(
        default=None, description="The uncalibrated prediction on the target's worker type."
    )
    decided_at_s: float


class CompletionStatus(StrEnum):
    OK = "ok"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class RequestTimeline(Part):
    """When each step of a request happened (epoch seconds; None when it did not happen)."""

    arrival_s: float
    assigned_s: float | None = None
    started_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None

    def scheduling_s(self) -> float | None:
        """Arrival to assignment: time spent deciding (and waiting for a prediction)."""
        return None if self.assigned_s is None else self.assigned_s - self.arrival_s

    def queueing_s(self) -> float | None:
        """Assignment to start on the worker: time spent in the worker's queue."""
        if self.assigned_s is None or self.started_s is None:
            return None
        return self.started_s - self.assigned_s

    def execution_s(self) -> float | None:
        """Start to finish on the worker."""
        if self.started_s is None or self.finished_s is None:
            return None
        return self.finished_s - self.started_s


class LLMResult(Part):
    kind: Literal[RequestKind.LLM] = RequestKind.LLM
    output_tokens: NonNegativeInt
    text: str | None = None
    label: Identifier | None = None
    """The label chosen, for a request with ``choices``."""


class ClassificationResult(Part):
    kind: Literal[RequestKind.CLASSIFICATION] = RequestKind.CLASSIFICATION
    label: NonNegativeInt
    probabilities: list[NonNegativeFloat] = Field(default_factory=list)


class StageResult(Part):
    """What one pipeline stage produced: ``output`` is handed to the stages after it.
    From an emulated worker it is a placeholder naming the model and the request."""

    kind: Literal[RequestKind.STAGE] = RequestKind.STAGE
    model: Identifier
    output: str = Field(default="", max_length=4096)
    label: Identifier | None = None
    """A classifier stage's answer, which conditional stages after it branch on."""


Result = Annotated[LLMResult | ClassificationResult | StageResult, Field(discriminator="kind")]


class Completion(Message):
    """A worker's report that it finished (or gave up on) a request.

    ``emulated`` is True when the backend spent modelled time instead of running a model:
    such latencies are a performance model's output, not a measurement.
    """

    MESSAGE_TYPE = "completion"

    request_id: Identifier
    app: Identifier
    worker_id: Identifier
    worker_type: Identifier
    variant: Identifier
    epoch: NonNegativeInt = 0
    status: CompletionStatus
    result: Result | None = None
    error: str | None = Field(default=None, max_length=2000)
    timeline: RequestTimeline
    deadline_s: float | None = None
    emulated: bool = False
    reply_to: Identifier | None = None


class ResourceVector(Part):
    """CPU cores, GPU share (1.0 = one whole GPU) and memory in bytes."""

    cpu: NonNegativeFloat = 0.0
    gpu: NonNegativeFloat = 0.0
    mem_bytes: NonNegativeInt = 0


class QueuedEntry(Part):
    """One request a worker holds (waiting or running), as its heartbeat lists it."""

    request_id: Identifier
    app: Identifier
    running: bool
    epoch: NonNegativeInt = 0
    queued_at_s: float
    prompt_tokens: NonNegativeInt = 0
    generated_tokens: NonNegativeInt = 0
    kv_tokens: NonNegativeInt = 0
    remaining_s: NonNegativeFloat = 0.0
    """The worker's own estimate of the service time it still needs."""
    workload: WorkloadType = WorkloadType.OTHER
    output_tokens_hint: NonNegativeInt | None = None
    arrival_s: float | None = Field(default=None, description="When the ingress accepted it.")
    deadline_s: float | None = Field(default=None, description="Its deadline (absolute).")


class Heartbeat(Message):
    """A worker's periodic report of its queue, load and resources.

    ``queue_length`` counts waiting requests, ``running`` those in the running batch.
    ``profile`` names the performance profile (``GPU/model``) of an LLM worker; the
    scheduler reads the profile's constants from it. ``outstanding`` lists every request
    the worker holds (running first, then waiting in queue order), capped at
    ``MAX_LISTED``; ``outstanding_total`` says how many there really are.
    """

    MESSAGE_TYPE = "heartbeat"
    MAX_LISTED: ClassVar[int] = 256

    worker_id: Identifier
    worker_type: Identifier
    sequence: NonNegativeInt
    interval_s: Annotated[float, Field(gt=0)]
    queue_length: NonNegativeInt
    queued_work_s: NonNegativeFloat
    predicted_work_s: NonNegativeFloat | None = Field(
        default=None,
        description="The held work as the scheduler predicted it: each waiting request's "
        "assignment predicted_s, each running one's less the idle work it has done. "
        "What scheduling policies see (as in the simulator); queued_work_s is the "
        "backend's own estimate. None: no assignment carried a prediction.",
    )
    running: NonNegativeInt
    utilization: Annotated[float, Field(ge=0.0, le=1.0)]
    resident_models: list[Identifier] = Field(default_factory=list)
    servable_models: list[Identifier] = Field(
        default_factory=list,
        description="Models this worker can serve (loading them first when not resident).",
    )
    backend: Identifier | None = None
    profile: Identifier | None = None
    max_slots: NonNegativeInt = 0
    kv_used_tokens: NonNegativeInt = 0
    kv_capacity_tokens: NonNegativeInt = 0
    queued_tokens: NonNegativeInt = 0
    decode_step_s: NonNegativeFloat = 0.0
    prefill_share: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        default=0.0,
        description="An LLM worker's recent share of its busy time spent prefilling "
        "(smoothed over about a second): how much of the time its running batch's decode "
        "is paused, or slowed, by newcomers' prompts. 0: unknown, idle or none.",
    )
    chunked_prefill_tokens: PositiveInt | None = Field(
        default=None,
        description="An LLM worker that prefills in chunks: the tokens one iteration "
        "processes (vLLM's max_num_batched_tokens). None: whole prompts.",
    )
    prefilling_tokens: NonNegativeInt = Field(
        default=0,
        description="Prompt tokens of the whole-prompt prefill iteration in progress "
        "(counted in running and kv_used_tokens): a request queued behind it starts when "
        "it ends. 0: none, prefills in chunks, or not reported.",
    )
    outstanding: list[QueuedEntry] = Field(default_factory=list)
    outstanding_total: NonNegativeInt = 0
    draining: bool = Field(
        default=False,
        description="The worker was told to stop: it takes no new work and finishes what "
        "runs, heartbeating meanwhile; its last heartbeat has running == 0.",
    )
    time_scale: Annotated[float, Field(gt=0)] = Field(
        default=1.0,
        description=(
            "An emulated worker runs this many times faster than its performance model: its "
            "times (queued work, decode step) are wall seconds, the profile's constants "
            "divided by this."
        ),
    )
    capacity: ResourceVector = Field(default_factory=ResourceVector)
    free: ResourceVector = Field(default_factory=ResourceVector)
    kv_cache_free_bytes: NonNegativeInt | None = None
    emulated: bool = False
    placed: list[PlacedModel] = Field(
        default_factory=list,
        description="The multi-model catalogue's models placed on this worker (an "
        "emulated-models worker), loading, ready or draining; what placement decides on.",
    )
    speed: Annotated[float, Field(gt=0)] = Field(
        default=1.0,
        description="Service-time divisor relative to the reference GPU (placement).",
    )
    gpu_type: Identifier | None = None
    inbox_partition: NonNegativeInt | None = Field(
        default=None,
        description="The partition of switchyard.worker-inbox this worker reads: where "
        "its assignments and migrations go.",
    )
    role: Literal["mixed", "prefill", "decode"] = Field(
        default="mixed",
        description="What this LLM worker runs (prefill/decode disaggregation): mixed, both "
        "phases; prefill, new requests' prompts, each handed on with its KV cache after its "
        "first token; decode, only requests handed to it with their KV cache.",
    )
    inbox_read_through_s: float | None = Field(
        default=None,
        description="Wall seconds by which this worker had taken in every record its inbox "
        "partition held (started, queued or refused each); None until it has caught up "
        "once. The monitor judges an assignment it does not list as lost only against this.",
    )
    sent_at_s: float


class OutputChunk(Message):
    """Part of a streamed LLM answer: the tokens a worker generated since its last chunk.

    Published only for requests with ``stream`` set; ``index`` counts from 0 per request
    and epoch, so the ingress can drop repeats after a redelivery. The final answer is
    still the :class:`Completion`.
    """

    MESSAGE_TYPE = "output-chunk"

    request_id: Identifier
    epoch: NonNegativeInt = 0
    index: NonNegativeInt
    text: str = ""
    tokens: NonNegativeInt
    reply_to: Identifier | None = None
    emulated: bool = False
    sent_at_s: float


class WorkerDown(Message):
    """The monitor's verdict that a worker stopped sending heartbeats, is leaving on
    purpose, or has left; or that a live one was sent requests it never received.

    ``reason``:

    - ``heartbeat-timeout``: silent for longer than the timeout; everything it held
      (``orphaned_request_ids``, and whatever its assigned set still names) is re-assigned.
    - ``draining``: it was told to stop and finishes what runs there (it keeps sending
      heartbeats meanwhile). What only waited there when it began is listed, to start
      elsewhere now rather than after the running work.
    - ``drained``: its last heartbeat; nothing runs there any more and what it still held
      is listed.
    - ``unclaimed``: the worker is alive, but ``orphaned_request_ids`` were assigned to it
      and never reached it: its heartbeats, sent well after, do not list them and it never
      started them. The monitor took them back (:meth:`RequestLedger.disown_many
      <switchyard.lifecycle.RequestLedger.disown_many>`) for the scheduler to re-assign;
      the worker stays in service.

    ``held_request_ids`` (draining and drained only) is what the worker's heartbeat listed
    as waiting there, when that list was complete: a request assigned to it that is not in
    the list and that it took in ran, or runs, there, and must not run again elsewhere.
    None when the worker's holdings are not known (a death, or a list cut short).
    """

    MESSAGE_TYPE = "worker-down"

    worker_id: Identifier
    reason: Literal["heartbeat-timeout", "draining", "drained", "failed", "unclaimed"]
    last_heartbeat_s: float | None = None
    detected_at_s: float
    orphaned_request_ids: list[Identifier] = Field(default_factory=list)
    held_request_ids: list[Identifier] | None = None
