"""The emulated LLM worker reports the share of its time spent prefilling (the
heartbeat's ``prefill_share``): high for a stream of prompts with short answers, low for
long answers, none when idle, whole prompts and chunked alike."""

from __future__ import annotations

import pytest
from switchyard.perf import PerformanceModel, performance_model

from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.queue import LocalQueue
from tests.service.test_worker_emulated import PROFILE, SCALE, _assignment, _enqueue, _run_all
from tests.support.worker import Sink


@pytest.fixture
def perf() -> PerformanceModel:
    return performance_model(PROFILE)


async def _share_after(
    perf: PerformanceModel, *, prompt: int, output: int, chunked: int | None = None
) -> float:
    """The share a heartbeat reports right after six such requests ran, read as if the
    wall time their modelled time takes had passed."""
    now = [0.0]
    backend = EmulatedLlmBackend(
        perf, time_scale=SCALE, chunked_prefill_tokens=chunked, clock=lambda: now[0]
    )
    queue, sink = LocalQueue(), Sink()
    assert backend.load([]).prefill_share == 0.0  # the first reading starts the measure
    for i in range(6):
        _enqueue(backend, queue, _assignment(f"r{i}", prompt=prompt, output=output, order=i))
    await _run_all(backend, queue, sink)
    now[0] = backend.wall_s(backend.modelled_now_s)
    return backend.load([]).prefill_share


async def test_prompts_with_short_answers_report_more_prefill_than_long_answers(
    perf: PerformanceModel,
) -> None:
    verdicts = await _share_after(perf, prompt=2_000, output=1)
    answers = await _share_after(perf, prompt=200, output=200)
    assert verdicts > 5 * answers > 0.0
    chunked = await _share_after(perf, prompt=2_000, output=1, chunked=512)
    assert chunked > 0.0


async def test_an_idle_worker_reports_no_prefill(perf: PerformanceModel) -> None:
    now = [0.0]
    backend = EmulatedLlmBackend(perf, time_scale=SCALE, clock=lambda: now[0])
    backend.load([])
    now[0] = 5.0
    assert backend.load([]).prefill_share == 0.0
