"""The policies' views of workers, built from their heartbeats (pure).

A worker's :class:`~switchyard.policies.snapshot.WorkerView` takes its load figures from
its heartbeat and its time and size constants from its performance profile; the live
scheduler, the rebalancer and the admission gate all build their views here, from the
monitor's records (:mod:`switchyard.cluster.records`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from switchyard.cluster.records import ClusterView, worker_profile
from switchyard.contracts.messages import Heartbeat
from switchyard.perf.profiles import UnknownProfileError, performance_model
from switchyard.policies.snapshot import ClusterSnapshot, WorkerRole, WorkerView


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileConstants:
    """The constants of a performance profile a :class:`WorkerView` carries.

    For an unknown profile every cost is 0 and ``interconnect_bytes_per_s`` is infinite
    (moving zero bytes costs nothing), so a policy that divides by it stays finite.
    """

    known: bool
    max_batch_slots: int
    kv_capacity_tokens: int
    decode_step_per_seq_s: float
    decode_step_per_kv_token_s: float
    kv_bytes_per_token: int
    interconnect_bytes_per_s: float
    prefill_per_token_s: float = 0.0
    prefill_per_token_sq_s: float = 0.0
    prefill_base_s: float = 0.0


_UNKNOWN_PROFILE = ProfileConstants(
    known=False,
    max_batch_slots=0,
    kv_capacity_tokens=0,
    decode_step_per_seq_s=0.0,
    decode_step_per_kv_token_s=0.0,
    kv_bytes_per_token=0,
    interconnect_bytes_per_s=math.inf,
)


@functools.cache
def profile_constants(profile: str) -> ProfileConstants:
    """The constants of performance profile ``profile`` (``"GPU/MODEL"``), cached.

    An unknown name gives the all-zero constants (see :class:`ProfileConstants`).
    """
    try:
        perf = performance_model(profile)
    except UnknownProfileError:
        return _UNKNOWN_PROFILE
    return ProfileConstants(
        known=True,
        max_batch_slots=perf.max_batch_slots,
        kv_capacity_tokens=perf.kv_capacity_tokens,
        decode_step_per_seq_s=perf.decode_per_seq_s,
        decode_step_per_kv_token_s=perf.decode_per_kv_token_s,
        kv_bytes_per_token=perf.kv_bytes_per_token,
        interconnect_bytes_per_s=perf.interconnect_bytes_per_s,
        prefill_per_token_s=perf.prefill_per_token_s,
        prefill_per_token_sq_s=perf.prefill_per_token_sq_s,
        prefill_base_s=perf.prefill_base_s,
    )


def worker_view(heartbeat: Heartbeat, *, alive: bool = True) -> WorkerView:
    """The policies' :class:`WorkerView` of a worker from its heartbeat.

    Load figures (queue length, running batch, KV use, queued work and tokens,
    utilisation, decode step) come from the heartbeat; the per-sequence and per-token
    decode costs, KV bytes per token and interconnect bandwidth from the profile
    (:func:`profile_constants`). ``max_slots`` and ``kv_capacity_tokens`` are the
    heartbeat's when it reports them (non-zero), else the profile's. Role is MIXED.
    Time constants are divided by the heartbeat's ``time_scale`` (an emulated worker's
    figures are wall seconds).
    """
    profile = worker_profile(heartbeat)
    constants = profile_constants(profile)
    # The profile's constants are modelled seconds; an emulated worker running
    # time_scale times faster reports wall seconds, and so must its view.
    scale = heartbeat.time_scale
    return WorkerView(
        worker_id=heartbeat.worker_id,
        worker_type=profile,
        role=WorkerRole(heartbeat.role),
        alive=alive,
        waiting=heartbeat.queue_length,
        running=heartbeat.running,
        max_slots=heartbeat.max_slots or constants.max_batch_slots,
        kv_used_tokens=heartbeat.kv_used_tokens,
        kv_capacity_tokens=heartbeat.kv_capacity_tokens or constants.kv_capacity_tokens,
        # Policies compare queued work with their predictions, so they see it predicted.
        queued_work_s=heartbeat.predicted_work_s
        if heartbeat.predicted_work_s is not None
        else heartbeat.queued_work_s,
        queued_tokens=heartbeat.queued_tokens,
        utilization=heartbeat.utilization,
        decode_step_s=heartbeat.decode_step_s,
        decode_step_per_seq_s=constants.decode_step_per_seq_s / scale,
        decode_step_per_kv_token_s=constants.decode_step_per_kv_token_s / scale,
        kv_bytes_per_token=constants.kv_bytes_per_token,
        interconnect_bytes_per_s=constants.interconnect_bytes_per_s * scale,
        prefill_per_token_s=constants.prefill_per_token_s / scale,
        prefill_per_token_sq_s=constants.prefill_per_token_sq_s / scale,
        prefill_base_s=constants.prefill_base_s / scale,
        chunk_budget_tokens=heartbeat.chunked_prefill_tokens,
        prefilling_tokens=heartbeat.prefilling_tokens,
    )


def cluster_snapshot(view: ClusterView, worker_timeout_s: float) -> ClusterSnapshot:
    """A policy :class:`ClusterSnapshot` of every worker with a heartbeat, ordered by id;
    ``alive`` per :meth:`WorkerRecord.takes_work`. Workers without a readable heartbeat
    are left out."""
    return ClusterSnapshot(
        now_s=view.now_s,
        workers=tuple(
            worker_view(record.heartbeat, alive=record.takes_work(worker_timeout_s))
            for record in view.workers
            if record.heartbeat is not None
        ),
    )
