"""Conditional pipeline stages: which stages run, the checks at registration, and the
simulator running them (``switchyard.multimodel.branching``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from switchyard.apps import RegistryError, load_registry
from switchyard.apps.pipelines import InvalidPipelineError, check_pipelines
from switchyard.multimodel.branching import label_at, stage_runs, unit_of
from switchyard.multimodel.model import (
    ModelSpec,
    MultiModelRequest,
    PipelineSpec,
    ResourceVector,
    Stage,
    StageCondition,
    Workload,
)

from research.multimodel.simulator import simulate_multimodel
from tests.unit.test_multimodel_sim import FREE, FirstHolder, PlaceEverywhereOnce, worker

SHARES = (("safe", 0.9), ("unsafe", 0.1))
UPSCALE = Stage(name="upscale", model="up", after=("check",), when=StageCondition("check", "safe"))


def _model(name: str, labels: tuple[tuple[str, float], ...] = ()) -> ModelSpec:
    return ModelSpec(
        name=name, resources=ResourceVector(1.0, 0.25, 4.0), load_s=0.0, exec_s=1.0, labels=labels
    )


def test_a_label_is_drawn_by_its_share_and_a_request_id_always_draws_the_same() -> None:
    assert label_at(SHARES, 0.0) == "safe"
    assert label_at(SHARES, 0.8999) == "safe"
    assert label_at(SHARES, 0.9) == "unsafe"
    assert label_at(SHARES, 0.9999999) == "unsafe"
    assert label_at((), 0.5) is None
    assert unit_of("call-1.check") == unit_of("call-1.check")
    draws = [label_at(SHARES, unit_of(f"call-{i}.check")) for i in range(2000)]
    assert 0.07 < draws.count("unsafe") / len(draws) < 0.13


def test_a_stage_runs_on_its_label_and_is_skipped_when_everything_before_it_was() -> None:
    assert stage_runs(UPSCALE, {"check": "safe"}, set())
    assert not stage_runs(UPSCALE, {"check": "unsafe"}, set())
    after_skipped = Stage(name="notify", model="n", after=("upscale",))
    assert not stage_runs(after_skipped, {"check": "unsafe"}, {"upscale"})
    # One earlier stage run is enough: it runs on what that one produced.
    join = Stage(name="join", model="j", after=("upscale", "check"))
    assert stage_runs(join, {"check": "unsafe"}, {"upscale"})
    assert stage_runs(Stage(name="first", model="f"), {}, set())


def _pipeline(*stages: Stage) -> dict[str, PipelineSpec]:
    return {"p": PipelineSpec(name="p", stages=stages, slo_s=10.0)}


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (
            (
                Stage(name="check", model="checker"),
                Stage(name="upscale", model="up", when=StageCondition("check", "safe")),
            ),
            "when names stage 'check', which stage 'upscale' does not run after",
        ),
        (
            (
                Stage(name="check", model="checker"),
                Stage(
                    name="upscale",
                    model="up",
                    after=("check",),
                    when=StageCondition("check", "blurry"),
                ),
            ),
            "when names label 'blurry', which stage 'check' never answers: safe, unsafe",
        ),
        (
            (
                Stage(name="check", model="up"),
                Stage(
                    name="upscale", model="up", after=("check",), when=StageCondition("check", "x")
                ),
            ),
            "none (its model has no labels)",
        ),
    ],
)
def test_a_condition_that_cannot_hold_is_refused_naming_the_stage(
    stages: tuple[Stage, ...], message: str
) -> None:
    models = {"checker": _model("checker", SHARES), "up": _model("up")}
    with pytest.raises(InvalidPipelineError, match="stage 'upscale'") as caught:
        check_pipelines(models, _pipeline(*stages))
    assert message in str(caught.value)


def test_label_shares_that_do_not_sum_to_one_are_refused() -> None:
    models = {"checker": _model("checker", (("safe", 0.5), ("unsafe", 0.2)))}
    with pytest.raises(InvalidPipelineError, match=r"model 'checker': .* sum to 0.7, not 1"):
        check_pipelines(models, _pipeline(Stage(name="check", model="checker")))


def test_the_registry_takes_labels_and_conditions_and_names_a_bad_one(tmp_path: Path) -> None:
    document = {
        "models": {
            "checker": {
                "resources": {"cpu": 1, "gpu": 0.25, "mem_gib": 4},
                "load_s": 1,
                "exec_s": 0.1,
                "labels": {"safe": 0.9, "unsafe": 0.1},
            },
            "up": {"resources": {"cpu": 1, "gpu": 0.25, "mem_gib": 4}, "load_s": 1, "exec_s": 1},
        },
        "pipelines": [
            {
                "name": "checked",
                "slo_s": 10,
                "stages": [
                    {"name": "check", "model": "checker"},
                    {
                        "name": "upscale",
                        "model": "up",
                        "after": ["check"],
                        "when": {"stage": "check", "label": "safe"},
                    },
                ],
            }
        ],
    }
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(document))
    registry = load_registry(path)
    assert registry.pipelines[0].stages[1].to_stage().when == StageCondition("check", "safe")
    document["pipelines"][0]["stages"][1]["when"]["label"] = "nsfw"  # type: ignore[index]
    path.write_text(json.dumps(document))
    with pytest.raises(RegistryError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert "pipelines[0].stages[1].when" in message, message
    assert "label 'nsfw', which stage 'check' never answers: safe, unsafe" in message
    assert "\n" not in message


def test_the_simulator_runs_a_conditional_stage_for_its_label_s_share_of_requests() -> None:
    models = {"checker": _model("checker", SHARES), "up": _model("up")}
    pipeline = PipelineSpec(
        name="checked", stages=(Stage(name="check", model="checker"), UPSCALE), slo_s=10.0
    )
    requests = tuple(
        MultiModelRequest(request_id=f"r{i}", arrival_s=float(i) * 3.0, pipeline="checked")
        for i in range(400)
    )
    workload = Workload(
        name="checked", models=models, pipelines={"checked": pipeline}, requests=requests
    )
    result = simulate_multimodel(
        workload, (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE
    )
    assert all(result.finished)
    upscaled = result.stages_run - len(requests)
    assert 0.85 < upscaled / len(requests) < 0.95
    # A request that skips the upscale ends with its check (1 s), one that runs it at 2 s.
    assert sorted(set(round(x, 6) for x in result.latencies_s)) == [1.0, 2.0]
    again = simulate_multimodel(
        workload, (worker("w0"),), PlaceEverywhereOnce(), FirstHolder(), FREE
    )
    assert again.latencies_s == result.latencies_s
