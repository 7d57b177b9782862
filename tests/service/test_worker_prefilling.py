"""The emulated LLM worker reports the prompt tokens of the prefill in progress (the
heartbeat's ``prefilling_tokens``), which Switchyard's policy counts as time ahead of a
newcomer: while two prompts prefill together both count, once their first tokens are out
none does, and a worker that prefills in chunks reports none."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.perf import performance_model

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.queue import LocalQueue, WorkItem
from tests.service.test_worker_emulated import PROFILE, SCALE, _assignment, _enqueue, _run_all
from tests.support.worker import Sink


class _Reading(Sink):
    """Reads the backend's load when requests start and when their first tokens come."""

    def __init__(self, backend: EmulatedLlmBackend) -> None:
        super().__init__()
        self.backend = backend
        self.at_start: list[int] = []
        self.at_first_token: list[int] = []

    async def started(self, items: Sequence[WorkItem]) -> None:
        await super().started(items)
        self.at_start.append(self.backend.load([]).prefilling_tokens)

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        if item.request_id not in self.token_counts:
            self.at_first_token.append(self.backend.load([]).prefilling_tokens)
        await super().tokens(item, new_tokens, text)


async def _readings(chunked: int | None) -> _Reading:
    backend = EmulatedLlmBackend(
        performance_model(PROFILE), time_scale=SCALE, chunked_prefill_tokens=chunked
    )
    queue, sink = LocalQueue(), _Reading(backend)
    _enqueue(backend, queue, _assignment("a", prompt=3_000, output=4, order=0))
    _enqueue(backend, queue, _assignment("b", prompt=1_000, output=4, order=1))
    await _run_all(backend, queue, sink)
    assert set(sink.results) == {"a", "b"}
    return sink


async def test_a_whole_prompt_prefill_is_reported_until_its_first_token() -> None:
    sink = await _readings(chunked=None)
    assert sink.at_start == [4_000]  # admitted together: one prefill of both prompts
    assert sink.at_first_token == [0, 0]  # the prefill ended before their tokens came
    assert EmulatedLlmBackend(performance_model(PROFILE)).load([]).prefilling_tokens == 0


async def test_a_worker_that_prefills_in_chunks_reports_none() -> None:
    sink = await _readings(chunked=512)
    assert sink.at_start
    assert set(sink.at_start) == {0}
