"""The fault matrix's replay plan with pipeline calls, and how a pipeline call's answer
is compared when it is retried."""

from __future__ import annotations

from collections import Counter
from typing import Any

from loadgen.harness.fault_run import (
    PIPELINES,
    FaultRunConfig,
    _recorded,
    _served,
    fault_plan,
    stage_ids,
)
from loadgen.replay_records import OK, RequestRecord, read_stages

CONFIG = FaultRunConfig(requests=300, rate_rps=40.0)


def test_a_pipeline_share_turns_that_many_calls_into_pipeline_calls_at_the_same_times() -> None:
    plain = fault_plan(CONFIG)
    mixed = fault_plan(CONFIG, pipeline_share=1 / 3)

    assert [c.arrival_s for c in mixed] == [c.arrival_s for c in plain]
    assert [c.index for c in mixed] == list(range(CONFIG.requests))
    pipelines = [c for c in mixed if c.kind == "pipeline"]
    assert len(pipelines) == 100
    # Every pipeline of the catalogue gets its share, and the calls are spread over
    # the replay rather than bunched at its start.
    by_pipeline = Counter(c.app for c in pipelines)
    assert set(by_pipeline) == set(PIPELINES)
    assert set(by_pipeline.values()) == {34, 33}
    assert min(c.index for c in pipelines) < 30
    assert max(c.index for c in pipelines) > 270
    assert all(c.path == f"/v1/apps/{c.app}/infer" for c in pipelines)
    # The same seed gives the same plan: a row can be rerun.
    assert fault_plan(CONFIG, pipeline_share=1 / 3) == mixed


def test_a_pipeline_calls_stages_are_its_id_and_each_stage_name() -> None:
    call = next(c for c in fault_plan(CONFIG, pipeline_share=1.0) if c.app == "txt2img-hd")
    assert stage_ids(call, "run-7") == [
        "run-7.encode",
        "run-7.generate",
        "run-7.upscale",
        "run-7.check",
    ]
    llm = fault_plan(CONFIG)[0]
    assert stage_ids(llm, "run-0") == []


def _answer(check_worker: str, label: str) -> dict[str, Any]:
    def stage(name: str, worker: str, stage_label: str | None = None) -> dict[str, Any]:
        return {
            "stage": name,
            "model": "m",
            "status": "ok",
            "label": stage_label,
            "worker_id": worker,
            "finished_s": 1.5,
        }

    return {
        "object": "pipeline.result",
        "stages": [stage("encode", "m1"), stage("check", check_worker, label)],
    }


def _record(document: dict[str, Any]) -> RequestRecord:
    return RequestRecord(
        request_id="run-1",
        index=1,
        kind="pipeline",
        app="txt2img",
        workload="pipeline",
        arrival_s=0.0,
        scheduled_s=0.0,
        outcome=OK,
        status_code=200,
        stages=read_stages(document["stages"]),
    )


def test_a_retried_pipeline_call_differs_when_any_stage_ran_elsewhere_or_said_otherwise() -> None:
    first = _answer("m2", "safe")
    recorded = _record(first)

    assert _served(first) == _recorded(recorded)
    assert _served(_answer("m1", "safe")) != _recorded(recorded)
    assert _served(_answer("m2", "unsafe")) != _recorded(recorded)
