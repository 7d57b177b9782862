"""The topics Switchyard uses, each bound to the one message type it carries.

All topic names live here. A deployment may prefix them (``SWITCHYARD_TOPIC_PREFIX``) so
that several stacks share a Kafka cluster; the bus applies the prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from switchyard.contracts.base import Message
from switchyard.contracts.messages import (
    AccuracyEstimate,
    Assignment,
    Completion,
    DeadLetter,
    Heartbeat,
    InferenceRequest,
    Migration,
    OutputChunk,
    ServiceTimePrediction,
    WorkerDown,
)

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Topic(Generic[M]):
    """A topic name, the message type it carries, and how a message picks its key.

    The key decides the partition and so the order: messages with the same key are
    delivered in the order they were published.
    """

    name: str
    message_type: type[M]
    key_of: Callable[[M], str]
    description: str = ""


REQUESTS: Topic[InferenceRequest] = Topic(
    "switchyard.requests",
    InferenceRequest,
    lambda m: m.request_id,
    "Accepted client requests (ingress -> predictor, sneakpeek, scheduler).",
)
PREDICTIONS: Topic[ServiceTimePrediction] = Topic(
    "switchyard.predictions",
    ServiceTimePrediction,
    lambda m: m.request_id,
    "Calibrated service-time predictions (predictor -> scheduler).",
)
ESTIMATES: Topic[AccuracyEstimate] = Topic(
    "switchyard.estimates",
    AccuracyEstimate,
    lambda m: m.request_id,
    "SneakPeek accuracy estimates (sneakpeek -> scheduler).",
)
ASSIGNMENTS: Topic[Assignment] = Topic(
    "switchyard.assignments",
    Assignment,
    lambda m: m.worker_id,
    "Scheduling decisions, keyed by worker so each worker's queue stays in order.",
)
MIGRATIONS: Topic[Migration] = Topic(
    "switchyard.migrations",
    Migration,
    lambda m: m.request_id,
    "Rebalancing decisions (rebalancer -> workers).",
)
COMPLETIONS: Topic[Completion] = Topic(
    "switchyard.completions",
    Completion,
    lambda m: m.request_id,
    "Finished requests (workers -> ingress, monitor, predictor).",
)
OUTPUT_CHUNKS: Topic[OutputChunk] = Topic(
    "switchyard.output-chunks",
    OutputChunk,
    lambda m: m.request_id,
    "Streamed LLM output, a few tokens at a time (workers -> the ingress replica that asked).",
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
    PREDICTIONS,
    ESTIMATES,
    ASSIGNMENTS,
    MIGRATIONS,
    COMPLETIONS,
    OUTPUT_CHUNKS,
    HEARTBEATS,
    WORKER_EVENTS,
    DEAD_LETTERS,
)
