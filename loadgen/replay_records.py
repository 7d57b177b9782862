"""The records of a replay: what became of each planned request, and of the whole run.

One :class:`RequestRecord` per planned request, its ``outcome`` one of :data:`OUTCOMES`;
a :class:`ReplayResult` holds them in plan order with the run's settings and the
generator's own CPU cost. Both are frozen. A record round-trips through JSON
(:meth:`RequestRecord.to_json`, :meth:`RequestRecord.from_json`), NaN and infinity
becoming null. :func:`read_number`, :func:`read_timeline` and :func:`read_stages` are the
tolerant readers a saved record and an ingress answer (:mod:`loadgen.replay_answers`) are
both read with: anything that is not a finite number (or, in a stage, a text) is
dropped, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CANCELLED",
    "HTTP_ERROR",
    "NOT_SENT",
    "OK",
    "OUTCOMES",
    "REJECTED",
    "TIMEOUT",
    "TRANSPORT_ERROR",
    "ReplayResult",
    "RequestRecord",
    "read_number",
    "read_stages",
    "read_timeline",
]

OK = "ok"
"""A 2xx answer."""
REJECTED = "rejected"
"""A 429 or 503 answer: the stack shed the request (not retried)."""
HTTP_ERROR = "http_error"
"""Any other non-2xx answer (400, 404, 500, ...)."""
TIMEOUT = "timeout"
"""No answer within the client timeout."""
TRANSPORT_ERROR = "transport_error"
"""The connection failed (refused, reset, protocol error)."""
CANCELLED = "cancelled"
"""Sent, but still unanswered when a stopped replay's grace period ended."""
NOT_SENT = "not_sent"
"""Never sent: the replay was stopped before it was due."""
OUTCOMES = (OK, REJECTED, HTTP_ERROR, TIMEOUT, TRANSPORT_ERROR, CANCELLED, NOT_SENT)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one planned request.

    Times ending in ``_s`` without another reference are seconds after the start of the
    replay on the client's monotonic clock; ``timeline`` is the server's, as sent.

    Attributes:
        index: the request's position in the plan.
        request_id: ``<run id>-<index>``.
        kind: ``llm``, ``classification`` or ``pipeline``.
        app: the OpenAI model, classification application or pipeline.
        workload: the trace row's workload, or ``classification`` or ``pipeline``.
        arrival_s: the trace arrival (seconds after the trace's first row).
        scheduled_s: when it was due: ``(arrival_s - first arrival) / speedup``.
        sent_s: when it actually went out (None: never sent).
        send_lag_s: ``sent_s - scheduled_s``, how far the generator was behind.
        latency_s: client end-to-end latency, from sending to the whole answer read
            (None without an answer).
        status_code: the HTTP status (None without an answer).
        outcome: one of :data:`OUTCOMES`.
        error_type, error_message: from the error body, or the client exception.
        error_code: the error body's ``code`` (``answer_timeout``, ``model_not_found``).
        retry_after_s: the Retry-After header of a rejection, when numeric.
        prompt_tokens, max_tokens: what an LLM request asked for.
        completion_tokens: ``usage.completion_tokens`` of an LLM answer.
        server_status: ``switchyard.status`` of an LLM answer.
        worker_id, worker_type, variant: who served it.
        emulated: whether the worker was a performance model (None: not said).
        deadline_s: the request's deadline as the server states it.
        deadline_met: whether the server met it (None: not said); for a pipeline call,
            the answer's ``met_slo``.
        timeline: the server's ``arrival_s``, ``assigned_s``, ``started_s``,
            ``first_token_s``, ``finished_s`` (numbers only; None when absent).
        label, class_name: a classification answer's prediction.
        true_label: the dataset label of a classification request's features.
        exec_scale: what a pipeline call asked its stages' execution times scaled by.
        slo_s: a pipeline answer's ``slo_s``, the pipeline's objective in seconds from
            the call's arrival (a duration, where ``deadline_s`` is a time).
        server_latency_s: a pipeline answer's ``latency_s``, the call's time at the
            ingress.
        stages: a pipeline answer's ``stages``, each with its text fields (``stage``,
            ``model``, ``worker_id``, ``status``) and finite numbers (its timings).
    """

    index: int
    request_id: str
    kind: str
    app: str
    workload: str
    arrival_s: float
    scheduled_s: float
    sent_s: float | None = None
    send_lag_s: float | None = None
    latency_s: float | None = None
    status_code: int | None = None
    outcome: str = NOT_SENT
    error_type: str | None = None
    error_message: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    completion_tokens: int | None = None
    server_status: str | None = None
    worker_id: str | None = None
    worker_type: str | None = None
    variant: str | None = None
    emulated: bool | None = None
    deadline_s: float | None = None
    deadline_met: bool | None = None
    timeline: Mapping[str, float] | None = None
    label: int | None = None
    class_name: str | None = None
    true_label: int | None = None
    exec_scale: float | None = None
    slo_s: float | None = None
    server_latency_s: float | None = None
    stages: tuple[Mapping[str, str | float], ...] | None = None

    @property
    def answered_ok(self) -> bool:
        """A 2xx answer arrived."""
        return self.outcome == OK

    @property
    def was_sent(self) -> bool:
        """The request went out (whatever became of it)."""
        return self.sent_s is not None

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (NaN and infinity become None)."""
        data = asdict(self)
        data["timeline"] = dict(self.timeline) if self.timeline is not None else None
        data["stages"] = [dict(stage) for stage in self.stages] if self.stages else None
        return {key: _json_number(value) for key, value in data.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """A record from :meth:`to_json`'s dict (unknown keys are ignored).

        Raises:
            KeyError: a required key (``index``, ``request_id``, ...) is missing.
        """
        names = cls.__dataclass_fields__
        kwargs = {key: value for key, value in data.items() if key in names}
        timeline = kwargs.get("timeline")
        kwargs["timeline"] = read_timeline(timeline) if timeline is not None else None
        kwargs["stages"] = read_stages(kwargs.get("stages"))
        return cls(**kwargs)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_number(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [_json_number(inner) for inner in value]
    return value


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of :func:`replay`.

    Attributes:
        run_id: the prefix of every request id.
        target: the base URL requests were sent to.
        speedup: the factor inter-arrival times were divided by.
        timeout_s: the client timeout per request.
        started_at: the wall-clock start, ISO 8601 in UTC.
        duration_s: seconds from the start to the last answer (or to the stop).
        stopped: whether the replay was stopped early (Ctrl-C, the ``stop`` event).
        records: one record per planned request, in plan order.
        cpu_s: CPU seconds this process spent during the replay (the generator's own
            cost; with other work in the process, an upper bound).
    """

    run_id: str
    target: str
    speedup: float
    timeout_s: float
    started_at: str
    duration_s: float
    stopped: bool
    records: list[RequestRecord] = field(default_factory=list)
    cpu_s: float | None = None

    @property
    def cpu_ms_per_request(self) -> float | None:
        """The generator's CPU milliseconds per request it sent (None: none sent)."""
        sent = sum(1 for record in self.records if record.was_sent)
        if self.cpu_s is None or not sent:
            return None
        return self.cpu_s * 1000.0 / sent

    def config(self) -> dict[str, Any]:
        """The settings of the run, for a report's ``config`` section."""
        return {
            "run_id": self.run_id,
            "target": self.target,
            "speedup": self.speedup,
            "timeout_s": self.timeout_s,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "stopped": self.stopped,
            "planned": len(self.records),
            "generator_cpu_s": self.cpu_s,
            "generator_cpu_ms_per_request": self.cpu_ms_per_request,
        }


def read_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite int or float (never a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def read_timeline(value: Any) -> dict[str, float] | None:
    """The finite numbers of a mapping, by key as text; None when it is not a mapping or
    holds none."""
    if not isinstance(value, Mapping):
        return None
    numbers = {str(key): read_number(inner) for key, inner in value.items()}
    kept = {key: number for key, number in numbers.items() if number is not None}
    return kept or None


def read_stages(value: Any) -> tuple[dict[str, str | float], ...] | None:
    """The stages of a pipeline answer: of each mapping in the list ``value``, its text
    fields and finite numbers by key (nested values, nulls and booleans are dropped);
    None when ``value`` is not a list or holds no mapping."""
    if not isinstance(value, list | tuple):
        return None
    stages: list[dict[str, str | float]] = []
    for item in value:
        if not isinstance(item, Mapping):
            continue
        stage: dict[str, str | float] = {}
        for key, inner in item.items():
            if isinstance(inner, str):
                stage[str(key)] = inner
            elif (number := read_number(inner)) is not None:
                stage[str(key)] = number
        stages.append(stage)
    return tuple(stages) or None
