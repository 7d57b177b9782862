"""LLM stages of pipelines, apart from any worker: the registry's form and its errors,
the serving catalogue's checks, what an LLM stage asks for (its prompt, tokens and
choices), the call's answer (``answer``), and the multi-model simulator's refusal."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from switchyard.apps.pipelines import InvalidPipelineError, check_pipelines, registry_catalogue
from switchyard.apps.registry import RegistryError
from switchyard.apps.registry_file import load_registry
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    LLMResult,
    RequestTimeline,
    StageResult,
)
from switchyard.errors import ConfigError
from switchyard.multimodel.model import LlmStage, PipelineSpec, Stage
from switchyard.serving.artifacts import load_catalogue
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS
from switchyard.serving.pipelines import ASSISTANT_MODELS, ASSISTANT_PIPELINES

from research.multimodel.errors import SimulationInputError
from research.multimodel.sim_state import PipelineRun
from services.ingress.errors import ApiError
from services.ingress.pipeline_call import final_outputs
from services.ingress.pipeline_llm import (
    STAGE_INPUT_CHARS,
    llm_stage_payload,
    stage_inputs,
    stage_label,
    stage_output,
    stage_prompt,
)
from services.ingress.tokens import prompt_blocks


def _registry() -> dict[str, Any]:
    return {
        "models": {
            "router": {
                "resources": {"cpu": 1, "gpu": 0.1, "mem_gib": 2},
                "load_s": 1,
                "exec_s": 0.05,
                "labels": {"hard": 0.5, "easy": 0.5},
            }
        },
        "llm_applications": [
            {"name": "small", "model": "llama-2-7b", "slo_s": 30},
            {"name": "large", "model": "llama-2-13b", "slo_s": 60, "max_output_tokens": 256},
        ],
        "pipelines": [
            {
                "name": "draft-verify",
                "slo_s": 60,
                "stages": [
                    {"name": "draft", "llm": "small", "output_tokens": 64},
                    {
                        "name": "verify",
                        "llm": "large",
                        "after": ["draft"],
                        "choices": {"accept": 0.8, "reject": 0.2},
                    },
                    {
                        "name": "revise",
                        "llm": "large",
                        "after": ["draft", "verify"],
                        "when": {"stage": "verify", "label": "reject"},
                    },
                ],
                "answer": ["revise", "draft"],
            },
            {
                "name": "routed",
                "slo_s": 30,
                "stages": [
                    {"name": "route", "model": "router"},
                    {
                        "name": "big",
                        "llm": "large",
                        "after": ["route"],
                        "when": {"stage": "route", "label": "hard"},
                    },
                ],
            },
        ],
    }


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "apps.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_llm_stages_read_from_the_registry_with_their_defaults(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, _registry()))
    models, pipelines = registry_catalogue(registry)
    draft, verify, revise = pipelines["draft-verify"].stages
    assert draft == Stage(name="draft", model="small", llm=LlmStage(output_tokens=64))
    # A judge answers one token unless told; a writer 128.
    assert verify.llm == LlmStage(output_tokens=1, choices=(("accept", 0.8), ("reject", 0.2)))
    assert revise.llm == LlmStage(output_tokens=128)
    assert pipelines["draft-verify"].answer == ("revise", "draft")
    assert pipelines["draft-verify"].models() == ()
    assert pipelines["draft-verify"].llm_applications() == ("small", "large")
    assert pipelines["routed"].models() == ("router",)
    check_pipelines(models, pipelines)
    catalogue = load_catalogue(str(tmp_path / "apps.json"), str(tmp_path / "cache"))
    assert catalogue.pipelines["draft-verify"].stages[1].model == "large"


def _stage(data: dict[str, Any], pipeline: int, stage: int) -> dict[str, Any]:
    found: dict[str, Any] = data["pipelines"][pipeline]["stages"][stage]
    return found


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            lambda d: _stage(d, 0, 0).update(model="router"),
            "pipelines[0].stages[0]: give exactly one of 'model'",
            id="both",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 0).pop("llm"),
            "pipelines[0].stages[0]: give exactly one of 'model'",
            id="neither",
        ),
        pytest.param(
            lambda d: _stage(d, 1, 0).update(output_tokens=5),
            "pipelines[1].stages[0].output_tokens: is for LLM stages",
            id="tokens-on-a-model",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 1).update(llm="huge"),
            "pipelines[0].stages[1].llm: unknown LLM application 'huge'; llm_applications: "
            "small, large",
            id="unknown-llm",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 1).update(choices={"accept": 0.8, "reject": 0.3}),
            "pipelines[0].stages[1].choices: the labels' shares sum to 1.1",
            id="shares",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 1).update(choices={"not sure": 1.0}),
            "pipelines[0].stages[1].choices.not sure (key): String should match pattern",
            id="label-with-a-space",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 2).update(when={"stage": "verify", "label": "maybe"}),
            "pipelines[0].stages[2].when: when names label 'maybe', which stage 'verify' never "
            "answers: accept, reject",
            id="unknown-choice",
        ),
        pytest.param(
            lambda d: _stage(d, 0, 0).update(output_tokens=0),
            "pipelines[0].stages[0].output_tokens: Input should be greater than or equal to 1",
            id="zero-tokens",
        ),
        pytest.param(
            lambda d: d["pipelines"][0].update(answer=["revise", "final"]),
            "pipelines[0].answer[1]: unknown stage 'final'; stages: draft, verify, revise",
            id="unknown-answer",
        ),
    ],
)
def test_bad_llm_stages_are_rejected_by_name(tmp_path: Path, change: Any, expected: str) -> None:
    data = copy.deepcopy(_registry())
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(RegistryError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert message.startswith(f"registry {path}: {expected}"), message
    assert "\n" not in message


def test_the_catalogue_refuses_an_llm_stage_it_cannot_serve(tmp_path: Path) -> None:
    too_long = copy.deepcopy(_registry())
    _stage(too_long, 0, 2)["output_tokens"] = 300
    with pytest.raises(ConfigError) as caught:
        load_catalogue(str(_write(tmp_path, too_long)), str(tmp_path / "cache"))
    assert str(caught.value) == (
        "registry apps.json: pipeline 'draft-verify', stage 'revise': output_tokens 300 "
        "exceeds the 256 that LLM application 'large' generates"
    )
    # Without llm_applications the default ones serve: a name outside them is refused.
    defaults = copy.deepcopy(_registry())
    del defaults["llm_applications"]
    with pytest.raises(ConfigError) as caught:
        load_catalogue(str(_write(tmp_path, defaults)), str(tmp_path / "cache"))
    served = ", ".join(sorted(app.name for app in DEFAULT_LLM_APPLICATIONS))
    assert str(caught.value) == (
        "registry apps.json: pipeline 'draft-verify', stage 'draft': unknown LLM "
        f"application 'small'; served: {served}"
    )


def test_the_assistant_catalogue_is_served_and_consistent(tmp_path: Path) -> None:
    catalogue = load_catalogue(None, str(tmp_path), pipeline_catalogue="assistant")
    assert dict(catalogue.pipelines) == dict(ASSISTANT_PIPELINES)
    check_pipelines(ASSISTANT_MODELS, ASSISTANT_PIPELINES)
    assert set(ASSISTANT_PIPELINES["triage"].llm_applications()) <= set(catalogue.llm)


def test_check_pipelines_takes_an_llm_stages_choices_for_its_labels() -> None:
    judge = Stage(
        name="judge", model="small", llm=LlmStage(output_tokens=1, choices=(("yes", 1.0),))
    )
    follow = Stage(name="next", model="small", after=("judge",), llm=LlmStage(output_tokens=4))
    branch = Stage(
        name="branch",
        model="small",
        after=("judge",),
        when=None,
        llm=LlmStage(output_tokens=4, choices=(("a", 0.5), ("b", 0.6))),
    )
    ok = PipelineSpec(name="p", stages=(judge, follow), slo_s=1.0)
    check_pipelines({}, {"p": ok})
    bad = PipelineSpec(name="p", stages=(judge, branch), slo_s=1.0)
    with pytest.raises(InvalidPipelineError, match="LLM stage 'branch': the labels' shares"):
        check_pipelines({}, {"p": bad})
    unknown = PipelineSpec(name="p", stages=(judge,), slo_s=1.0, answer=("final",))
    with pytest.raises(InvalidPipelineError, match="answer names an unknown stage 'final'"):
        check_pipelines({}, {"p": unknown})


def test_an_llm_stage_reads_the_input_and_the_stages_before_it() -> None:
    prompt = stage_prompt("Sort a list.", {"draft": "use sorted()", "verify": "reject"})
    assert prompt == "Sort a list.\n\ndraft: use sorted()\n\nverify: reject"
    app = next(a for a in DEFAULT_LLM_APPLICATIONS if a.name == "llama-2-13b")
    llm = LlmStage(output_tokens=1, choices=(("accept", 0.7), ("reject", 0.3)))
    payload = llm_stage_payload(app, llm, prompt, time_scale=10.0, what="stage 'verify'")
    assert payload.model == "llama-2-13b"
    assert payload.prompt == prompt
    assert payload.prompt_tokens == -(-len(prompt.encode()) // 4)
    assert payload.max_output_tokens == payload.output_tokens_hint == 1
    assert payload.choices == {"accept": 0.7, "reject": 0.3}
    assert payload.ttft_slo_s == pytest.approx(app.objectives.ttft_s / 10.0)
    long_prompt = "word " * 3000
    assert llm_stage_payload(
        app, llm, long_prompt, time_scale=1.0, what="x"
    ).prefix_blocks == prompt_blocks(long_prompt)
    with pytest.raises(ApiError) as caught:
        llm_stage_payload(app, llm, "x" * 40_000, time_scale=1.0, what="stage 'verify' of call c")
    assert caught.value.status == 400
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.message.startswith("stage 'verify' of call c has a prompt of 10000 tokens")
    assert "'llama-2-13b' accepts at most 8192" in caught.value.message


def test_a_model_stage_gets_the_end_of_a_long_llm_output() -> None:
    long = "a" * 10 + "b" * STAGE_INPUT_CHARS
    assert stage_inputs({"draft": long, "short": "ok"}) == {
        "draft": "b" * STAGE_INPUT_CHARS,
        "short": "ok",
    }


def _completion(result: LLMResult | StageResult) -> Completion:
    return Completion(
        request_id="c.s",
        app="p",
        worker_id="w",
        worker_type="t",
        variant="v",
        status=CompletionStatus.OK,
        result=result,
        timeline=RequestTimeline(arrival_s=0.0),
    )


def test_what_a_stage_hands_on_from_either_kind_of_answer() -> None:
    judged = _completion(LLMResult(output_tokens=1, text="reject", label="reject"))
    written = _completion(LLMResult(output_tokens=3, text="a b c"))
    checked = _completion(StageResult(model="m", output="img", label="safe"))
    assert (stage_output(judged), stage_label(judged)) == ("reject", "reject")
    assert (stage_output(written), stage_label(written)) == ("a b c", None)
    assert (stage_output(checked), stage_label(checked)) == ("img", "safe")
    assert (stage_output(None), stage_label(None)) == ("", None)


def test_a_pipelines_answer_is_the_first_of_its_answer_stages_that_ran() -> None:
    pipeline = ASSISTANT_PIPELINES["draft-verify"]
    accepted = {"draft": "text", "verify": "accept"}
    rejected = {"draft": "text", "verify": "reject", "revise": "better"}
    assert final_outputs(pipeline, accepted) == {"draft": "text"}
    assert final_outputs(pipeline, rejected) == {"revise": "better"}
    # Without an answer: the outputs nothing run after reads.
    plain = PipelineSpec(name="p", stages=pipeline.stages, slo_s=1.0)
    assert final_outputs(plain, accepted) == {"verify": "accept"}


def test_the_multi_model_simulator_refuses_an_llm_stage_without_workers_by_name() -> None:
    with pytest.raises(SimulationInputError) as caught:
        PipelineRun(ASSISTANT_PIPELINES["triage"], ASSISTANT_MODELS, {"llama-2-7b"})
    assert str(caught.value) == (
        "pipeline 'triage': stage 'code' is an LLM stage of LLM application 'llama-2-13b', "
        "which has no LLM workers in this simulation "
        "(research.multimodel.llm_stages.LlmWorkers)"
    )
