"""Admission of pipeline calls with LLM stages (pure): an LLM stage finishes on the live
LLM worker of its model that finishes it soonest, after the work its heartbeat holds and
its service alone on that worker's performance profile; a stage no live worker serves is
not judged; a pipeline of LLM stages alone needs no multi-model worker."""

from __future__ import annotations

from switchyard.cluster import ClusterView
from switchyard.contracts.messages import Heartbeat
from switchyard.multimodel.model import LlmStage, PipelineSpec, Stage
from switchyard.perf.profiles import performance_model

from services.ingress.load_shedding import Verdict
from services.ingress.pipeline_admission import PipelineGate
from tests.unit.test_pipeline_admission import MODELS, NOW, beat, every_model, record

SMALL = "a100-80gb/llama-2-7b"
LARGE = "h100-80gb/llama-2-13b"
INPUT_TOKENS = 200

DRAFT_VERIFY = PipelineSpec(
    name="dv",
    stages=(
        Stage(name="draft", model="llama-2-7b", llm=LlmStage(output_tokens=128)),
        Stage(
            name="verify",
            model="llama-2-13b",
            after=("draft",),
            llm=LlmStage(output_tokens=1, choices=(("accept", 0.5), ("reject", 0.5))),
        ),
    ),
    slo_s=30.0,
)
# The draft's prompt is the input; the verifier's is the input and the draft.
IDLE_PATH_S = performance_model(SMALL).idle_service_s(INPUT_TOKENS, 128) + performance_model(
    LARGE
).idle_service_s(INPUT_TOKENS + 128, 1)


def llm_beat(worker_id: str, profile: str, *, queued_work_s: float = 0.0) -> Heartbeat:
    return beat(worker_id, backend="emulated-llm").model_copy(
        update={
            "profile": profile,
            "servable_models": [performance_model(profile).model],
            "queued_work_s": queued_work_s,
        }
    )


def gate_seeing(*heartbeats: Heartbeat) -> PipelineGate:
    gate = PipelineGate(MODELS, grace_s=10.0, worker_timeout_s=2.0)
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


def test_llm_stages_are_judged_on_their_workers_profiles_with_no_multi_model_worker() -> None:
    workers = (llm_beat("small", SMALL), llm_beat("large", LARGE))
    assert IDLE_PATH_S > 1.0
    assert judge(gate_seeing(*workers), DRAFT_VERIFY, IDLE_PATH_S + 0.01, "fits") is Verdict.ADMIT
    # Work held on the larger model's worker pushes the path past a deadline it met idle.
    busy = (llm_beat("small", SMALL), llm_beat("large", LARGE, queued_work_s=IDLE_PATH_S + 5.0))
    assert judge(gate_seeing(*busy), DRAFT_VERIFY, IDLE_PATH_S + 1.0, "late") is (
        Verdict.OVERLOADED
    )
    # ... unless another worker of that model is idle: the soonest finish counts.
    spare = (*busy, llm_beat("large-2", LARGE))
    assert judge(gate_seeing(*spare), DRAFT_VERIFY, IDLE_PATH_S + 1.0, "spare") is Verdict.ADMIT


def test_the_time_scale_of_an_emulated_llm_worker_divides_its_service() -> None:
    def scaled(heartbeat: Heartbeat) -> Heartbeat:
        return heartbeat.model_copy(update={"time_scale": 10.0})

    deadline_s = IDLE_PATH_S / 10.0 + 0.01
    fast = (scaled(llm_beat("small", SMALL)), scaled(llm_beat("large", LARGE)))
    assert judge(gate_seeing(*fast), DRAFT_VERIFY, deadline_s, "scaled") is Verdict.ADMIT
    fast_busy = (
        scaled(llm_beat("small", SMALL)),
        scaled(llm_beat("large", LARGE, queued_work_s=1)),
    )
    assert judge(gate_seeing(*fast_busy), DRAFT_VERIFY, deadline_s, "held") is Verdict.OVERLOADED
    # Unscaled and idle the same call is late even idle and waits behind no one: admitted
    # (it delays nobody), as for model stages.
    slow = (llm_beat("small", SMALL), llm_beat("large", LARGE))
    assert judge(gate_seeing(*slow), DRAFT_VERIFY, deadline_s, "unscaled") is Verdict.ADMIT


def test_an_llm_stage_no_live_worker_serves_is_not_judged() -> None:
    verify_s = performance_model(LARGE).idle_service_s(INPUT_TOKENS + 128, 1)
    deadline_s = verify_s + 0.01
    # With the smaller model's worker up and busy, the draft is judged: refused.
    busy = (llm_beat("small", SMALL, queued_work_s=100.0), llm_beat("large", LARGE))
    assert judge(gate_seeing(*busy), DRAFT_VERIFY, deadline_s, "judged") is Verdict.OVERLOADED
    # Without it, the draft waits for the scheduler, unjudged; the verifier is judged.
    alone = gate_seeing(llm_beat("large", LARGE))
    assert judge(alone, DRAFT_VERIFY, deadline_s, "unjudged") is Verdict.ADMIT
    alone = gate_seeing(llm_beat("large", LARGE, queued_work_s=1.0))
    assert judge(alone, DRAFT_VERIFY, deadline_s, "verify-late") is Verdict.OVERLOADED
    assert judge(gate_seeing(), DRAFT_VERIFY, 0.001, "nobody") is Verdict.ADMIT


def test_a_classifier_in_front_of_an_llm_stage_counts_both_and_needs_a_multi_model_worker() -> None:
    triage = PipelineSpec(
        name="triage",
        stages=(
            Stage(name="classify", model="chk"),
            Stage(
                name="answer",
                model="llama-2-7b",
                after=("classify",),
                llm=LlmStage(output_tokens=64),
            ),
        ),
        slo_s=30.0,
    )
    # The LLM worker's 5 s of held work overlaps the classifier's 1 s.
    path_s = 5.0 + performance_model(SMALL).idle_service_s(INPUT_TOKENS, 64)
    gate = gate_seeing(beat("m1", *every_model(chk=0)), llm_beat("small", SMALL, queued_work_s=5.0))
    assert judge(gate, triage, path_s + 0.01, "fits") is Verdict.ADMIT
    gate = gate_seeing(beat("m1", *every_model(chk=0)), llm_beat("small", SMALL, queued_work_s=5.0))
    assert judge(gate, triage, path_s - 0.1, "late") is Verdict.OVERLOADED
    # No multi-model worker for the classifier: 503 once the grace period is over.
    llm_only = gate_seeing(llm_beat("small", SMALL))
    decision = llm_only.decide(
        triage, exec_scale=1.0, arrival_s=NOW + 11.0, deadline_s=NOW + 60.0, now_s=NOW + 11.0,
        call_id="no-models", input_tokens=INPUT_TOKENS,
    )  # fmt: skip
    assert decision.verdict is Verdict.NO_WORKER
