"""The topics Switchyard uses, each bound to the one message type it carries.

All topic names live here. A deployment may prefix them (``SWITCHYARD_TOPIC_PREFIX``) so
that several stacks share a Kafka cluster; the bus applies the prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from switchyard.contracts.base import Message
from switchyard.contracts.dead_letter import DeadLetter
from switchyard.contracts.messages import (
    AccuracyEstimate,
    Assignment,
    ClassificationPayload,
    Completion,
    Heartbeat,
    InferenceRequest,
    Migration,
    OutputChunk,
    PlacementOrder,
    ServiceObservations,
    StagePayload,
    WorkerDown,
)

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True, init=False)
class Topic(Generic[M]):
    """A topic name, the message types it carries, and how a message picks its key.

    The key decides the partition and so the order: messages with the same key are
    delivered in the order they were published. An *addressed* topic is read partition
    by partition, each destination (a worker, an ingress replica) reading one of its
    own: a message goes to the partition of its destination, and its key names the
    destination (so a reader that shares a partition skips the others' messages
    undecoded).

    Args:
        name: the topic's name (before the deployment's prefix).
        message_types: the message type, or the types, it carries (a record's
            ``sy-type`` header says which).
        key_of: a message's key.
        description: one line for ``switchyard topics``.
        addressed: partitioned by destination rather than by key.
    """

    name: str
    message_types: tuple[type[Message], ...]
    key_of: Callable[[M], str]
    description: str
    addressed: bool

    def __init__(
        self,
        name: str,
        message_types: type[M] | tuple[type[Message], ...],
        key_of: Callable[[M], str],
        description: str = "",
        *,
        addressed: bool = False,
    ) -> None:
        types = message_types if isinstance(message_types, tuple) else (message_types,)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "message_types", types)
        object.__setattr__(self, "key_of", key_of)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "addressed", addressed)

    @property
    def type_names(self) -> str:
        """The message types it carries, for messages: ``Completion | OutputChunk``."""
        return " | ".join(t.__name__ for t in self.message_types)


REQUESTS: Topic[InferenceRequest] = Topic(
    "switchyard.requests",
    InferenceRequest,
    lambda m: m.request_id,
    "Accepted LLM requests (ingress -> scheduler).",
)
CLASSIFICATION_REQUESTS: Topic[InferenceRequest] = Topic(
    "switchyard.classification-requests",
    InferenceRequest,
    lambda m: m.request_id,
    "Accepted classification requests (ingress -> scheduler, sneakpeek).",
)
STAGE_REQUESTS: Topic[InferenceRequest] = Topic(
    "switchyard.stage-requests",
    InferenceRequest,
    lambda m: m.request_id,
    "Ready stages of pipeline requests (ingress -> scheduler).",
)


def requests_topic(request: InferenceRequest) -> Topic[InferenceRequest]:
    """Where an accepted request goes: LLM and classification requests travel apart, so
    SneakPeek never fetches an LLM request and the scheduler decides each kind in a
    loop of its own (pipeline stages in a third)."""
    if isinstance(request.payload, ClassificationPayload):
        return CLASSIFICATION_REQUESTS
    if isinstance(request.payload, StagePayload):
        return STAGE_REQUESTS
    return REQUESTS


ESTIMATES: Topic[AccuracyEstimate] = Topic(
    "switchyard.estimates",
    AccuracyEstimate,
    lambda m: m.request_id,
    "SneakPeek accuracy estimates (sneakpeek -> scheduler).",
)


def _inbox_key(message: Assignment | Migration | PlacementOrder) -> str:
    return message.from_worker_id if isinstance(message, Migration) else message.worker_id


WORKER_INBOX: Topic[Assignment | Migration | PlacementOrder] = Topic(
    "switchyard.worker-inbox",
    (Assignment, Migration, PlacementOrder),
    _inbox_key,
    "Assignments (scheduler, a migrating worker), migrations (rebalancer) and placement "
    "orders (placement), each on its worker's own partition.",
    addressed=True,
)


def _answer_key(message: Completion | OutputChunk) -> str:
    return message.reply_to or message.request_id


ANSWERS: Topic[Completion | OutputChunk] = Topic(
    "switchyard.answers",
    (Completion, OutputChunk),
    _answer_key,
    "Finished requests and streamed output (workers, the scheduler -> the ingress replica "
    "that asked), each on that replica's own partition, a request's chunks before its end.",
    addressed=True,
)
OBSERVATIONS: Topic[ServiceObservations] = Topic(
    "switchyard.observations",
    ServiceObservations,
    lambda m: m.worker_id,
    "What finished LLM requests took, batched per worker (workers -> predictor).",
)
HEARTBEATS: Topic[Heartbeat] = Topic(
    "switchyard.heartbeats",
    Heartbeat,
    lambda m: m.worker_id,
    "Worker heartbeats (workers -> monitor).",
)
WORKER_EVENTS: Topic[WorkerDown] = Topic(
    "switchyard.worker-events",
    WorkerDown,
    lambda m: m.worker_id,
    "Workers declared down (monitor -> scheduler, rebalancer).",
)
DEAD_LETTERS: Topic[DeadLetter] = Topic(
    "switchyard.dead-letters",
    DeadLetter,
    lambda m: m.source_topic,
    "Messages that could not be decoded or handled, with the reason and original bytes.",
)

ALL_TOPICS: tuple[Topic[Any], ...] = (
    REQUESTS,
    CLASSIFICATION_REQUESTS,
    STAGE_REQUESTS,
    ESTIMATES,
    WORKER_INBOX,
    ANSWERS,
    OBSERVATIONS,
    HEARTBEATS,
    WORKER_EVENTS,
    DEAD_LETTERS,
)
