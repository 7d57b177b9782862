"""Admission of pipeline calls with LLM stages (pure): an LLM stage finishes on the live
LLM worker of its application's model that finishes it soonest, by the request gate's
estimate (continuous batches on the worker's profile: no wait while a slot is free,
the backlog's drain once the batch is full); a stage no live worker serves is not
judged; a pipeline of LLM stages alone needs no multi-model worker."""

from __future__ import annotations

import pytest
from switchyard.cluster import ClusterView
from switchyard.contracts.messages import Heartbeat
from switchyard.multimodel.model import LlmStage, PipelineSpec, Stage
from switchyard.perf.profiles import performance_model

from services.ingress.load_shedding import Demand, Verdict, estimate
from services.ingress.pipeline_admission import PipelineGate
from tests.unit.test_pipeline_admission import MODELS, NOW, beat, every_model, record

SMALL = "a100-80gb/llama-2-7b"
LARGE = "h100-80gb/llama-2-13b"
INPUT_TOKENS = 200
SLOTS = 4

# Application names differ from the served models', as in a registry.
LLM_MODELS = {"writer": "llama-2-7b", "judge": "llama-2-13b"}
DRAFT_VERIFY = PipelineSpec(
    name="dv",
    stages=(
        Stage(name="draft", model="writer", llm=LlmStage(output_tokens=128)),
        Stage(
            name="verify",
            model="judge",
            after=("draft",),
            llm=LlmStage(output_tokens=1, choices=(("accept", 0.5), ("reject", 0.5))),
        ),
    ),
    slo_s=30.0,
)


def llm_beat(
    worker_id: str, profile: str, *, running: int = 0, queued_work_s: float = 0.0
) -> Heartbeat:
    return beat(worker_id, backend="emulated-llm").model_copy(
        update={
            "profile": profile,
            "servable_models": [performance_model(profile).model],
            "max_slots": SLOTS,
            "running": running,
            "queued_work_s": queued_work_s,
        }
    )


def service_s(heartbeat: Heartbeat, prompt_tokens: int, output_tokens: int) -> float:
    """The request gate's service estimate of one stage on ``heartbeat``'s worker."""
    demand = Demand(
        kind="llm",
        model=heartbeat.servable_models[0],
        arrival_s=NOW,
        deadline_s=NOW,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )
    return estimate(demand, record(heartbeat), NOW).service_s


def gate_seeing(*heartbeats: Heartbeat) -> PipelineGate:
    gate = PipelineGate(MODELS, llm_models=LLM_MODELS, grace_s=10.0, worker_timeout_s=2.0)
    gate.observe(ClusterView(now_s=NOW, workers=tuple(record(h) for h in heartbeats)))
    return gate


def judge(gate: PipelineGate, pipeline: PipelineSpec, deadline_in_s: float, call: str) -> Verdict:
    return gate.decide(
        pipeline,
        exec_scale=1.0,
        arrival_s=NOW,
        deadline_s=NOW + deadline_in_s,
        now_s=NOW,
        call_id=call,
        input_tokens=INPUT_TOKENS,
    ).verdict


def test_llm_stages_follow_each_other_on_their_models_workers_with_no_multi_model_worker() -> None:
    small, large = llm_beat("small", SMALL), llm_beat("large", LARGE)
    # The draft's prompt is the input; the verifier's is the input and the draft.
    path_s = service_s(small, INPUT_TOKENS, 128) + service_s(large, INPUT_TOKENS + 128, 1)
    assert path_s > 1.0
    assert judge(gate_seeing(small, large), DRAFT_VERIFY, path_s + 0.01, "fits") is Verdict.ADMIT
    # Idle, the same call is late even so and waits behind no one: admitted (it delays
    # nobody), as for model stages.
    assert judge(gate_seeing(small, large), DRAFT_VERIFY, path_s - 0.1, "late") is Verdict.ADMIT


def test_a_full_batch_makes_a_stage_wait_for_the_backlog_and_a_free_worker_does_not() -> None:
    small = llm_beat("small", SMALL)
    full = llm_beat("large", LARGE, running=SLOTS, queued_work_s=20.0)
    path_s = service_s(small, INPUT_TOKENS, 128) + service_s(
        llm_beat("x", LARGE), INPUT_TOKENS + 128, 1
    )
    assert judge(gate_seeing(small, full), DRAFT_VERIFY, path_s + 1.0, "full") is (
        Verdict.OVERLOADED
    )
    # Busy but with a free slot, the verifier joins the batch at once.
    busy = llm_beat("large", LARGE, running=SLOTS - 1, queued_work_s=20.0)
    assert judge(gate_seeing(small, busy), DRAFT_VERIFY, path_s + 1.0, "slot") is Verdict.ADMIT
    # ... as it does on another worker of that model with room.
    spare = (small, full, llm_beat("large-2", LARGE))
    assert judge(gate_seeing(*spare), DRAFT_VERIFY, path_s + 1.0, "spare") is Verdict.ADMIT


def test_an_llm_stage_no_live_worker_serves_is_not_judged() -> None:
    large = llm_beat("large", LARGE)
    deadline_s = service_s(large, INPUT_TOKENS + 128, 1) + 0.01
    # With the smaller model's worker up and full, the draft is judged: refused.
    full = llm_beat("small", SMALL, running=SLOTS, queued_work_s=100.0)
    assert judge(gate_seeing(full, large), DRAFT_VERIFY, deadline_s, "judged") is (
        Verdict.OVERLOADED
    )
    # Without it, the draft waits for the scheduler, unjudged; the verifier is judged.
    assert judge(gate_seeing(large), DRAFT_VERIFY, deadline_s, "unjudged") is Verdict.ADMIT
    large_full = llm_beat("large", LARGE, running=SLOTS, queued_work_s=10.0)
    assert judge(gate_seeing(large_full), DRAFT_VERIFY, deadline_s, "verify-late") is (
        Verdict.OVERLOADED
    )
    assert judge(gate_seeing(), DRAFT_VERIFY, 0.001, "nobody") is Verdict.ADMIT


def test_a_classifier_in_front_of_an_llm_stage_counts_both_and_needs_a_multi_model_worker() -> None:
    triage = PipelineSpec(
        name="triage",
        stages=(
            Stage(name="classify", model="chk"),
            Stage(
                name="answer", model="writer", after=("classify",), llm=LlmStage(output_tokens=64)
            ),
        ),
        slo_s=30.0,
    )
    small = llm_beat("small", SMALL)
    path_s = MODELS["chk"].exec_s + service_s(small, INPUT_TOKENS, 64)
    models = beat("m1", *every_model())
    assert judge(gate_seeing(models, small), triage, path_s + 0.01, "fits") is Verdict.ADMIT
    # The classifier's queue delays the LLM stage behind it.
    queued = beat("m1", *every_model(chk=3))
    assert judge(gate_seeing(queued, small), triage, path_s + 0.01, "late") is Verdict.OVERLOADED
    # No multi-model worker for the classifier: 503 once the grace period is over.
    decision = gate_seeing(small).decide(
        triage, exec_scale=1.0, arrival_s=NOW + 11.0, deadline_s=NOW + 60.0, now_s=NOW + 11.0,
        call_id="no-models", input_tokens=INPUT_TOKENS,
    )  # fmt: skip
    assert decision.verdict is Verdict.NO_WORKER


def test_admitted_calls_llm_stages_count_on_their_workers_until_a_heartbeat_lists_them() -> None:
    small, large = llm_beat("small", SMALL), llm_beat("large", LARGE)
    gate = gate_seeing(small, large)
    path_s = service_s(small, INPUT_TOKENS, 128) + service_s(large, INPUT_TOKENS + 128, 1)
    for i in range(SLOTS):
        assert judge(gate, DRAFT_VERIFY, path_s + 1.0, f"c{i}") is Verdict.ADMIT
    # Nothing sent yet, but the four drafts to come take the small worker's four slots:
    # the next call's draft would wait for one.
    assert judge(gate, DRAFT_VERIFY, path_s + 1.0, "next") is Verdict.OVERLOADED
    # The drafts are sent, then a heartbeat sent well after them lists them (here: none
    # running, so they are done): they no longer count; the verdicts to come take the
    # large worker's slots, but each is short.
    for i in range(SLOTS):
        gate.stage_sent(f"c{i}", "draft", NOW)
    later = [h.model_copy(update={"sent_at_s": NOW + 1.0}) for h in (small, large)]
    gate.observe(ClusterView(now_s=NOW, workers=tuple(record(h) for h in later)))
    assert judge(gate, DRAFT_VERIFY, path_s + 1.0, "after") is Verdict.ADMIT
    # Calls that end take what they had still to come with them.
    gate.call_ended("after")
    for i in range(SLOTS):
        gate.call_ended(f"c{i}")
    assert gate.decide(
        DRAFT_VERIFY,
        exec_scale=1.0,
        arrival_s=NOW,
        deadline_s=NOW + path_s + 1.0,
        now_s=NOW,
        call_id="idle",
        input_tokens=INPUT_TOKENS,
    ).wait_s == pytest.approx(0.0, abs=1e-9)


def test_llm_stages_sent_are_shared_among_their_models_live_workers() -> None:
    small, large = llm_beat("small", SMALL), llm_beat("large", LARGE)
    gate = gate_seeing(small, llm_beat("small-2", SMALL), large)
    path_s = service_s(small, INPUT_TOKENS, 128) + service_s(large, INPUT_TOKENS + 128, 1)
    for i in range(SLOTS):
        assert judge(gate, DRAFT_VERIFY, path_s + 1.0, f"c{i}") is Verdict.ADMIT
        gate.stage_sent(f"c{i}", "draft", NOW)
    # Two drafts on each of two workers: a slot is still free on each.
    assert judge(gate, DRAFT_VERIFY, path_s + 1.0, "next") is Verdict.ADMIT
