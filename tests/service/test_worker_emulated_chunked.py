"""Chunked prefill on the emulated LLM worker (``SWITCHYARD_WORKER_CHUNKED_PREFILL_TOKENS``).

What a user of the option notices: a long prompt no longer stalls the requests already
decoding (they keep getting a token every iteration), its own first token comes later,
and the worker's times are the simulator's with the same option, so a live run and a
simulation of it can be compared. Durations are on the backend's modelled clock.
"""

from __future__ import annotations

import itertools

import pytest
from switchyard.config import load_settings
from switchyard.errors import ConfigError
from switchyard.perf import PerformanceModel, performance_model
from switchyard.policies import make_llm_policy

from research.llm import SimulationConfig, Simulator
from services.worker.backends import build_backend
from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.queue import LocalQueue, WorkItem
from tests.service.test_worker_emulated import PROFILE, SCALE, _assignment, _enqueue, _run_all
from tests.support.worker import Sink
from tests.unit.test_simulator import Row

BUDGET = 512
LONG_PROMPT = 16_000


class TimedSink(Sink):
    """Also records the modelled time of every token a request is given."""

    def __init__(self, backend: EmulatedLlmBackend) -> None:
        super().__init__()
        self.backend = backend
        self.token_times: dict[str, list[float]] = {}

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        await super().tokens(item, new_tokens, text)
        self.token_times.setdefault(item.request_id, []).extend(
            [self.backend.modelled_now_s] * new_tokens
        )


@pytest.fixture
def perf() -> PerformanceModel:
    return performance_model(PROFILE)


def _first_and_finish(item: WorkItem) -> tuple[float, float]:
    times = item.emulated
    assert times is not None
    assert times.first_token_s is not None
    assert times.finished_s is not None
    return times.first_token_s, times.finished_s


async def test_the_worker_keeps_the_simulators_times_under_chunked_prefill(
    perf: PerformanceModel,
) -> None:
    # Prompts longer than the budget, outputs of different lengths: chunks of one prompt
    # span iterations, decodes ride along, and a finish frees room. All arrive at once;
    # the simulator starts the first alone (arrivals are events, one after the other)
    # and admits the rest when that iteration ends, so the worker is given them so too.
    rows = [(100, 6), (3_000, 4), (700, 30), (40, 2), (1_500, 12), (9_000, 3)]
    backend = EmulatedLlmBackend(perf, time_scale=SCALE, chunked_prefill_tokens=BUDGET)
    queue, sink = LocalQueue(), Sink()
    items = [_enqueue(backend, queue, _assignment("r0", prompt=100, output=6, order=0))]
    await backend.step(queue, sink, admit=True)
    items += [
        _enqueue(backend, queue, _assignment(f"r{i}", prompt=p, output=o, order=i))
        for i, (p, o) in enumerate(rows[1:], start=1)
    ]
    await _run_all(backend, queue, sink)

    sim = Simulator(
        make_llm_policy("jsq"),
        SimulationConfig(workers=1, profiles=(PROFILE,), chunked_prefill_tokens=BUDGET),
    )
    sim.run([Row(0.0, p, o) for p, o in rows])
    simulated = {r.index: (r.first_token_s, r.finished_s) for r in sim.completed}
    assert len(simulated) == len(rows)
    for index, item in enumerate(items):
        assert _first_and_finish(item) == pytest.approx(simulated[index], rel=1e-9)
        assert sink.token_counts[item.request_id] == rows[index][1]
    # The long prompt took many iterations; without chunking it takes one.
    assert backend.iterations > LONG_PROMPT // BUDGET // 2


async def _decode_then_long_prompt(
    perf: PerformanceModel, chunked: int | None
) -> tuple[TimedSink, WorkItem]:
    """A short request decoding when a long prompt comes; returns the sink and the
    long prompt's item once both finished."""
    backend = EmulatedLlmBackend(perf, time_scale=SCALE, chunked_prefill_tokens=chunked)
    queue, sink = LocalQueue(), TimedSink(backend)
    _enqueue(backend, queue, _assignment("short", prompt=200, output=60, order=0))
    await backend.step(queue, sink, admit=True)  # its prefill: the first token
    long = _enqueue(backend, queue, _assignment("long", prompt=LONG_PROMPT, output=2, order=1))
    await _run_all(backend, queue, sink)
    assert sink.token_counts == {"short": 60, "long": 2}
    return sink, long


def _longest_gap_s(times: list[float], until_s: float) -> float:
    """The longest wait between two tokens, up to the first token at or after
    ``until_s`` (the other prompt's first token: after it the two decode together,
    and a group of steps reports its tokens at once)."""
    times = [t for t in times if t < until_s] + [min(t for t in times if t >= until_s)]
    return max(later - earlier for earlier, later in itertools.pairwise(times))


async def test_a_long_prompt_no_longer_stalls_the_requests_decoding(
    perf: PerformanceModel,
) -> None:
    whole, long_whole = await _decode_then_long_prompt(perf, None)
    chunked, long_chunked = await _decode_then_long_prompt(perf, BUDGET)
    prefill_s = perf.prefill_s([LONG_PROMPT])
    # Without chunking the short request waits out the whole prefill between two tokens.
    until_s = _first_and_finish(long_whole)[0]
    assert _longest_gap_s(whole.token_times["short"], until_s) >= prefill_s
    # With it, a token comes every iteration: one chunk of the budget and a decode.
    until_s = _first_and_finish(long_chunked)[0]
    one_iteration_s = perf.mixed_iteration_s([(LONG_PROMPT - BUDGET, BUDGET)], 1, 260)
    assert _longest_gap_s(chunked.token_times["short"], until_s) <= one_iteration_s * 1.01
    assert one_iteration_s < prefill_s / 10
    # The price: the long prompt's first token comes later (a fixed time per chunk).
    assert _first_and_finish(long_chunked)[0] > _first_and_finish(long_whole)[0]


async def test_preempting_a_prompt_mid_prefill_reports_only_its_prefilled_chunks(
    perf: PerformanceModel,
) -> None:
    backend = EmulatedLlmBackend(perf, time_scale=SCALE, chunked_prefill_tokens=BUDGET)
    queue, sink = LocalQueue(), Sink()
    _enqueue(backend, queue, _assignment("long", prompt=4_000, output=3, order=0))
    _enqueue(backend, queue, _assignment("next", prompt=100, output=3, order=1))
    await backend.step(queue, sink, admit=True)
    await backend.step(queue, sink, admit=True)
    preemption = backend.preempt("long")
    assert preemption is not None
    assert preemption.kv_tokens == 2 * BUDGET  # two chunks, not the whole prompt
    assert backend.load(list(queue)).kv_used_tokens == 0  # its reservation is freed
    await _run_all(backend, queue, sink)
    assert sorted(sink.results) == ["next"]  # the queue goes on without it
    assert "long" not in sink.token_counts


async def test_the_setting_turns_it_on_and_a_budget_below_the_slots_is_refused(
    perf: PerformanceModel,
) -> None:
    settings = load_settings(
        {}, worker_profile=PROFILE, worker_time_scale=SCALE, worker_chunked_prefill_tokens=2048
    )
    backend = build_backend(settings, None)
    assert isinstance(backend, EmulatedLlmBackend)
    assert backend.chunked_prefill_tokens == 2048
    assert backend.load([]).chunked_prefill_tokens == 2048  # heartbeats tell the policies
    too_small = settings.model_copy(update={"worker_chunked_prefill_tokens": 8})
    with pytest.raises(ConfigError, match=r"CHUNKED_PREFILL_TOKENS: .*at least the \d+ batch"):
        build_backend(too_small, None)
    with pytest.raises(ValueError, match="at least 1 token"):
        EmulatedLlmBackend(perf, chunked_prefill_tokens=0)
