"""The emulated LLM backend: continuous batching that spends the performance model's time.

Durations are asserted on the backend's modelled clock (what the emulation reports),
not on wall time, so a slow machine cannot flake them.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    InferenceRequest,
    LLMPayload,
    LLMResult,
)
from switchyard.perf import PerformanceModel, performance_model

from services.worker.backends import build_backend, emulated_llm
from services.worker.backends.base import UnsupportedWorkError
from services.worker.backends.emulated_llm import EmulatedLlmBackend, emulated_text
from services.worker.queue import LocalQueue, WorkItem
from tests.support.worker import Sink

PROFILE = "a100-80gb/llama-2-7b"
SCALE = 1e6  # a modelled second lasts a microsecond


def _assignment(
    request_id: str,
    *,
    prompt: int,
    output: int,
    model: str = "llama-2-7b",
    order: float = 0.0,
    generated: int = 0,
    blocks: list[int] | None = None,
) -> Assignment:
    payload = LLMPayload(
        model=model, prompt_tokens=prompt, max_output_tokens=output, prefix_blocks=blocks or []
    )
    request = InferenceRequest(request_id=request_id, app=model, payload=payload, arrival_s=1.0)
    return Assignment(
        request=request,
        worker_id="w1",
        variant=model,
        order=order,
        policy="test",
        assigned_at_s=2.0,
        generated_tokens=generated,
    )


def _enqueue(backend: EmulatedLlmBackend, queue: LocalQueue, assignment: Assignment) -> WorkItem:
    spec = backend.describe(assignment)
    item = WorkItem(
        assignment=assignment,
        key=spec.key,
        received_at_s=2.0,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        generated_tokens=assignment.generated_tokens,
        brings_kv=assignment.generated_tokens > 0,
        estimate_s=spec.estimate_s,
    )
    queue.push(item)
    return item


async def _run_all(backend: EmulatedLlmBackend, queue: LocalQueue, sink: Sink) -> int:
    steps = 0
    while await backend.step(queue, sink, admit=True):
        steps += 1
        assert steps < 100_000
    return steps


def _times(item: WorkItem) -> tuple[float, float, float]:
    assert item.emulated is not None
    assert item.emulated.first_token_s is not None
    assert item.emulated.finished_s is not None
    return item.emulated.started_s, item.emulated.first_token_s, item.emulated.finished_s


@pytest.fixture
def perf() -> PerformanceModel:
    return performance_model(PROFILE)


async def test_a_prompt_whose_prefix_the_worker_holds_skips_its_prefill(
    perf: PerformanceModel,
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    first = _enqueue(
        backend, queue, _assignment("a", prompt=3000, output=2, blocks=[1, 2, 3, 4, 5, 6])
    )
    await _run_all(backend, queue, sink)
    # Shares the first four blocks (2,048 tokens), then goes its own way.
    again = _enqueue(
        backend, queue, _assignment("b", prompt=3000, output=2, blocks=[1, 2, 3, 4, 8, 9])
    )
    _enqueue(  # a different first block: nothing after it can match
        backend, queue, _assignment("c", prompt=3000, output=2, blocks=[7, 2, 3, 4, 5, 6])
    )
    await _run_all(backend, queue, sink)

    def prefill_s(item: WorkItem) -> float:
        started, first_token, _ = _times(item)
        return first_token - started

    assert prefill_s(first) == pytest.approx(perf.prefill_s([3000]))
    # b and c were prefilled together: 3000 - 2048 tokens of b, all 3000 of c.
    assert prefill_s(again) == pytest.approx(perf.prefill_s([3000 - 2048, 3000]))
    assert backend.prefix_cache.hit_blocks == 4


async def test_a_lone_request_takes_the_modelled_idle_service_time(perf: PerformanceModel) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    item = _enqueue(backend, queue, _assignment("r1", prompt=500, output=20))
    steps = await _run_all(backend, queue, sink)
    started, first, finished = _times(item)
    assert first - started == pytest.approx(perf.prefill_s([500]))
    assert finished - started == pytest.approx(perf.idle_service_s(500, 20))
    # One prefill, then the 19 further tokens' decode steps: at this time scale they fit
    # in one wake-up (STEP_QUANTUM_WALL_S), and no other request could finish among them.
    assert steps == 2
    assert sink.token_counts["r1"] == 20
    assert sink.results["r1"] == LLMResult(output_tokens=20, text=emulated_text(0, 20))
    assert sink.texts["r1"] == emulated_text(0, 20)  # streamed as generated
    assert not backend.has_running()
    assert backend.modelled_now_s == pytest.approx(perf.idle_service_s(500, 20))


async def test_requests_share_prefill_and_decode_steps(perf: PerformanceModel) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    short = _enqueue(backend, queue, _assignment("short", prompt=50, output=3, order=1))
    long = _enqueue(backend, queue, _assignment("long", prompt=80, output=5, order=2))
    await _run_all(backend, queue, sink)
    prefill = perf.prefill_s([50, 80])
    # After the prefill each has one token; the batch of two decodes twice, then one alone.
    short_done = prefill + perf.decode_step_s(2, 51 + 81) + perf.decode_step_s(2, 52 + 82)
    long_done = short_done + perf.decode_step_s(1, 83) + perf.decode_step_s(1, 84)
    assert _times(short) == pytest.approx((0.0, prefill, short_done))
    assert _times(long) == pytest.approx((0.0, prefill, long_done))
    assert sink.results["long"] == LLMResult(output_tokens=5, text=emulated_text(0, 5))


async def test_a_full_batch_makes_the_next_request_wait(perf: PerformanceModel) -> None:
    one_slot = dataclasses.replace(perf, max_batch_slots=1)
    backend = EmulatedLlmBackend(one_slot, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    first = _enqueue(backend, queue, _assignment("first", prompt=100, output=4, order=1))
    second = _enqueue(backend, queue, _assignment("second", prompt=100, output=4, order=2))
    await _run_all(backend, queue, sink)
    first_end = _times(first)[2]
    assert first_end == pytest.approx(perf.idle_service_s(100, 4))
    assert _times(second)[0] == pytest.approx(first_end)
    assert _times(second)[2] == pytest.approx(2 * first_end)
    assert sink.started_ids == ["first", "second"]


async def test_kv_capacity_limits_admission(perf: PerformanceModel) -> None:
    small = dataclasses.replace(perf, kv_capacity_tokens=300)
    backend = EmulatedLlmBackend(small, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    _enqueue(backend, queue, _assignment("a", prompt=100, output=100, order=1))
    _enqueue(backend, queue, _assignment("b", prompt=100, output=100, order=2))
    await backend.step(queue, sink, admit=True)
    load = backend.load(list(queue))
    assert load.running[0][0].request_id == "a"
    assert len(load.running) == 1  # b needs 200 more tokens than the 100 left
    assert load.kv_used_tokens == 200
    assert load.utilization == 1.0  # a request waits
    with pytest.raises(UnsupportedWorkError, match="KV-cache tokens"):
        backend.describe(_assignment("huge", prompt=200, output=200))


async def test_a_migrated_request_continues_from_its_generated_tokens_without_a_prefill(
    perf: PerformanceModel,
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE)
    queue, sink = LocalQueue(), Sink()
    moved = _assignment("moved", prompt=200, output=10, generated=4)
    assert backend.describe(moved).estimate_s == pytest.approx(
        perf.decode_steps_s(1, 204, 6) / SCALE
    )
    item = _enqueue(backend, queue, moved)
    await _run_all(backend, queue, sink)
    started, first, finished = _times(item)
    # Its KV cache came with it (as in the simulator): it only decodes its 6 tokens.
    assert first == started
    assert finished - started == pytest.approx(perf.decode_steps_s(1, 204, 6))
    assert sink.token_counts["moved"] == 6
    assert sink.results["moved"] == LLMResult(output_tokens=10, text=emulated_text(0, 10))


async def test_preempting_a_running_request_reports_its_kv_and_transfer_time(
    perf: PerformanceModel,
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=10.0)
    queue, sink = LocalQueue(), Sink()
    item = _enqueue(backend, queue, _assignment("r1", prompt=300, output=50))
    for _ in range(3):  # prefill and two decode steps
        await backend.step(queue, sink, admit=True)
    assert item.generated_tokens == 3
    preemption = backend.preempt("r1")
    assert preemption is not None
    assert preemption.kv_tokens == 303
    assert preemption.transfer_s == pytest.approx(perf.kv_transfer_s(303) / 10.0)
    assert not backend.has_running()
    assert backend.load([]).kv_used_tokens == 0
    assert backend.preempt("r1") is None
    assert "r1" not in sink.results


async def test_heartbeat_figures_follow_the_model(perf: PerformanceModel) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=2.0)
    queue, sink = LocalQueue(), Sink()
    _enqueue(backend, queue, _assignment("run", prompt=100, output=10, order=1))
    await backend.step(queue, sink, admit=True)  # prefill: one token
    waiting = _enqueue(backend, queue, _assignment("wait", prompt=100, output=10, order=2))
    load = backend.load([waiting])
    assert [item.request_id for item, _ in load.running] == ["run"]
    assert load.running_kv_tokens == 101
    assert load.kv_used_tokens == 110
    assert load.decode_step_s == pytest.approx(perf.decode_step_s(1, 101) / 2.0)
    assert load.running[0][1] == pytest.approx(perf.decode_steps_s(1, 101, 9) / 2.0)
    assert load.waiting_s == pytest.approx(perf.idle_service_s(100, 10) / 2.0)
    assert load.max_slots == perf.max_batch_slots
    assert load.kv_cache_free_bytes == perf.kv_bytes(perf.kv_capacity_tokens - 110)
    assert backend.resident_models() == ["llama-2-7b"] == backend.servable_models()
    assert backend.worker_type == "a100-80gb"
    assert backend.profile == PROFILE


def test_requests_it_cannot_serve_are_refused_with_the_reason(perf: PerformanceModel) -> None:
    backend = EmulatedLlmBackend(perf)
    with pytest.raises(UnsupportedWorkError, match=r"serves model 'llama-2-7b', not 'tiny-lm'"):
        backend.describe(_assignment("x", prompt=10, output=10, model="tiny-lm"))
    request = InferenceRequest(
        request_id="c1",
        app="digits",
        payload=ClassificationPayload(features=[0.0, 1.0]),
        arrival_s=1.0,
    )
    classification = Assignment(
        request=request, worker_id="w1", variant="v", order=0, policy="p", assigned_at_s=1.0
    )
    with pytest.raises(UnsupportedWorkError, match="classification request"):
        backend.describe(classification)


async def test_worker_max_slots_caps_the_running_batch() -> None:
    settings = load_settings(
        {}, worker_profile=PROFILE, worker_time_scale=SCALE, worker_max_slots=2
    )
    backend = build_backend(settings, None)
    assert isinstance(backend, EmulatedLlmBackend)
    queue, sink = LocalQueue(), Sink()
    for index in range(3):
        _enqueue(backend, queue, _assignment(f"r{index}", prompt=50, output=5, order=index))
    await backend.step(queue, sink, admit=True)
    # Two start together; the third waits for a slot, and the load says so.
    assert [item.request_id for item in queue] == ["r2"]
    load = backend.load(list(queue))
    assert (load.max_slots, len(load.running)) == (2, 2)
    await _run_all(backend, queue, sink)
    assert sorted(sink.results) == ["r0", "r1", "r2"]


async def _run_with_wake(
    backend: EmulatedLlmBackend, queue: LocalQueue, sink: Sink, wake: asyncio.Event
) -> None:
    """Step as the worker's engine routine does: clear ``wake``, then step with it."""
    while True:
        wake.clear()
        if not await backend.step(queue, sink, admit=True, wake=wake):
            return


async def test_decode_steps_are_slept_as_one_group_up_to_the_finish(
    perf: PerformanceModel,
) -> None:
    # A decode step of a lone request lasts about a millisecond of wall time here: one
    # wake-up per step would be 39 of them; grouped, the engine wakes for the prefill
    # and once more (39 steps fit well within GROUP_MAX_WALL_S), and the modelled times
    # are those of 39 separate steps.
    scale = perf.decode_step_s(1, 600) / 0.001
    backend = EmulatedLlmBackend(perf, time_scale=scale)
    queue, sink, wake = LocalQueue(), Sink(), asyncio.Event()
    item = _enqueue(backend, queue, _assignment("r1", prompt=500, output=40))
    await _run_with_wake(backend, queue, sink, wake)
    assert backend.iterations == 2
    assert _times(item)[2] == pytest.approx(perf.idle_service_s(500, 40))
    assert sink.token_counts["r1"] == 40


async def test_new_work_ends_a_decode_group_at_the_next_step(
    perf: PerformanceModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Steps of about 5 ms of wall time, groups allowed up to 10 s: without the wake-up
    # the second request would wait for the first to finish all 60 steps (0.3 s).
    monkeypatch.setattr(emulated_llm, "GROUP_MAX_WALL_S", 10.0)
    scale = perf.decode_step_s(1, 200) / 0.005
    backend = EmulatedLlmBackend(perf, time_scale=scale)
    queue, sink, wake = LocalQueue(), Sink(), asyncio.Event()
    first = _enqueue(backend, queue, _assignment("first", prompt=100, output=61, order=1))
    engine = asyncio.create_task(_run_with_wake(backend, queue, sink, wake))
    await asyncio.sleep(0.03)
    second = _enqueue(backend, queue, _assignment("second", prompt=100, output=2, order=2))
    wake.set()
    await engine
    started = _times(second)[0]
    prefill = perf.prefill_s([100])
    # Admitted at a step boundary of the first request's decode, long before its end.
    steps_before = [
        k for k in range(61) if started == pytest.approx(prefill + perf.decode_steps_s(1, 101, k))
    ]
    assert len(steps_before) == 1
    assert 1 <= steps_before[0] < 40
    # The first request then decodes alongside it, and still generates all its tokens.
    assert sink.token_counts == {"first": 61, "second": 2}
    assert _times(first)[2] > _times(second)[2]


async def test_preempting_a_request_ends_the_decode_group(
    perf: PerformanceModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emulated_llm, "GROUP_MAX_WALL_S", 10.0)
    scale = perf.decode_step_s(2, 400) / 0.005
    backend = EmulatedLlmBackend(perf, time_scale=scale)
    queue, sink, wake = LocalQueue(), Sink(), asyncio.Event()
    _enqueue(backend, queue, _assignment("stays", prompt=100, output=61, order=1))
    _enqueue(backend, queue, _assignment("moves", prompt=100, output=61, order=2))
    engine = asyncio.create_task(_run_with_wake(backend, queue, sink, wake))
    await asyncio.sleep(0.03)
    preemption = backend.preempt("moves")
    assert preemption is not None
    # The group in progress ended at its next step: the one left decodes alone from
    # there, so it finishes sooner than if the two had shared every one of its steps.
    shared_to_end = perf.prefill_s([100, 100]) + perf.decode_steps_s(2, 202, 60)
    await engine
    assert "moves" not in sink.results
    assert sink.token_counts["stays"] == 61
    assert backend.modelled_now_s < shared_to_end
