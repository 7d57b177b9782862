"""A worker's heartbeat: its queue, load and resources now, as the monitor records them.

Pure: everything comes from the arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from switchyard.contracts.messages import Heartbeat, LLMPayload, QueuedEntry, WorkloadType

from services.worker.backends.base import Backend
from services.worker.queue import LocalQueue, WorkItem


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatFacts:
    """What a heartbeat says besides the backend's load and the queue."""

    worker_id: str
    sequence: int
    interval_s: float
    time_scale: float
    inbox_partition: int | None
    inbox_read_through_s: float | None
    draining: bool
    now_s: float
    role: Literal["mixed", "prefill", "decode"] = "mixed"


def build_heartbeat(backend: Backend, queue: LocalQueue, facts: HeartbeatFacts) -> Heartbeat:
    """The heartbeat of a worker running ``backend`` with ``queue`` waiting (see the
    contract for each field)."""
    waiting = list(queue)
    load = backend.load(waiting)
    # Each request's work as the scheduler predicted it, as the simulator counts it:
    # a policy compares these figures with its own predictions.
    running_s = [(item, predicted_left_s(item, left_s)) for item, left_s in load.running]
    waiting_s = [(item, predicted_left_s(item, item.estimate_s)) for item in waiting]
    entries = [_entry(item, running=True, remaining_s=s) for item, s in running_s]
    entries += [_entry(item, running=False, remaining_s=s) for item, s in waiting_s]
    predicted = _any_predicted(waiting) or _any_predicted(item for item, _ in load.running)
    return Heartbeat(
        worker_id=facts.worker_id,
        worker_type=backend.worker_type,
        sequence=facts.sequence,
        interval_s=facts.interval_s,
        queue_length=len(waiting),
        queued_work_s=load.queued_work_s,
        predicted_work_s=sum(s for _, s in running_s) + sum(s for _, s in waiting_s)
        if predicted
        else None,
        running=len(load.running),
        utilization=min(1.0, max(0.0, load.utilization)),
        resident_models=backend.resident_models(),
        servable_models=backend.servable_models(),
        backend=backend.name,
        profile=backend.profile,
        max_slots=load.max_slots,
        kv_used_tokens=load.kv_used_tokens,
        kv_capacity_tokens=load.kv_capacity_tokens,
        queued_tokens=queue.waiting_tokens() + load.running_kv_tokens,
        decode_step_s=load.decode_step_s,
        prefill_share=min(1.0, max(0.0, load.prefill_share)),
        chunked_prefill_tokens=load.chunked_prefill_tokens,
        prefilling_tokens=load.prefilling_tokens,
        outstanding=entries[: Heartbeat.MAX_LISTED],
        outstanding_total=len(entries),
        draining=facts.draining,
        capacity=load.capacity,
        free=load.free,
        kv_cache_free_bytes=load.kv_cache_free_bytes,
        placed=list(load.placed),
        speed=load.speed,
        gpu_type=load.gpu_type,
        time_scale=facts.time_scale if backend.emulated else 1.0,
        emulated=backend.emulated,
        inbox_partition=facts.inbox_partition,
        inbox_read_through_s=facts.inbox_read_through_s,
        role=facts.role,
        sent_at_s=facts.now_s,
    )


def _any_predicted(items: Iterable[WorkItem]) -> bool:
    return any(item.assignment.predicted_s is not None for item in items)


def predicted_left_s(item: WorkItem, left_s: float) -> float:
    """The work ``item`` has left as its assignment predicted it: the prediction less the
    idle work done so far (its estimate less ``left_s``, what the backend says is left),
    at least 0; the backend's ``left_s`` when the assignment carries no prediction."""
    predicted_s = item.assignment.predicted_s
    if predicted_s is None:
        return left_s
    return max(0.0, predicted_s - max(0.0, item.estimate_s - left_s))


def _entry(item: WorkItem, *, running: bool, remaining_s: float) -> QueuedEntry:
    payload = item.request.payload
    return QueuedEntry(
        request_id=item.request_id,
        app=item.request.app,
        running=running,
        epoch=item.epoch,
        queued_at_s=item.received_at_s,
        prompt_tokens=item.prompt_tokens,
        generated_tokens=item.generated_tokens,
        kv_tokens=item.context_tokens if running else 0,
        remaining_s=max(0.0, remaining_s),
        workload=payload.workload if isinstance(payload, LLMPayload) else WorkloadType.OTHER,
        output_tokens_hint=payload.output_tokens_hint if isinstance(payload, LLMPayload) else None,
    )
