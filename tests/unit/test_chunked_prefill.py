"""Chunked prefill in the simulator: what a user of ``--chunked-prefill`` would notice.

A long prompt that arrives while short requests decode stalls their tokens for its
whole prefill without chunking; with chunking the running requests keep getting a token
every iteration and the long prompt's first token comes later. Nothing is lost either
way, and with the option off the simulator is what it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from switchyard.contracts.messages import WorkloadType
from switchyard.perf import performance_model
from switchyard.policies import make_llm_policy
from switchyard.policies.snapshot import RequestView, WorkerRole
from switchyard.traces import TraceRequest, resolve_trace, scale_load

from bench.capacity_eval import chunked_settings
from research.llm import RunMetrics, SimulationConfig, SimulationError, Simulator
from research.llm.chunked import ChunkedInstance
from research.llm.command import main as simulate_main
from research.llm.instance import Phase, SimInstance, worker_view
from research.llm.request import SimRequest
from tests.unit.test_simulator import Row
from tests.unit.test_simulator_golden import GOLDEN, _request_line

A100 = "a100-80gb/llama-2-7b"
LONG_PROMPT = 16_000


def simulate(
    rows: Sequence[Row] | Sequence[TraceRequest],
    chunked: int | None,
    policy: str = "jsq",
    **config: Any,
) -> tuple[Simulator, RunMetrics]:
    sim = Simulator(
        make_llm_policy(policy),
        SimulationConfig(**{"workers": 1, "chunked_prefill_tokens": chunked, **config}),
    )
    return sim, sim.run(rows)


def _request(index: int, arrival_s: float, prompt_tokens: int, output_tokens: int) -> SimRequest:
    service_s = performance_model(A100).idle_service_s(prompt_tokens, output_tokens)
    view = RequestView(
        request_id=f"r{index}",
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        workload=WorkloadType.CONVERSATION,
        model="llama-2-7b",
        calibrated_s={A100: service_s},
    )
    return SimRequest(
        index=index,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        workload=WorkloadType.CONVERSATION,
        view=view,
        slo_s=10 * service_s,
    )


def longest_decode_stall_s(inst: SimInstance, arrivals: Sequence[SimRequest]) -> float:
    """Drive one instance through ``arrivals`` (at their arrival times) to the end; the
    longest stretch of time in which it had a running batch and no decode step ended."""
    pending = sorted(arrivals, key=lambda r: r.arrival_s)
    now_s = 0.0
    last_s, last_steps, longest_s = 0.0, 0, 0.0
    while True:
        wake_s = inst.next_wake_s(now_s)
        if pending and (wake_s is None or pending[0].arrival_s < wake_s):
            request = pending.pop(0)
            now_s = request.arrival_s
            inst.enqueue(request, now_s)
            continue
        if wake_s is None:
            return longest_s
        was_running = inst.n_running > 0
        now_s = wake_s
        inst.wake(now_s)
        steps = inst.steps_done - last_steps
        if steps:
            # The steps since the last record ended by the anchor, evenly enough (a
            # batch that did not change): the gap between two of them.
            longest_s = max(longest_s, (inst.anchor_s - last_s) / steps)
            last_s, last_steps = inst.anchor_s, inst.steps_done
        elif was_running:
            longest_s = max(longest_s, now_s - last_s)  # no token yet: a stall so far
        else:
            last_s = now_s


# -- the model of a mixed iteration ------------------------------------------------------


def test_a_mixed_iteration_is_a_prefill_or_a_decode_step_when_it_holds_only_one() -> None:
    perf = performance_model(A100)
    assert perf.mixed_iteration_s([], 12, 6_000) == perf.decode_step_s(12, 6_000)
    assert perf.mixed_iteration_s([(0, 700), (0, 300)], 0, 0) == perf.prefill_s([700, 300])
    assert perf.mixed_iteration_s([], 0, 0) == 0.0
    # Decodes riding along add their decode terms and no second fixed time.
    mixed_s = perf.mixed_iteration_s([(0, 512)], 8, 4_000)
    assert mixed_s == pytest.approx(
        perf.prefill_s([512]) + perf.decode_step_s(8, 4_000) - perf.decode_base_s
    )
    with pytest.raises(ValueError, match="non-negative"):
        perf.mixed_iteration_s([(-1, 10)], 0, 0)


def test_a_prompt_prefilled_in_chunks_costs_one_fixed_time_more_per_chunk() -> None:
    perf = performance_model(A100)
    chunks = [(k, min(512, LONG_PROMPT - k)) for k in range(0, LONG_PROMPT, 512)]
    total_s = sum(perf.mixed_iteration_s([chunk], 0, 0) for chunk in chunks)
    # The attention terms telescope to the whole prompt's square.
    expected_s = perf.prefill_s([LONG_PROMPT]) + (len(chunks) - 1) * perf.prefill_base_s
    assert total_s == pytest.approx(expected_s, rel=1e-12)


# -- what a user notices -------------------------------------------------------------------


def test_a_long_prompt_stalls_running_decodes_only_without_chunking() -> None:
    perf = performance_model(A100)

    def arrivals() -> list[SimRequest]:
        shorts = [_request(i, 0.0, 300, 400) for i in range(4)]
        return [*shorts, _request(4, 1.0, LONG_PROMPT, 20)]

    plain = longest_decode_stall_s(SimInstance(0, "w0", perf, WorkerRole.MIXED), arrivals())
    assert plain >= perf.prefill_s([LONG_PROMPT])  # about 1.5 s without a token
    for budget in (512, 2048):
        chunked = ChunkedInstance(0, "w0", perf, WorkerRole.MIXED, budget=budget)
        stall_s = longest_decode_stall_s(chunked, arrivals())
        # At most one mixed iteration: a chunk of the budget at the end of the prompt.
        bound_s = perf.mixed_iteration_s([(LONG_PROMPT - budget, budget)], 4, 4 * 800)
        assert stall_s <= bound_s < plain / 5
        assert chunked.iterations >= LONG_PROMPT // budget


def test_a_short_answer_about_to_finish_is_not_held_up_by_a_long_prefill() -> None:
    perf = performance_model(A100)
    # The short request is a few tokens from its end when the long prompt arrives.
    alone_s = perf.idle_service_s(300, 60)
    rows = [Row(0.0, 300, 60), Row(alone_s - 0.05, LONG_PROMPT, 20)]

    def short_finish_s(chunked: int | None) -> float:
        sim, metrics = simulate(rows, chunked)
        assert metrics.completed == 2
        return next(r.finished_s for r in sim.completed if r.prompt_tokens == 300)

    held_s = short_finish_s(None) - alone_s
    assert held_s > perf.prefill_s([LONG_PROMPT]) - 0.1  # held up for the whole prefill
    # A few tokens, each one iteration with a chunk: a 512-token chunk is short, a
    # 2048-token one (with its attention over up to 16,000 tokens) much less so.
    assert short_finish_s(512) - alone_s < held_s / 4
    assert short_finish_s(2048) - alone_s < held_s / 2


def test_the_long_prompt_gets_its_first_token_later_the_smaller_the_budget() -> None:
    perf = performance_model(A100)
    rows = [Row(0.0, 300, 400), Row(0.0, 300, 400), Row(1.0, LONG_PROMPT, 20)]

    def long_ttft_s(chunked: int | None) -> float:
        sim, _ = simulate(rows, chunked)
        long = next(r for r in sim.completed if r.prompt_tokens == LONG_PROMPT)
        return long.first_token_s - long.arrival_s

    plain, big, small = long_ttft_s(None), long_ttft_s(2048), long_ttft_s(512)
    assert perf.prefill_s([LONG_PROMPT]) <= plain < big < small
    # 512-token chunks: about 32 iterations, each with its fixed time and the decodes.
    assert small - plain > 30 * perf.prefill_base_s


def test_a_lone_request_is_prefilled_in_budget_sized_chunks() -> None:
    perf = performance_model(A100)
    sim, _ = simulate([Row(0.0, 400, 3)], 512)
    (request,) = sim.completed
    assert request.first_token_s == perf.prefill_s([400])  # one chunk: the plain prefill
    assert request.finished_s == pytest.approx(
        perf.idle_service_s(400, 3), rel=1e-12
    )  # then decodes in closed form, as without chunking

    sim, _ = simulate([Row(0.0, 1_300, 1)], 512)
    (request,) = sim.completed
    chunks = [(0, 512), (512, 512), (1_024, 276)]
    assert request.first_token_s == pytest.approx(
        sum(perf.mixed_iteration_s([chunk], 0, 0) for chunk in chunks), rel=1e-12
    )


def test_a_cached_prefix_is_not_prefilled_again_under_chunking() -> None:
    blocks = tuple(range(40))  # 40 blocks of a shared prefix
    rows = [
        Row(0.0, 40 * 512, 2, prefix_blocks=blocks),
        Row(10.0, 40 * 512, 2, prefix_blocks=blocks),
    ]
    sim, _ = simulate(rows, 512)
    first, second = sorted(sim.completed, key=lambda r: r.arrival_s)
    inst = sim.instances[0]
    assert isinstance(inst, ChunkedInstance)
    assert inst.prefilled_tokens == first.prompt_tokens + 1  # the second: its last token
    assert second.first_token_s - second.arrival_s < 0.1 < first.first_token_s


# -- conservation ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_conv() -> Sequence[TraceRequest]:
    return scale_load(resolve_trace("azure-conv-sample"), 6.0).requests[:300]


@pytest.mark.parametrize(("policy", "workers"), [("jsq", 2), ("llumnix", 2), ("splitwise", 4)])
@pytest.mark.parametrize("budget", [256, 2048])
def test_every_request_completes_and_every_prompt_token_is_prefilled_once(
    busy_conv: Sequence[TraceRequest], policy: str, workers: int, budget: int
) -> None:
    sim, metrics = simulate(busy_conv, budget, policy, workers=workers)
    assert metrics.completed + metrics.rejected + metrics.refused == metrics.requests == 300
    assert metrics.rejected == metrics.refused == 0
    prefilled = 0
    for inst in sim.instances:
        assert isinstance(inst, ChunkedInstance)
        assert inst.phase is Phase.IDLE
        assert not inst.waiting
        assert not inst.prefilling
        assert inst.n_running == 0
        assert inst.reserved_tokens == inst.prefill_tokens == inst.kv_tokens() == 0
        prefilled += inst.prefilled_tokens
    # No prefix blocks in this trace, and a migrated or handed-off request brings its KV.
    assert prefilled == sum(r.prompt_tokens for r in sim.completed)
    for r in sim.completed:
        assert r.arrival_s <= r.started_s <= r.prefill_s < r.first_token_s <= r.finished_s


def test_chunked_prefill_off_is_the_simulator_as_it_was() -> None:
    # The golden case jsq-conv-x6, with the option given as off explicitly.
    rows = scale_load(resolve_trace("azure-conv-sample"), 6.0).requests
    sim = Simulator(
        make_llm_policy("jsq"),
        SimulationConfig(workers=4, seed=3, chunked_prefill_tokens=None),
    )
    sim.run(rows)
    assert all(type(inst) is SimInstance for inst in sim.instances)
    lines = [_request_line(r) for r in sim.completed]
    lines.append(
        f"requests={len(rows)} completed={len(sim.completed)} migrations={sim.migrations} "
        f"migration_cost={round(sim.migration_cost_s, 9):.9f} decisions={sim.decisions}"
    )
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == GOLDEN["jsq-conv-x6"]


# -- bad settings ------------------------------------------------------------------------


def test_a_bad_budget_fails_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SimulationError, match="positive number of tokens"):
        SimulationConfig(workers=1, chunked_prefill_tokens=0)
    with pytest.raises(SimulationError, match="256 batch slots"):
        Simulator(make_llm_policy("jsq"), SimulationConfig(workers=1, chunked_prefill_tokens=100))
    assert simulate_main(["--chunked-prefill", "100", "--policies", "jsq", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--chunked-prefill: " in err
    assert "at least the 256 batch slots" in err
    assert err.count("\n") == 1
    assert chunked_settings("off, 512,2048") == [None, 512, 2048]
    with pytest.raises(ValueError, match="off or token budgets"):
        chunked_settings("0")


def test_policies_see_a_whole_prompt_prefill_in_progress_and_no_chunks() -> None:
    perf = performance_model(A100)
    whole = SimInstance(0, "w0", perf, WorkerRole.MIXED)
    whole.enqueue(_request(0, 0.0, 3_000, 4), 0.0)
    whole.wake(0.0)
    assert whole.phase is Phase.PREFILL
    assert worker_view(whole, None).prefilling_tokens == 3_000
    whole.wake(whole.busy_until_s)  # the first token: decoding
    assert worker_view(whole, None).prefilling_tokens == 0
    chunked = ChunkedInstance(0, "w0", perf, WorkerRole.MIXED, budget=512)
    chunked.enqueue(_request(0, 0.0, 3_000, 4), 0.0)
    chunked.wake(0.0)
    first_chunk_s = chunked.next_wake_s(0.0)
    assert first_chunk_s is not None
    chunked.wake(first_chunk_s)
    assert chunked.prefill_tokens > 0  # its first chunk's KV, not an iteration's prompts
    assert worker_view(chunked, 512).prefilling_tokens == 0
