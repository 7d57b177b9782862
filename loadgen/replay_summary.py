"""What a replay measured: counts, latency percentiles, SLO violations, goodput and the
server-side latency breakdown, as a :class:`Summary` of the whole replay or of one
application.

Everything here is a pure function of a list of
:class:`~loadgen.replay_records.RequestRecord` (and, for rates, the replay's duration),
so it can be checked on hand-built records and re-run on the ``requests`` of a saved
JSON file.

Definitions (also in ``docs``-facing help):

- **sent**: requests that went out; **answered_ok**: 2xx answers.
- **errors_by_status**: every non-2xx answer by status code (429 and 503 included);
  **rejected**: the 429 and 503 answers among them; **http_errors**: the other non-2xx
  answers; **timeouts** and **transport_errors**: no answer at all.
- **latency**: client end-to-end latency (send to whole answer read) of 2xx answers.
  TTFT and TPOT below are the server's (answers are read whole).
- **SLO violation**: a 2xx answer with ``deadline_met`` false (for a pipeline call, the
  answer's ``met_slo`` false), or any request that got no 2xx answer (error, rejection,
  timeout, transport error). A 2xx answer that does not say whether its deadline was
  met is not judged (``deadline_unknown``); the rate is violations over judged
  requests. Requests cancelled by a stop are not judged.
- **goodput_rps**: 2xx answers with ``deadline_met`` true per second of replay (from
  the start to the last answer); **throughput_rps** counts every 2xx answer.
- **breakdown** (2xx answers carrying a server timeline, which pipeline calls lack; each
  component over the answers that have both of its fields): scheduling =
  ``assigned_s - arrival_s``, queueing = ``started_s - assigned_s``, execution =
  ``finished_s - started_s``, overhead = client latency - execution (the control
  plane, the network and the worker's own queue), control plane = client latency -
  (``finished_s - assigned_s``) (what the request spent anywhere but at its worker: the
  ingress, the bus, the scheduler, the answer's way back).
- **TTFT and TPOT** (LLM 2xx answers whose server timeline has ``first_token_s`` and
  ``finished_s``): TTFT = ``first_token_s - arrival_s`` at the server (the client's own
  wait adds the ingress and the network), TPOT = ``(finished_s - first_token_s) /
  (completion_tokens - 1)`` (:mod:`switchyard.slo`). **token_slo_attainment**: the
  share of LLM requests whose answer met the TTFT and TPOT objectives of its workload
  class (``DEFAULT_TOKEN_SLOS``), over the LLM requests judged as SLO violations are
  (an LLM request with no 2xx answer is a miss; a 2xx answer without the timeline
  fields is not judged); **token_goodput_rps**: those answers per second of replay.
- **emulated_share**: the share of 2xx answers with ``emulated`` true. Their latencies
  are a performance model's output, not measurements, and the table says so.
- **send lag**: how late the generator sent requests against its schedule.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from switchyard.contracts.fields import WorkloadType
from switchyard.slo import DEFAULT_TOKEN_SLOS, judge, time_per_output_token_s
from switchyard.stats import quantile

from loadgen.replay_records import (
    CANCELLED,
    HTTP_ERROR,
    NOT_SENT,
    OK,
    REJECTED,
    TIMEOUT,
    TRANSPORT_ERROR,
    RequestRecord,
)

__all__ = [
    "BREAKDOWN_COMPONENTS",
    "Component",
    "Summary",
    "breakdown",
    "per_app_summaries",
    "summarize",
]

BREAKDOWN_COMPONENTS = ("scheduling", "queueing", "execution", "overhead", "control_plane")


@dataclass(frozen=True, slots=True)
class Component:
    """One part of the latency breakdown: median and P99 in seconds over ``count``
    answers (None when no answer had the fields)."""

    p50_s: float | None
    p99_s: float | None
    count: int


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures of a replay, or of one application of it (see the module docs)."""

    planned: int
    sent: int
    not_sent: int
    answered_ok: int
    errors_by_status: dict[str, int]
    rejected: int
    http_errors: int
    timeouts: int
    transport_errors: int
    cancelled: int
    duration_s: float
    throughput_rps: float | None
    goodput_rps: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    latency_mean_s: float | None
    latency_max_s: float | None
    slo_judged: int
    slo_violations: int
    slo_violation_rate: float | None
    deadline_unknown: int
    emulated_answers: int
    emulated_share: float | None
    send_lag_p50_s: float | None
    send_lag_p99_s: float | None
    send_lag_max_s: float | None
    breakdown: dict[str, Component] = field(default_factory=dict)
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    token_slo_judged: int = 0
    token_slo_attainment: float | None = None
    token_goodput_rps: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (``breakdown`` nested by component)."""
        document: dict[str, Any] = json_ready(asdict(self))
        return document


def json_ready(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in mappings, lists and
    tuples) made None, mapping keys made text and tuples made lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(key): json_ready(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(inner) for inner in value]
    return value


def _q(values: Sequence[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _rate(count: int, duration_s: float) -> float | None:
    return count / duration_s if duration_s > 0 and math.isfinite(duration_s) else None


def _difference(record: RequestRecord, later: str, earlier: str) -> float | None:
    timeline = record.timeline
    if timeline is None or later not in timeline or earlier not in timeline:
        return None
    return timeline[later] - timeline[earlier]


def _component_values(record: RequestRecord) -> dict[str, float | None]:
    execution = _difference(record, "finished_s", "started_s")
    overhead = (
        record.latency_s - execution
        if record.latency_s is not None and execution is not None
        else None
    )
    at_worker = _difference(record, "finished_s", "assigned_s")
    control_plane = (
        record.latency_s - at_worker
        if record.latency_s is not None and at_worker is not None
        else None
    )
    return {
        "scheduling": _difference(record, "assigned_s", "arrival_s"),
        "queueing": _difference(record, "started_s", "assigned_s"),
        "execution": execution,
        "overhead": overhead,
        "control_plane": control_plane,
    }


def breakdown(records: Sequence[RequestRecord]) -> dict[str, Component]:
    """Median and P99 of each :data:`BREAKDOWN_COMPONENTS` over the 2xx answers that
    carry both timeline fields it needs (overhead also needs the client latency)."""
    values: dict[str, list[float]] = {name: [] for name in BREAKDOWN_COMPONENTS}
    for record in records:
        if record.outcome != OK or record.timeline is None:
            continue
        for name, value in _component_values(record).items():
            if value is not None:
                values[name].append(value)
    return {
        name: Component(p50_s=_q(found, 0.5), p99_s=_q(found, 0.99), count=len(found))
        for name, found in values.items()
    }


def is_violation(record: RequestRecord) -> bool | None:
    """Whether ``record`` violates its SLO: True, False, or None when it is not judged
    (never sent, cancelled by a stop, or a 2xx answer silent about its deadline)."""
    if record.outcome in (NOT_SENT, CANCELLED):
        return None
    if record.outcome == OK:
        return None if record.deadline_met is None else not record.deadline_met
    return True


@dataclass(frozen=True, slots=True)
class _TokenFigures:
    ttfts_s: list[float]
    tpots_s: list[float]
    judged: int
    met: int


def _token_times(record: RequestRecord) -> tuple[float, float | None] | None:
    """Server-side TTFT and TPOT of an LLM 2xx answer; None without the timeline."""
    timeline = record.timeline
    if timeline is None or not {"arrival_s", "first_token_s", "finished_s"} <= timeline.keys():
        return None
    ttft_s = timeline["first_token_s"] - timeline["arrival_s"]
    tpot_s = time_per_output_token_s(
        timeline["first_token_s"], timeline["finished_s"], record.completion_tokens or 1
    )
    return ttft_s, tpot_s


def _token_figures(records: Sequence[RequestRecord]) -> _TokenFigures:
    ttfts_s: list[float] = []
    tpots_s: list[float] = []
    judged = met = 0
    for record in records:
        if record.kind != "llm" or record.outcome in (NOT_SENT, CANCELLED):
            continue
        if record.outcome != OK:
            judged += 1  # no answer: a miss
            continue
        times = _token_times(record)
        if times is None:
            continue
        ttft_s, tpot_s = times
        ttfts_s.append(ttft_s)
        if tpot_s is not None:
            tpots_s.append(tpot_s)
        slo = DEFAULT_TOKEN_SLOS[_workload(record.workload)]
        judged += 1
        met += judge(slo, ttft_s=ttft_s, tpot_s=tpot_s, latency_s=0.0).met
    return _TokenFigures(ttfts_s=ttfts_s, tpots_s=tpots_s, judged=judged, met=met)


def _workload(name: str) -> WorkloadType:
    try:
        return WorkloadType(name)
    except ValueError:
        return WorkloadType.OTHER


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """The figures of ``records`` (see the module documentation for each definition).

    Args:
        records: the per-request records (all of a replay, or one application's).
        duration_s: seconds of replay that rates are taken over (> 0 for rates).
    """
    outcomes = Counter(record.outcome for record in records)
    sent = [record for record in records if record.was_sent]
    ok = [record for record in records if record.outcome == OK]
    latencies = [record.latency_s for record in ok if record.latency_s is not None]
    by_status = Counter(
        record.status_code
        for record in records
        if record.status_code is not None and not 200 <= record.status_code < 300
    )
    verdicts = [is_violation(record) for record in records]
    judged = [verdict for verdict in verdicts if verdict is not None]
    lags = [record.send_lag_s for record in sent if record.send_lag_s is not None]
    emulated = sum(1 for record in ok if record.emulated is True)
    good = sum(1 for record in ok if record.deadline_met is True)
    tokens = _token_figures(records)
    return Summary(
        planned=len(records),
        sent=len(sent),
        not_sent=outcomes[NOT_SENT],
        answered_ok=len(ok),
        errors_by_status={str(code): count for code, count in sorted(by_status.items())},
        rejected=outcomes[REJECTED],
        http_errors=outcomes[HTTP_ERROR],
        timeouts=outcomes[TIMEOUT],
        transport_errors=outcomes[TRANSPORT_ERROR],
        cancelled=outcomes[CANCELLED],
        duration_s=duration_s,
        throughput_rps=_rate(len(ok), duration_s),
        goodput_rps=_rate(good, duration_s),
        latency_p50_s=_q(latencies, 0.5),
        latency_p90_s=_q(latencies, 0.9),
        latency_p99_s=_q(latencies, 0.99),
        latency_mean_s=_mean(latencies),
        latency_max_s=max(latencies) if latencies else None,
        slo_judged=len(judged),
        slo_violations=sum(judged),
        slo_violation_rate=sum(judged) / len(judged) if judged else None,
        deadline_unknown=sum(1 for record in ok if record.deadline_met is None),
        emulated_answers=emulated,
        emulated_share=emulated / len(ok) if ok else None,
        send_lag_p50_s=_q(lags, 0.5),
        send_lag_p99_s=_q(lags, 0.99),
        send_lag_max_s=max(lags) if lags else None,
        breakdown=breakdown(records),
        ttft_p50_s=_q(tokens.ttfts_s, 0.5),
        ttft_p99_s=_q(tokens.ttfts_s, 0.99),
        tpot_p50_s=_q(tokens.tpots_s, 0.5),
        tpot_p99_s=_q(tokens.tpots_s, 0.99),
        token_slo_judged=tokens.judged,
        token_slo_attainment=tokens.met / tokens.judged if tokens.judged else None,
        token_goodput_rps=_rate(tokens.met, duration_s),
    )


def per_app_summaries(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Summary]:
    """:func:`summarize` for each application, by name (sorted); rates over the whole
    replay's ``duration_s``."""
    apps = sorted({record.app for record in records})
    return {
        app: summarize([record for record in records if record.app == app], duration_s)
        for app in apps
    }
