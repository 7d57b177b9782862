"""Prefill/decode pools in the live placer (switchyard.cluster.placer over
switchyard.policies.disaggregation): with decode workers in the cluster, a new request is
placed over the prefill pool, and one placed on a prefill worker gets its decode worker
from the decode pool at once, under any policy; a rebalancer plans each pool alone."""

from __future__ import annotations

from typing import Literal

import pytest
from switchyard.cluster.placer import LlmPlacer, Placed
from switchyard.contracts.messages import Heartbeat, InferenceRequest, LLMPayload
from switchyard.policies.disaggregation import (
    decode_pool,
    prefill_pool,
    rebalance_pools,
)
from switchyard.policies.registry import make_llm_policy
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    RebalanceSnapshot,
    RequestPhase,
    WorkerRole,
)

from tests.support.services import heartbeat as stored_heartbeat

MODEL = "llama-2-7b"
Role = Literal["mixed", "prefill", "decode"]


def heartbeat(worker_id: str, role: Role, *, waiting: int = 0, partition: int = 0) -> Heartbeat:
    beat = stored_heartbeat(worker_id, waiting=waiting)
    return beat.model_copy(update={"role": role, "inbox_partition": partition, "sent_at_s": 0.0})


def request(request_id: str, prompt_tokens: int = 200) -> InferenceRequest:
    payload = LLMPayload(model=MODEL, prompt_tokens=prompt_tokens, max_output_tokens=64)
    return InferenceRequest(request_id=request_id, app="chat", payload=payload, arrival_s=1.0)


def decode_of(placed: Placed) -> str | None:
    return None if placed.decode is None else placed.decode.worker_id


def placer_of(policy: str, *beats: Heartbeat) -> LlmPlacer:
    placer = LlmPlacer(make_llm_policy(policy))
    for beat in beats:
        placer.observe(beat, alive=True)
    return placer


@pytest.mark.parametrize("policy", ["jsq", "gaps", "llumnix", "switchyard", "llm-d"])
def test_every_policy_prefills_on_the_prefill_pool_and_names_a_decode_worker(
    policy: str,
) -> None:
    placer = placer_of(
        policy,
        heartbeat("p1", "prefill", partition=1),
        heartbeat("p2", "prefill", partition=2),
        heartbeat("d1", "decode", waiting=4, partition=3),
        heartbeat("d2", "decode", partition=4),
    )
    for i in range(6):
        placed = placer.place(request(f"r{i}"), now_s=1.0)
        assert placed.placement.worker_id in {"p1", "p2"}
        decode = placed.decode
        assert decode is not None
        assert decode.worker_id in {"d1", "d2"}
        assert decode.inbox_partition == {"d1": 3, "d2": 4}[decode.worker_id]
        # The decode worker's type's predictions travel with it (these A100s: the same).
        assert decode.predicted_s == placed.predicted_s
        assignment = placed.assignment(request(f"r{i}"), policy, epoch=0, assigned_at_s=1.0)
        assert assignment.worker_id == placed.placement.worker_id
        assert assignment.decode == decode


def test_decode_phases_count_on_their_worker_until_its_next_heartbeat() -> None:
    placer = placer_of(
        "jsq",
        heartbeat("p1", "prefill", partition=1),
        heartbeat("d1", "decode", waiting=2, partition=2),
        heartbeat("d2", "decode", partition=3),
    )
    decoders = [decode_of(placer.place(request(f"r{i}"), now_s=1.0)) for i in range(4)]
    # Join-shortest-queue over the decode pool: d2 until it holds as many as d1.
    assert decoders[:2] == ["d2", "d2"]
    waiting = {w.worker_id: w.waiting for w in placer.cluster(MODEL, now_s=1.0).workers}
    assert waiting["d1"] + waiting["d2"] == 2 + 4
    assert waiting["p1"] == 4


def test_a_mixed_worker_decodes_its_own_and_no_live_decode_worker_means_no_hand_off() -> None:
    placer = placer_of(
        "jsq", heartbeat("m1", "mixed", partition=1), heartbeat("d1", "decode", partition=2)
    )
    placed = placer.place(request("r1"), now_s=1.0)
    assert (placed.placement.worker_id, decode_of(placed)) == ("m1", None)

    placer = placer_of(
        "jsq", heartbeat("p1", "prefill", partition=1), heartbeat("d1", "decode", partition=2)
    )
    placer.mark_down("d1")
    placed = placer.place(request("r2"), now_s=1.0)
    assert (placed.placement.worker_id, decode_of(placed)) == ("p1", None)


def test_a_cluster_of_decode_workers_alone_takes_no_new_request() -> None:
    from switchyard.policies.base import NoWorkerError

    placer = placer_of("jsq", heartbeat("d1", "decode", partition=1))
    with pytest.raises(NoWorkerError):
        placer.place(request("r1"), now_s=1.0)


def _snapshot(placer: LlmPlacer) -> ClusterSnapshot:
    return placer.cluster(MODEL, now_s=1.0)


def test_the_pools_cut_the_cluster_and_show_decode_workers_as_taking_work() -> None:
    placer = placer_of(
        "jsq",
        heartbeat("p1", "prefill", partition=1),
        heartbeat("d1", "decode", partition=2),
        heartbeat("m1", "mixed", partition=3),
    )
    cluster = _snapshot(placer)
    assert [w.worker_id for w in prefill_pool(cluster).workers] == ["m1", "p1"]
    decode = decode_pool(cluster)
    assert [(w.worker_id, w.role) for w in decode.workers] == [("d1", WorkerRole.MIXED)]
    assert [w.worker_id for w in decode.eligible()] == ["d1"]
    # Without decode workers nothing is cut (the same snapshot, no copy).
    plain = placer_of("jsq", heartbeat("m1", "mixed", partition=1))
    assert prefill_pool(_snapshot(plain)).workers == _snapshot(plain).workers


def test_a_rebalancer_is_shown_each_pool_with_its_own_queued_requests() -> None:
    placer = placer_of(
        "jsq", heartbeat("p1", "prefill", partition=1), heartbeat("d1", "decode", partition=2)
    )
    cluster = _snapshot(placer)
    view = placer.place(request("r1"), now_s=1.0).view

    def queued(worker_id: str) -> QueuedRequestView:
        return QueuedRequestView(
            request=view,
            worker_id=worker_id,
            phase=RequestPhase.WAITING,
            queued_at_s=1.0,
            work_ahead_s=0.0,
            remaining_s=1.0,
            kv_tokens=0,
        )

    snapshot = RebalanceSnapshot(
        cluster=cluster, queued=(queued("p1"), queued("d1")), recent_slo_violation_rate=0.2
    )
    pools = rebalance_pools(snapshot)
    assert [[w.worker_id for w in p.cluster.workers] for p in pools] == [["p1"], ["d1"]]
    assert [[q.worker_id for q in p.queued] for p in pools] == [["p1"], ["d1"]]
    assert all(p.recent_slo_violation_rate == 0.2 for p in pools)
    plain = RebalanceSnapshot(
        cluster=prefill_pool(cluster), queued=(), recent_slo_violation_rate=0.0
    )
    assert rebalance_pools(plain) == (plain,)


def test_switchyard_up_refuses_pools_that_leave_a_model_without_a_prefill_or_decode_worker() -> (
    None
):
    from services.launch import prefill_pool_problem

    a7, h13 = "a100-80gb/llama-2-7b", "h100-80gb/llama-2-13b"
    assert prefill_pool_problem((a7, a7, h13), 0) is None  # off
    assert prefill_pool_problem((a7, a7, a7), 1) is None
    assert "1 to 2 of the 3" in (prefill_pool_problem((a7, a7, a7), 3) or "")
    assert "llama-2-13b would have no prefill worker" in (
        prefill_pool_problem((a7, a7, h13), 1) or ""
    )
    assert "llama-2-7b would have no decode worker" in (
        prefill_pool_problem((a7, h13, h13), 1) or ""
    )
