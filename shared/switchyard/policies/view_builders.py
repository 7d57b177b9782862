"""Positional builders of the views a shell makes by the tens of thousands.

A frozen dataclass's generated ``__init__`` sets every field through
``object.__setattr__`` (its own ``__setattr__`` refuses), which makes building a
:class:`WorkerView` of 16 fields cost about 4 µs. The simulator builds one after every
change of a worker and, overloaded, a :class:`QueuedRequestView` for each of hundreds of
queued requests on every rebalancing round, so that cost showed in its profile. The
builders here make the very same objects (same class, same slot values: equal, same
hash and repr) by writing each slot through its descriptor, at about a third of the
cost (the request's view and the cluster snapshot, made once per request, likewise).
They take every field, in declaration order, with no defaults; the field lists
are checked against the classes on import, so a field added to a view without adding
it here fails at once instead of leaving a slot unset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from switchyard.contracts.messages import WorkloadType
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    RequestPhase,
    RequestView,
    WorkerRole,
    WorkerView,
)

__all__ = [
    "new_cluster_snapshot",
    "new_queued_request_view",
    "new_request_view",
    "new_worker_view",
]

_Setter = Callable[[Any, Any], None]


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[_Setter, ...]:
    """The descriptors' setters of ``cls``'s fields, which must be exactly ``names``."""
    declared = tuple(f.name for f in fields(cls))
    if declared != names:
        raise TypeError(f"{cls.__name__} has fields {declared}, its builder sets {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


_new = object.__new__

(
    _w_worker_id,
    _w_worker_type,
    _w_role,
    _w_alive,
    _w_waiting,
    _w_running,
    _w_max_slots,
    _w_kv_used_tokens,
    _w_kv_capacity_tokens,
    _w_queued_work_s,
    _w_queued_tokens,
    _w_utilization,
    _w_decode_step_s,
    _w_decode_step_per_seq_s,
    _w_decode_step_per_kv_token_s,
    _w_kv_bytes_per_token,
    _w_interconnect_bytes_per_s,
    _w_prefill_per_token_s,
    _w_prefill_per_token_sq_s,
    _w_prefill_base_s,
    _w_chunk_budget_tokens,
    _w_prefilling_tokens,
) = _slot_setters(
    WorkerView,
    (
        "worker_id",
        "worker_type",
        "role",
        "alive",
        "waiting",
        "running",
        "max_slots",
        "kv_used_tokens",
        "kv_capacity_tokens",
        "queued_work_s",
        "queued_tokens",
        "utilization",
        "decode_step_s",
        "decode_step_per_seq_s",
        "decode_step_per_kv_token_s",
        "kv_bytes_per_token",
        "interconnect_bytes_per_s",
        "prefill_per_token_s",
        "prefill_per_token_sq_s",
        "prefill_base_s",
        "chunk_budget_tokens",
        "prefilling_tokens",
    ),
)


def new_worker_view(
    worker_id: str,
    worker_type: str,
    role: WorkerRole,
    alive: bool,
    waiting: int,
    running: int,
    max_slots: int,
    kv_used_tokens: int,
    kv_capacity_tokens: int,
    queued_work_s: float,
    queued_tokens: int,
    utilization: float,
    decode_step_s: float,
    decode_step_per_seq_s: float,
    decode_step_per_kv_token_s: float,
    kv_bytes_per_token: int,
    interconnect_bytes_per_s: float,
    prefill_per_token_s: float,
    prefill_per_token_sq_s: float,
    prefill_base_s: float,
    chunk_budget_tokens: int | None,
    prefilling_tokens: int,
) -> WorkerView:
    """Exactly ``WorkerView(worker_id=worker_id, ...)`` with every field given."""
    view: WorkerView = _new(WorkerView)
    _w_worker_id(view, worker_id)
    _w_worker_type(view, worker_type)
    _w_role(view, role)
    _w_alive(view, alive)
    _w_waiting(view, waiting)
    _w_running(view, running)
    _w_max_slots(view, max_slots)
    _w_kv_used_tokens(view, kv_used_tokens)
    _w_kv_capacity_tokens(view, kv_capacity_tokens)
    _w_queued_work_s(view, queued_work_s)
    _w_queued_tokens(view, queued_tokens)
    _w_utilization(view, utilization)
    _w_decode_step_s(view, decode_step_s)
    _w_decode_step_per_seq_s(view, decode_step_per_seq_s)
    _w_decode_step_per_kv_token_s(view, decode_step_per_kv_token_s)
    _w_kv_bytes_per_token(view, kv_bytes_per_token)
    _w_interconnect_bytes_per_s(view, interconnect_bytes_per_s)
    _w_prefill_per_token_s(view, prefill_per_token_s)
    _w_prefill_per_token_sq_s(view, prefill_per_token_sq_s)
    _w_prefill_base_s(view, prefill_base_s)
    _w_chunk_budget_tokens(view, chunk_budget_tokens)
    _w_prefilling_tokens(view, prefilling_tokens)
    return view


(
    _q_request,
    _q_worker_id,
    _q_phase,
    _q_queued_at_s,
    _q_work_ahead_s,
    _q_remaining_s,
    _q_kv_tokens,
    _q_generated_tokens,
) = _slot_setters(
    QueuedRequestView,
    (
        "request",
        "worker_id",
        "phase",
        "queued_at_s",
        "work_ahead_s",
        "remaining_s",
        "kv_tokens",
        "generated_tokens",
    ),
)


def new_queued_request_view(
    request: RequestView,
    worker_id: str,
    phase: RequestPhase,
    queued_at_s: float,
    work_ahead_s: float,
    remaining_s: float,
    kv_tokens: int,
    generated_tokens: int,
) -> QueuedRequestView:
    """Exactly ``QueuedRequestView(request=request, ...)`` with every field given."""
    view: QueuedRequestView = _new(QueuedRequestView)
    _q_request(view, request)
    _q_worker_id(view, worker_id)
    _q_phase(view, phase)
    _q_queued_at_s(view, queued_at_s)
    _q_work_ahead_s(view, work_ahead_s)
    _q_remaining_s(view, remaining_s)
    _q_kv_tokens(view, kv_tokens)
    _q_generated_tokens(view, generated_tokens)
    return view


(
    _r_request_id,
    _r_arrival_s,
    _r_prompt_tokens,
    _r_workload,
    _r_model,
    _r_output_tokens_hint,
    _r_predicted_s,
    _r_calibrated_s,
    _r_deadline_s,
    _r_true_service_s,
    _r_cached_tokens,
    _r_ttft_slo_s,
) = _slot_setters(
    RequestView,
    (
        "request_id",
        "arrival_s",
        "prompt_tokens",
        "workload",
        "model",
        "output_tokens_hint",
        "predicted_s",
        "calibrated_s",
        "deadline_s",
        "true_service_s",
        "cached_tokens",
        "ttft_slo_s",
    ),
)


def new_request_view(
    request_id: str,
    arrival_s: float,
    prompt_tokens: int,
    workload: WorkloadType,
    model: str,
    output_tokens_hint: int | None,
    predicted_s: Mapping[str, float],
    calibrated_s: Mapping[str, float],
    deadline_s: float | None,
    true_service_s: Mapping[str, float] | None,
    cached_tokens: Mapping[str, int],
    ttft_slo_s: float | None,
) -> RequestView:
    """Exactly ``RequestView(request_id=request_id, ...)`` with every field given."""
    view: RequestView = _new(RequestView)
    _r_request_id(view, request_id)
    _r_arrival_s(view, arrival_s)
    _r_prompt_tokens(view, prompt_tokens)
    _r_workload(view, workload)
    _r_model(view, model)
    _r_output_tokens_hint(view, output_tokens_hint)
    _r_predicted_s(view, predicted_s)
    _r_calibrated_s(view, calibrated_s)
    _r_deadline_s(view, deadline_s)
    _r_true_service_s(view, true_service_s)
    _r_cached_tokens(view, cached_tokens)
    _r_ttft_slo_s(view, ttft_slo_s)
    return view


_c_now_s, _c_workers = _slot_setters(ClusterSnapshot, ("now_s", "workers"))


def new_cluster_snapshot(now_s: float, workers: tuple[WorkerView, ...]) -> ClusterSnapshot:
    """Exactly ``ClusterSnapshot(now_s=now_s, workers=workers)``."""
    snapshot: ClusterSnapshot = _new(ClusterSnapshot)
    _c_now_s(snapshot, now_s)
    _c_workers(snapshot, workers)
    return snapshot
