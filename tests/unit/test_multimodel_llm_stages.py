"""LLM stages in the multi-model simulator: each LLM application's workers simulated with
continuous batching over the performance model, placed by a registered LLM policy."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.multimodel.model import (
    LlmStage,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    WorkerSpec,
    Workload,
)
from switchyard.multimodel.policy_registry import make_multimodel_policy
from switchyard.perf import performance_model
from switchyard.serving.pipelines import ASSISTANT_MODELS, ASSISTANT_PIPELINES

from bench.llm_pipeline_bench import arrivals, simulate_mode
from research.multimodel.llm_stages import LlmWorkers
from research.multimodel.run import MultiModelResult
from research.multimodel.simulator import (
    MultiModelSimConfig,
    SimulationInputError,
    simulate_multimodel,
)

SMALL = "a100-80gb/llama-2-7b"
LARGE = "a100-80gb/llama-2-13b"
ANSWER = PipelineSpec(
    name="answer",
    stages=(Stage(name="answer", model="llama-2-7b", llm=LlmStage(output_tokens=64)),),
    slo_s=60.0,
)
BOTH = (LlmWorkers("llama-2-7b", (SMALL,)), LlmWorkers("llama-2-13b", (LARGE,)))


def _run(
    pipeline: PipelineSpec,
    arrivals_s: Sequence[float],
    llm_workers: Sequence[LlmWorkers] = BOTH,
    *,
    workers: Sequence[WorkerSpec] = (),
    input_tokens: int = 200,
    seed: int = 0,
    llm_policy: str = "jsq",
) -> MultiModelResult:
    requests = tuple(
        MultiModelRequest(f"c{i}", at_s, pipeline.name, input_tokens=input_tokens)
        for i, at_s in enumerate(arrivals_s)
    )
    workload = Workload(
        name="w", models=ASSISTANT_MODELS, pipelines={pipeline.name: pipeline}, requests=requests
    )
    policy = make_multimodel_policy("adaptive")
    config = MultiModelSimConfig(seed=seed, llm_policy=llm_policy)
    return simulate_multimodel(
        workload, workers, policy.placement, policy.router, config, llm_workers
    )


def test_a_lone_llm_stage_takes_its_idle_service_time_on_the_profile() -> None:
    result = _run(ANSWER, [0.0])
    idle_s = performance_model(SMALL).idle_service_s(200, 64)
    assert result.finished == (True,)
    assert result.latencies_s[0] == pytest.approx(idle_s, rel=1e-9)
    assert result.stages_run == 1


def test_calls_that_arrive_together_share_a_batch_instead_of_queueing() -> None:
    idle_s = performance_model(SMALL).idle_service_s(200, 64)
    result = _run(ANSWER, [0.0] * 8)
    # Served one after another the last would take 8 times as long; batched, each decode
    # step serves all eight, so every call ends a little later than alone.
    assert all(idle_s < latency < 1.5 * idle_s for latency in result.latencies_s)


def test_the_llm_policy_spreads_stages_over_the_applications_workers() -> None:
    one = _run(ANSWER, [0.0] * 40, (LlmWorkers("llama-2-7b", (SMALL,)),))
    two = _run(ANSWER, [0.0] * 40, (LlmWorkers("llama-2-7b", (SMALL, SMALL)),))
    assert max(two.latencies_s) < max(one.latencies_s)
    busy = two.llm_worker_busy_s
    assert set(busy) == {"llama-2-7b/0", "llama-2-7b/1"}
    assert busy["llama-2-7b/0"] == pytest.approx(busy["llama-2-7b/1"], rel=0.05)


def test_a_rejected_draft_is_revised_by_the_larger_model_and_an_accepted_one_is_not() -> None:
    pipeline = ASSISTANT_PIPELINES["draft-verify"]
    calls = 400
    result = _run(pipeline, [100.0 * i for i in range(calls)])  # never two at once
    small, large = performance_model(SMALL), performance_model(LARGE)
    draft_s = small.idle_service_s(200, 128)
    verify_s = large.idle_service_s(200 + 128, 1)
    revise_s = large.idle_service_s(200 + 128 + 1, 128)
    revised = result.stages_run - 2 * calls
    # The verifier accepts 70 % of drafts (the stage's choices), drawn by the run's seed.
    assert 0.25 < revised / calls < 0.35
    accepted_s, rejected_s = draft_s + verify_s, draft_s + verify_s + revise_s
    for latency in result.latencies_s:
        assert latency == pytest.approx(accepted_s, rel=1e-9) or latency == pytest.approx(
            rejected_s, rel=1e-9
        )
    assert sum(lat == pytest.approx(rejected_s, rel=1e-9) for lat in result.latencies_s) == revised


def test_a_classifier_stage_on_placed_models_routes_to_one_of_two_llms() -> None:
    node = WorkerSpec(worker_id="n0", gpu_type="a100", capacity=ResourceVector(8.0, 1.0, 64.0))
    calls = 200
    result = _run(ASSISTANT_PIPELINES["triage"], [2.0 * i for i in range(calls)], workers=[node])
    assert all(result.finished)
    assert result.stages_run == 2 * calls  # the classifier and one branch each
    busy = result.llm_worker_busy_s
    assert busy["llama-2-7b/0"] > 0
    assert busy["llama-2-13b/0"] > 0


def test_one_seed_gives_one_result_and_another_seed_other_verdicts() -> None:
    pipeline = ASSISTANT_PIPELINES["draft-verify"]
    arrivals = [0.25 * i for i in range(200)]
    first, again = _run(pipeline, arrivals), _run(pipeline, arrivals)
    other = _run(pipeline, arrivals, seed=1)
    assert first.latencies_s == again.latencies_s
    assert first.latencies_s != other.latencies_s


def test_llm_stages_need_no_multi_model_workers_but_model_stages_do() -> None:
    assert _run(ANSWER, [0.0]).worker_ids == ()
    with pytest.raises(SimulationInputError, match="no workers to simulate"):
        _run(ASSISTANT_PIPELINES["triage"], [0.0])


@pytest.mark.parametrize(
    ("llm_workers", "llm_policy", "message"),
    [
        ((LlmWorkers("llama-2-7b", ("a100-80gb/nope",)),), "jsq", "'llama-2-7b': unknown"),
        ((LlmWorkers("llama-2-7b", ()),), "jsq", "'llama-2-7b' has no workers"),
        ((*BOTH, LlmWorkers("llama-2-7b", (SMALL,))), "jsq", "given workers twice"),
        (BOTH, "nope", "LLM stages: unknown policy 'nope'"),
    ],
)
def test_bad_llm_workers_are_refused_by_name(
    llm_workers: Sequence[LlmWorkers], llm_policy: str, message: str
) -> None:
    with pytest.raises(SimulationInputError, match=message):
        _run(ANSWER, [0.0], llm_workers, llm_policy=llm_policy)


def test_the_llm_pipeline_bench_simulates_both_modes_on_its_own_arrivals() -> None:
    times_s = arrivals(1.0, 30.0, seed=0)
    alone = simulate_mode("llama-2-13b", times_s, 200, run="1")
    cascade = simulate_mode("draft-verify", times_s, 200, run="1")
    triage = simulate_mode("triage", times_s, 200, run="1")  # its warm-up call left out
    assert len(alone) == len(cascade) == len(triage) == len(times_s)
    # The classifier's 0.05 model seconds, then the 7b model's answer or the 13b model's.
    small = performance_model(SMALL).idle_service_s(200, 128)
    assert small < triage[0] < 1.1 * small
    large = performance_model(LARGE).idle_service_s(200, 128)
    # At one call a model second the 13b model alone is nearly idle: about its idle time.
    assert large <= alone[len(alone) // 2] < 1.1 * large
    # An accepted draft answers sooner than the larger model alone; a rejected one later.
    assert cascade[0] < alone[0]
    assert cascade[-1] > alone[-1]


def test_labels_drawn_from_request_ids_take_the_live_calls_branches() -> None:
    pipeline = ASSISTANT_PIPELINES["draft-verify"]
    calls = 100
    requests = tuple(
        MultiModelRequest(f"run-{i}", 100.0 * i, pipeline.name, input_tokens=200)
        for i in range(calls)
    )
    workload = Workload(
        name="w", models=ASSISTANT_MODELS, pipelines={pipeline.name: pipeline}, requests=requests
    )
    policy = make_multimodel_policy("adaptive")
    results = [
        simulate_multimodel(
            workload,
            (),
            policy.placement,
            policy.router,
            MultiModelSimConfig(seed=seed, labels_from_ids=True),
            BOTH,
        )
        for seed in (0, 1)
    ]
    # The emulated verifier's verdict for a stage is label_at(choices, unit_of(its id)).
    verdicts = pipeline.stages[1].llm
    assert verdicts is not None
    rejected = [
        label_at(verdicts.choices, unit_of(f"run-{i}.verify")) == "reject" for i in range(calls)
    ]
    accepted_s = min(results[0].latencies_s)
    for result in results:  # the seed no longer decides the branches
        revised = [latency > 1.5 * accepted_s for latency in result.latencies_s]
        assert revised == rejected
