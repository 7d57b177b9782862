"""The worker's local queue and batch picking: pure, no clock, no I/O."""

from __future__ import annotations

import pytest
from switchyard.contracts.messages import Assignment, InferenceRequest, LLMPayload

from services.worker.batching import admit_continuous, pick_batch
from services.worker.queue import BatchKey, LocalQueue, WorkItem


def _item(
    request_id: str,
    *,
    order: float = 0.0,
    assigned_at_s: float = 100.0,
    model: str = "m",
    not_before_s: float | None = None,
    prompt_tokens: int = 10,
    output_tokens: int = 5,
    generated_tokens: int = 0,
    tenant: str | None = None,
    estimate_s: float = 0.0,
) -> WorkItem:
    request = InferenceRequest(
        request_id=request_id,
        app="app",
        payload=LLMPayload(
            model=model, prompt_tokens=prompt_tokens, max_output_tokens=output_tokens
        ),
        arrival_s=90.0,
        tenant=tenant,
    )
    assignment = Assignment(
        request=request,
        worker_id="w1",
        variant=model,
        order=order,
        policy="test",
        assigned_at_s=assigned_at_s,
        not_before_s=not_before_s,
        generated_tokens=generated_tokens,
    )
    return WorkItem(
        assignment=assignment,
        key=BatchKey(model, model),
        received_at_s=assigned_at_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        generated_tokens=generated_tokens,
        estimate_s=estimate_s,
    )


def _ids(items: list[WorkItem]) -> list[str]:
    return [item.request_id for item in items]


def test_queue_orders_by_order_then_assignment_time_then_arrival() -> None:
    queue = LocalQueue()
    for item in (
        _item("late", order=2.0),
        _item("b-second", order=1.0, assigned_at_s=101.0),
        _item("a-first", order=1.0, assigned_at_s=100.0),
        _item("tie-1", order=3.0),
        _item("tie-2", order=3.0),
    ):
        queue.push(item)
    assert _ids(list(queue)) == ["a-first", "b-second", "late", "tie-1", "tie-2"]


def test_a_tenant_s_burst_does_not_hold_back_another_tenant_s_request() -> None:
    queue = LocalQueue()
    # Tenant "bulk" sends 20 requests of 1 s each at once (orders are arrival times).
    for index in range(20):
        queue.push(_item(f"bulk-{index}", order=100.0, tenant="bulk", estimate_s=1.0))
    # "chat" sends one 2.5 s later: only what bulk was due to have started by then
    # (3 of its requests) goes first, not all 20.
    queue.push(_item("chat-1", order=102.5, tenant="chat", estimate_s=1.0))
    order = _ids(list(queue))
    assert order.index("chat-1") == 3, order
    # Within a tenant, first come first served.
    assert [i for i in order if i.startswith("bulk")] == [f"bulk-{i}" for i in range(20)]
    # A request taken out and put back (preempted) keeps its place.
    again = queue.remove("chat-1")
    assert again is not None
    queue.push(again)
    assert _ids(list(queue)).index("chat-1") == 3


def test_without_tenants_or_for_paced_tenants_the_order_is_the_scheduler_s() -> None:
    anonymous, paced = LocalQueue(), LocalQueue()
    for index in range(5):
        anonymous.push(_item(f"a-{index}", order=100.0 + index * 0.1, estimate_s=1.0))
        # A tenant whose requests come no faster than they are served: 1 s apart, 0.5 s each.
        paced.push(_item(f"p-{index}", order=100.0 + index, tenant="t", estimate_s=0.5))
    paced.push(_item("other", order=101.2, tenant="u", estimate_s=0.5))
    assert _ids(list(anonymous)) == [f"a-{i}" for i in range(5)]
    assert _ids(list(paced)) == ["p-0", "p-1", "other", "p-2", "p-3", "p-4"]


def test_queue_remove_and_duplicates() -> None:
    queue = LocalQueue()
    queue.push(_item("r1", order=1.0))
    queue.push(_item("r2", order=2.0))
    with pytest.raises(ValueError, match="already queued"):
        queue.push(_item("r1", order=0.0))
    removed = queue.remove("r1")
    assert removed is not None
    assert removed.request_id == "r1"
    assert queue.remove("r1") is None
    assert _ids(list(queue)) == ["r2"]
    assert "r2" in queue
    assert "r1" not in queue


def test_not_before_keeps_place_but_is_not_ready_until_then() -> None:
    queue = LocalQueue()
    queue.push(_item("moving", order=0.0, not_before_s=105.0))
    queue.push(_item("local", order=1.0))
    assert _ids(queue.ready(104.0)) == ["local"]
    assert queue.next_ready_s(104.0) == 105.0
    assert _ids(queue.ready(105.0)) == ["moving", "local"]
    assert queue.next_ready_s(105.0) is None


def test_pick_batch_takes_the_head_and_its_model_up_to_max_batch() -> None:
    ready = [
        _item("a1", order=1, model="a"),
        _item("b1", order=2, model="b"),
        _item("a2", order=3, model="a"),
        _item("a3", order=4, model="a"),
        _item("a4", order=5, model="a"),
    ]
    assert _ids(pick_batch(ready, max_batch=3)) == ["a1", "a2", "a3"]
    assert _ids(pick_batch(ready[1:], max_batch=3)) == ["b1"]
    assert pick_batch([], max_batch=3) == []
    with pytest.raises(ValueError, match="max_batch"):
        pick_batch(ready, max_batch=0)


def test_admission_respects_slots_memory_budget_and_order() -> None:
    ready = [
        _item("r1", prompt_tokens=100, output_tokens=50),
        _item("r2", prompt_tokens=100, output_tokens=50),
        _item("r3", prompt_tokens=10, output_tokens=10),
    ]
    big = {"free_slots": 10, "kv_free_tokens": 10_000, "prefill_token_budget": 10_000}
    assert _ids(admit_continuous(ready, **big)) == ["r1", "r2", "r3"]
    # Two slots: the third waits.
    assert _ids(admit_continuous(ready, **{**big, "free_slots": 2})) == ["r1", "r2"]
    # Memory for one reservation (prompt + output): r2 does not fit and blocks r3.
    assert _ids(admit_continuous(ready, **{**big, "kv_free_tokens": 200})) == ["r1"]
    # A budget below the first prompt still admits the first request.
    assert _ids(admit_continuous(ready, **{**big, "prefill_token_budget": 50})) == ["r1"]
    assert admit_continuous(ready, **{**big, "free_slots": 0}) == []


def test_a_migrated_request_prefills_its_generated_tokens_too() -> None:
    moved = _item("moved", prompt_tokens=100, output_tokens=50, generated_tokens=30)
    fresh = _item("fresh", prompt_tokens=100, output_tokens=50)
    assert moved.context_tokens == 130
    # Budget 230: moved (130) plus fresh (100) fit exactly; one token less and fresh waits.
    limits = {"free_slots": 10, "kv_free_tokens": 10_000}
    assert _ids(admit_continuous([moved, fresh], **limits, prefill_token_budget=230)) == [
        "moved",
        "fresh",
    ]
    assert _ids(admit_continuous([moved, fresh], **limits, prefill_token_budget=229)) == ["moved"]
