"""The goodput ceiling bench: a request's compute is its idle service less the fixed
times, and the clairvoyant admission refuses by the batch a request would join."""

from __future__ import annotations

import pytest
from switchyard.contracts.fields import WorkloadType
from switchyard.perf import performance_model
from switchyard.traces import TraceRequest

from bench.goodput_ceiling import ClairvoyantAdmission, ceilings_rps, compute_s
from tests.unit.test_policies import cluster, request, worker

A100 = "a100-80gb/llama-2-7b"


@pytest.mark.parametrize(("prompt", "output"), [(1, 1), (1000, 1), (1183, 254), (16_000, 40)])
def test_a_requests_compute_is_its_idle_service_less_every_iterations_fixed_time(
    prompt: int, output: int
) -> None:
    perf = performance_model(A100)
    fixed_s = perf.prefill_base_s + (output - 1) * perf.decode_base_s
    assert compute_s(perf, prompt, output) == pytest.approx(
        perf.idle_service_s(prompt, output) - fixed_s, rel=1e-12
    )


def test_the_ceiling_with_a_tenth_refused_leaves_out_the_costliest_requests() -> None:
    perf = performance_model(A100)
    chat = WorkloadType.CONVERSATION
    rows = [TraceRequest(float(i), 100, 10, chat) for i in range(9)]
    rows.append(TraceRequest(9.0, 8000, 2000, chat))
    every, cheapest = ceilings_rps(perf, rows, workers=4)
    small = compute_s(perf, 100, 10)
    assert cheapest == pytest.approx(4 / (0.9 * small))
    assert every == pytest.approx(4 / ((9 * small + compute_s(perf, 8000, 2000)) / 10))
    assert every < cheapest


def test_the_clairvoyant_admission_refuses_what_the_batch_would_make_late() -> None:
    # 200 output tokens at 12 ms a step alone (2.4 s); joining a batch of 100 makes each
    # step 32 ms (0.2 ms a sequence; 6.4 s in all), past 0.6 x a 10 s objective.
    admission = ClairvoyantAdmission({"r1": (200, 10.0)}, 0.6, inner=None)
    idle = worker("w1", prefill_base_s=0.012)
    busy = worker("w2", running=100, prefill_base_s=0.012)
    assert admission.admit(request(prompt_tokens=10), cluster(idle)) is None
    refusal = admission.admit(request(prompt_tokens=10), cluster(busy))
    assert refusal is not None
    assert "0.6 x 10.0 s" in refusal.reason
    # The best worker decides: an idle one beside the busy one takes it.
    assert admission.admit(request(prompt_tokens=10), cluster(busy, idle)) is None
